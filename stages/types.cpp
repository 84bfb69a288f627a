// Shared pieces of the training stages: cursor serialization, event waits, the run log and
// the run context (see types.h).
#include "stages/types.h"

#include <algorithm>
#include <any>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <stdexcept>

#include "stages/ranks.h"

namespace pipeline::stages {

namespace {

std::string position_json(const datasets::DatasetPosition& p) {
  return "{\"shard\":" + std::to_string(p.shard) + ",\"item\":" + std::to_string(p.item) +
         ",\"epoch\":" + std::to_string(p.epoch) + "}";
}

uint64_t cursor_number(const JsonValue& v, const char* key) {
  auto m = v.find(key);
  if (!m || m->type != JsonValue::Type::number || m->text.find_first_not_of("0123456789") != std::string::npos)
    throw std::runtime_error(std::string("data cursor: expected a non-negative integer for \"") + key + "\"");
  return std::stoull(m->text);
}

datasets::DatasetPosition position_from_json(const JsonValue& v) {
  datasets::DatasetPosition p;
  p.shard = static_cast<uint32_t>(cursor_number(v, "shard"));
  p.item = cursor_number(v, "item");
  p.epoch = cursor_number(v, "epoch");
  return p;
}

// {"epoch":E,"shard":S,"item":I,"doc":ordinal,"token":T}
std::string frontier_json(const datasets::Frontier& f) {
  return "{\"epoch\":" + std::to_string(f.doc.epoch) + ",\"shard\":" + std::to_string(f.doc.shard) +
         ",\"item\":" + std::to_string(f.doc.item) + ",\"doc\":" + std::to_string(f.doc.ordinal) +
         ",\"token\":" + std::to_string(f.token) + "}";
}

datasets::Frontier frontier_from_json(const JsonValue& v) {
  if (v.type != JsonValue::Type::object) throw std::runtime_error("data cursor: \"next\": expected an object");
  datasets::Frontier f;
  const uint64_t shard = cursor_number(v, "shard");
  if (shard > UINT32_MAX) throw std::runtime_error("data cursor: \"shard\" " + std::to_string(shard) + " is too large");
  f.doc = {cursor_number(v, "epoch"), static_cast<uint32_t>(shard), cursor_number(v, "item"), cursor_number(v, "doc")};
  f.token = cursor_number(v, "token");
  return f;
}

// [{"world":N,"by_shard":B,"next":[frontier per rank]}, ...]
std::string progress_json(const datasets::DataProgress& p) {
  std::string out = "[";
  for (size_t l = 0; l < p.layers.size(); ++l) {
    const auto& layer = p.layers[l];
    out += std::string(l ? "," : "") + "{\"world\":" + std::to_string(layer.world) +
           ",\"by_shard\":" + (layer.by_shard ? "true" : "false") + ",\"next\":[";
    for (size_t r = 0; r < layer.next.size(); ++r) out += (r ? "," : "") + frontier_json(layer.next[r]);
    out += "]}";
  }
  return out + "]";
}

datasets::DataProgress progress_from_json(const JsonValue& v) {
  if (v.type != JsonValue::Type::array) throw std::runtime_error("data cursor: \"earlier\": expected an array");
  datasets::DataProgress p;
  for (const auto& l : v.items) {
    datasets::ProgressLayer layer;
    const uint64_t world = cursor_number(l, "world");
    if (world < 1 || world > UINT32_MAX) throw std::runtime_error("data cursor: \"world\" " + std::to_string(world));
    layer.world = static_cast<uint32_t>(world);
    layer.by_shard = l.flag("by_shard");
    for (const auto& f : l.array("next")) layer.next.push_back(frontier_from_json(f));
    if (layer.next.size() != layer.world)
      throw std::runtime_error("data cursor: a layer of " + std::to_string(world) + " ranks holds " +
                               std::to_string(layer.next.size()) + " positions in \"next\"");
    p.layers.push_back(std::move(layer));
  }
  return p;
}

}  // namespace

std::string SourcePosition::str() const {
  if (!mixed) return pos.str();
  std::string out = "mix: " + std::to_string(mix.draws) + " documents drawn;";
  for (size_t i = 0; i < mix.sources.size(); ++i) out += " [" + std::to_string(i) + "] " + mix.sources[i].str();
  return out;
}

std::string DataCursor::to_json(bool with_done) const {
  if (lane_order) {
    std::string out = "{\"lanes\":[";
    for (size_t i = 0; i < lanes.size(); ++i) out += (i ? "," : "") + json_quote(lanes[i].str());
    return out + "]}";
  }
  std::string out = position_json(pos.pos);
  out.pop_back();
  if (pos.mixed) {
    out += ",\"mix\":{\"draws\":" + std::to_string(pos.mix.draws) + ",\"sources\":[";
    for (size_t i = 0; i < pos.mix.sources.size(); ++i) out += (i ? "," : "") + position_json(pos.mix.sources[i]);
    out += "]}";
  }
  out += ",\"skip\":" + std::to_string(skip);
  if (has_next) out += ",\"next\":" + frontier_json(next) + (by_shard ? ",\"by_shard\":true" : "");
  if (with_done && done && !done->layers.empty()) out += ",\"earlier\":" + progress_json(*done);
  return out + "}";
}

DataCursor DataCursor::from_json(const JsonValue& v) {
  if (v.type != JsonValue::Type::object) throw std::runtime_error("data cursor: expected an object");
  DataCursor c;
  if (const JsonValue* lanes = v.find("lanes")) {  // the lanes order
    if (lanes->type != JsonValue::Type::array)
      throw std::runtime_error("data cursor: \"lanes\" (byte offset " + std::to_string(lanes->offset) +
                               "): expected an array of lane cursors");
    c.lane_order = true;
    for (const auto& l : lanes->items) {
      if (l.type != JsonValue::Type::string)
        throw std::runtime_error("data cursor: \"lanes\" (byte offset " + std::to_string(l.offset) +
                                 "): expected a lane cursor as a string, \"lane=L draws=D tokens=T units=N items=I\"");
      c.lanes.push_back(datasets::LaneCursor::parse(l.text));  // DatasetError naming the key
    }
    return c;
  }
  c.pos.pos = position_from_json(v);
  c.skip = cursor_number(v, "skip");
  if (auto m = v.find("mix")) {
    datasets::MixPosition mp;
    mp.draws = cursor_number(*m, "draws");
    for (const auto& s : m->array("sources")) mp.sources.push_back(position_from_json(s));
    c.pos.mixed = true;
    c.pos.mix = std::move(mp);
  }
  if (auto n = v.find("next")) {
    c.has_next = true;
    c.next = frontier_from_json(*n);
    c.by_shard = v.flag("by_shard");
  }
  if (auto e = v.find("earlier")) c.done = std::make_shared<const datasets::DataProgress>(progress_from_json(*e));
  return c;
}

std::chrono::nanoseconds wait_ready(const StepResult& r) {
  std::chrono::nanoseconds waited = r.done ? r.done->wait() : std::chrono::nanoseconds(0);
  for (const auto& work : {r.reduced, r.windows_reduced}) {  // data parallel: the all-reduces of the step's figures
    if (!work) continue;
    const auto t0 = std::chrono::steady_clock::now();
    work->wait();
    waited += std::chrono::steady_clock::now() - t0;
  }
  return waited;
}

uint64_t step_windows(const StepResult& r) {
  if (!r.windows_parts.defined()) return r.windows;
  // Each half summed as int64 over at most 2^31 ranks cannot overflow; recombined mod 2^64.
  const auto* p = r.windows_parts.data_ptr<int64_t>();
  return static_cast<uint64_t>(p[0]) + (static_cast<uint64_t>(p[1]) << 32);
}

std::string windows_hex(uint64_t windows) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(windows));
  return buf;
}

std::pair<torch::Tensor, torch::Tensor> batch_inputs(const torch::Tensor& rows, int64_t B, int64_t T) {
  TORCH_CHECK(rows.dim() == 2 && rows.size(0) == B && rows.size(1) == T + 1, "batch: expected (B, T+1) = (", B, ", ",
              T + 1, ") rows, got ", rows.sizes());
  auto ids = rows.to(torch::kInt64);  // (B, T+1)
  // Contiguous, as the model's input and the loss's targets were when they were views of one window.
  return {ids.narrow(1, 0, T).contiguous(), ids.narrow(1, 1, T).contiguous()};  // (B, T) each
}

std::vector<std::pair<std::string, double>> StepTiming::phase_ms() const {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& s : spans) {
    const double ms = s.start ? s.start->elapsed_ms(*s.end) : s.host_ms;
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == s.phase; });
    if (it == out.end())
      out.emplace_back(s.phase, ms);
    else
      it->second += ms;
  }
  return out;
}

double StepTiming::total_ms() const {
  double total = 0;
  for (const auto& [phase, ms] : phase_ms()) total += ms;
  return total;
}

RunLog::RunLog(std::filesystem::path run_dir, bool print) : dir_(std::move(run_dir)), print_(print) {
  if (!dir_.empty()) {
    auto path = dir_ / "metrics.jsonl";
    metrics_ = std::fopen(path.c_str(), "a");
    if (!metrics_) throw std::runtime_error(path.string() + ": cannot open for appending");
    path = dir_ / "run.log";
    run_log_ = std::fopen(path.c_str(), "a");
    if (!run_log_) throw std::runtime_error(path.string() + ": cannot open for appending");
  }
}

RunLog::~RunLog() {
  if (metrics_) std::fclose(metrics_);
  if (run_log_) std::fclose(run_log_);
}

std::filesystem::path RunLog::file() const { return dir_.empty() ? dir_ : dir_ / "run.log"; }

void RunLog::append_locked(const std::string& line) {
  if (!run_log_) return;
  std::fputs(line.c_str(), run_log_);
  std::fputc('\n', run_log_);
  std::fflush(run_log_);
}

void RunLog::write_stream_locked(int stream, const std::string& line) {
  if (!stream_ok_[stream]) return;
  std::FILE* f = stream == 1 ? stdout : stderr;
  errno = 0;
  // stdio, not iostreams: the failure and its errno come back (std::cout shares stdout's buffer).
  const bool ok = std::fwrite(line.data(), 1, line.size(), f) == line.size() && std::fputc('\n', f) != EOF &&
                  std::fflush(f) == 0;
  if (!ok) output_lost_locked(stream, errno);
}

void RunLog::output_lost_locked(int stream, int err) {
  if (stream != 1 && stream != 2) return;
  if (!stream_ok_[stream]) return;
  stream_ok_[stream] = false;
  std::clearerr(stream == 1 ? stdout : stderr);
  const std::string what = stream == 1 ? "standard output" : "standard error";
  const std::string why = err ? std::string(std::strerror(err)) : std::string("write failed");
  std::string note = "pipeline run: " + what + " is gone (" + why + "): printing to it stopped; the run goes on";
  if (run_log_) note += ", and " + (dir_ / "run.log").string() + " keeps every line";
  append_locked(note);
  const int other = stream == 1 ? 2 : 1;
  if (print_ && stream_ok_[other]) write_stream_locked(other, note);
}

void RunLog::output_lost(int stream, int err) {
  std::lock_guard<std::mutex> lock(mu_);
  output_lost_locked(stream, err);
}

bool RunLog::stream_ok(int stream) const {
  std::lock_guard<std::mutex> lock(mu_);
  return stream >= 1 && stream <= 2 && stream_ok_[stream];
}

void RunLog::print(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  append_locked(line);
  if (!print_) return;
  if (printer_)
    printer_(line);
  else
    write_stream_locked(1, line);
}

void RunLog::error(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  append_locked(line);
  if (print_) write_stream_locked(2, line);
}

void RunLog::metric(const std::string& json) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!metrics_) return;
  std::fputs(json.c_str(), metrics_);
  std::fputc('\n', metrics_);
  std::fflush(metrics_);
  for (const auto& [id, listener] : listeners_) listener(json);
}

int RunLog::add_metric_listener(std::function<void(const std::string&)> l) {
  std::lock_guard<std::mutex> lock(mu_);
  listeners_.emplace_back(++next_listener_, std::move(l));
  return next_listener_;
}

void RunLog::remove_metric_listener(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(listeners_, [id](const auto& x) { return x.first == id; });
}

void RunLog::set_printer(std::function<void(const std::string&)> p) {
  std::lock_guard<std::mutex> lock(mu_);
  printer_ = std::move(p);
}

bool RunContext::writer() const { return !ranks || ranks->writer(); }

datasets::Partition data_partition(const RunContext& rc) {
  datasets::Partition p = rc.partition;
  p.done = rc.start.done;
  return p;
}

datasets::DatasetReaderOptions reader_options(const RunContext& rc) {
  datasets::DatasetReaderOptions o;
  o.partition = data_partition(rc);
  return o;
}

RunContext& run_context(const graph::StageContext& ctx) {
  const auto* rc = std::any_cast<std::shared_ptr<RunContext>>(&ctx.host);
  if (!rc || !*rc)
    throw std::runtime_error("stage '" + ctx.name +
                             "' is a training stage: it runs inside `pipeline run`, which provides the model, "
                             "data and run directory");
  return **rc;  // the engine holds the context for as long as its stages live
}

}  // namespace pipeline::stages
