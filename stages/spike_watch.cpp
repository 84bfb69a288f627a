// See spike_watch.h.
#include "stages/spike_watch.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace pipeline::stages {

namespace {

std::string floats_json(const std::vector<float>& v) {
  std::string out = "[";
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.9g", i ? "," : "", static_cast<double>(v[i]));  // 9 digits: float32 exactly
    out += buf;
  }
  return out + "]";
}

int64_t count_member(const JsonValue& g, const char* key, const std::string& source) {
  const JsonValue* m = g.find(key);
  if (!m) return 0;
  if (m->type != JsonValue::Type::number || m->text.empty() || m->text.find_first_not_of("0123456789") != std::string::npos ||
      m->text.size() > 18)
    throw std::runtime_error(source + ": checkpoint metadata \"guard\": \"" + key + "\" must be a non-negative integer, got " +
                             (m->text.empty() ? JsonValue::type_name(m->type) : m->text));
  return std::stoll(m->text);
}

std::vector<float> floats_member(const JsonValue& g, const char* key, const std::string& source) {
  std::vector<float> out;
  for (const auto& x : g.array(key)) {
    if (x.type != JsonValue::Type::number)
      throw std::runtime_error(source + ": checkpoint metadata \"guard\": \"" + key + "\" must hold numbers, got " +
                               JsonValue::type_name(x.type));
    out.push_back(std::strtof(x.text.c_str(), nullptr));
  }
  return out;
}

}  // namespace

std::string range_text(const StepRange& r) {
  return r.first == r.last ? std::to_string(r.first) : std::to_string(r.first) + "-" + std::to_string(r.last);
}

std::string GuardRecord::to_json() const {
  const auto& d = detector;
  std::string out = "{\"updates\":" + std::to_string(d.updates) + ",\"count\":" + std::to_string(d.count) +
                    ",\"streak\":" + std::to_string(d.streak) + ",\"streak_first\":" + std::to_string(streak_first) +
                    ",\"skips\":" + std::to_string(d.skips) + ",\"rollbacks\":" + std::to_string(rollbacks) +
                    ",\"rolled_back\":[";
  for (size_t i = 0; i < rolled_back.size(); ++i)
    out += (i ? ",[" : "[") + std::to_string(rolled_back[i].first) + "," + std::to_string(rolled_back[i].last) + "]";
  return out + "],\"loss\":" + floats_json(d.loss) + ",\"norm\":" + floats_json(d.norm) + "}";
}

GuardRecord GuardRecord::from_metadata(const JsonValue& meta, int64_t step, const std::string& source) {
  GuardRecord r;
  r.detector.updates = step;
  const JsonValue* g = meta.find("guard");
  if (!g) return r;
  if (g->type != JsonValue::Type::object)
    throw std::runtime_error(source + ": checkpoint metadata \"guard\" must be an object, got " + JsonValue::type_name(g->type));
  auto& d = r.detector;
  d.updates = count_member(*g, "updates", source);
  d.count = count_member(*g, "count", source);
  d.streak = count_member(*g, "streak", source);
  d.skips = count_member(*g, "skips", source);
  r.streak_first = count_member(*g, "streak_first", source);
  r.rollbacks = count_member(*g, "rollbacks", source);
  for (const auto& pair : g->array("rolled_back")) {
    if (pair.type != JsonValue::Type::array || pair.items.size() != 2)
      throw std::runtime_error(source + ": checkpoint metadata \"guard\": \"rolled_back\" must hold [first, last] pairs");
    JsonValue holder;  // count_member reads members: give the pair's numbers names
    holder.type = JsonValue::Type::object;
    holder.members = {{"first", pair.items[0]}, {"last", pair.items[1]}};
    r.rolled_back.push_back({count_member(holder, "first", source), count_member(holder, "last", source)});
  }
  d.loss = floats_member(*g, "loss", source);
  d.norm = floats_member(*g, "norm", source);
  if (d.loss.size() != d.norm.size() || static_cast<int64_t>(d.loss.size()) > d.count || d.updates > step)
    throw std::runtime_error(source + ": checkpoint metadata \"guard\" does not add up: " + std::to_string(d.loss.size()) +
                             " losses, " + std::to_string(d.norm.size()) + " norms, count " + std::to_string(d.count) +
                             ", " + std::to_string(d.updates) + " updates by step " + std::to_string(step));
  return r;
}

SpikeWatch::SpikeWatch(GuardSection options, GuardRecord start) : options_(std::move(options)), record_(std::move(start)) {}

void SpikeWatch::issued(int64_t step, torch::Tensor host, std::shared_ptr<model::DeviceEvent> done) {
  pending_.push_back({step, std::move(host), std::move(done)});
}

std::chrono::nanoseconds SpikeWatch::read(size_t leave) {
  std::chrono::nanoseconds waited{0};
  while (pending_.size() > leave) {
    Pending& p = pending_.front();
    if (p.done) waited += p.done->wait();  // done already where the rules say it is: no wait then
    const auto v = model::SpikeVerdict::from(p.host);
    auto& d = record_.detector;
    // The device's state after the step, mirrored: what a checkpoint of it records.
    d.updates = v.updates;
    d.streak = v.streak;
    d.skips = v.skips;
    if (!v.skipped) d.accept(v.loss, v.norm, options_.window);
    else if (v.streak == 1) record_.streak_first = p.step;
    if (!trip_ && v.streak >= options_.max_skips) trip_ = Trip{record_.streak_first, p.step, v};
    pending_.pop_front();
  }
  return waited;
}

bool SpikeWatch::skips_data(int64_t step) const {
  auto holds = [step](const StepRange& r) { return r.contains(step); };
  return std::any_of(options_.skip_steps.begin(), options_.skip_steps.end(), holds) ||
         std::any_of(record_.rolled_back.begin(), record_.rolled_back.end(), holds);
}

StepRange SpikeWatch::skipped_range(int64_t step) const {
  StepRange out{step, step};
  // The union of the ranges around `step` (skip_steps and rollbacks may overlap or touch).
  for (bool grew = true; grew;) {
    grew = false;
    auto widen = [&](const StepRange& r) {
      if (r.last + 1 < out.first || r.first > out.last + 1) return;
      if (r.first < out.first || r.last > out.last) grew = true;
      out.first = std::min(out.first, r.first);
      out.last = std::max(out.last, r.last);
    };
    for (const auto& r : options_.skip_steps) widen(r);
    for (const auto& r : record_.rolled_back) widen(r);
  }
  return out;
}

bool SpikeWatch::abandoned(int64_t step) const {
  return std::any_of(record_.rolled_back.begin(), record_.rolled_back.end(),
                     [step](const StepRange& r) { return r.contains(step); });
}

StepRange SpikeWatch::rolled_back(int64_t target, GuardRecord restored, int64_t consumed) {
  const StepRange range{target + 1, std::max(consumed, target + options_.rollback_skip)};
  restored.rollbacks = record_.rollbacks + 1;
  restored.rolled_back = record_.rolled_back;
  restored.rolled_back.push_back(range);
  restored.detector.skips = record_.detector.skips;  // events stay counted
  record_ = std::move(restored);
  trip_.reset();
  pending_.clear();  // verdicts of steps the rollback undid
  return range;
}

}  // namespace pipeline::stages
