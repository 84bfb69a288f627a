// See run_resolve.h.
#include "runner/run_resolve.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <stdexcept>

#include "base/json.h"
#include "model/checkpoint/checkpoint_config.h"
#include "model/hf/hf_config.h"

namespace pipeline::stages {

namespace fs = std::filesystem;

std::vector<config::Section> ResolvedRun::sections() const {
  auto out = cfg.sections;
  for (const auto& s : spec.stages)
    if (s.resolved) out.push_back(*s.resolved);
  return out;
}

std::vector<fs::path> checkpoints_newest_first(const fs::path& run_dir) {
  std::vector<fs::path> out;
  auto dir = run_dir / "checkpoints";
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".ckpt") out.push_back(e.path());  // (a writer's temporaries are .tmp)
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) { return a.filename() > b.filename(); });
  return out;
}

fs::path latest_checkpoint(const fs::path& run_dir) {
  auto all = checkpoints_newest_first(run_dir);
  return all.empty() ? fs::path() : all.front();
}

fs::path checkpoint_file(const fs::path& file_or_run_dir) {
  if (!fs::is_directory(file_or_run_dir)) return file_or_run_dir;
  auto latest = latest_checkpoint(file_or_run_dir);
  if (latest.empty())
    throw std::runtime_error(file_or_run_dir.string() + ": no checkpoint in " + (file_or_run_dir / "checkpoints").string());
  return latest;
}

void check_resumable(const std::string& metadata, const RunConfig& cfg, const model::GPTConfig& want,
                     const std::string& ckpt) {
  const model::GPTConfig held = model::checkpoint_model_config(metadata, ckpt);
  if (held.n_layer != want.n_layer || held.n_head != want.n_head || held.n_embd != want.n_embd ||
      held.block_size != want.block_size || held.vocab_size != want.vocab_size || held.bias != want.bias)
    throw std::runtime_error(ckpt + " holds the model " + held.to_json() + ", and this run's [model] is " +
                             want.to_json() + ": resume it with the [model] it was trained with (its run's config.toml)");
  const JsonValue meta = json_parse(metadata);
  if (const JsonValue* seed = meta.find("seed"); seed && seed->text != std::to_string(cfg.run.seed))
    throw std::runtime_error(ckpt + " was trained with [run] seed = " + seed->text + ", and this run's is " +
                             std::to_string(cfg.run.seed) +
                             ": the data order and the rest follow the seed, so resume it with the same seed");
}

std::optional<NothingToTrain> nothing_to_train(const RunConfig& cfg, int64_t step, const std::string& ckpt,
                                               const fs::path& run_dir) {
  const int64_t steps = cfg.training.steps;
  if (step < steps) return std::nullopt;
  std::string from;  // where [training] steps came from
  for (const auto& sec : cfg.sections)
    if (sec.name() == "training") from = sec.where("steps").str();
  const std::string more = "pipeline run --resume " + run_dir.string() + " --set training.steps=N (N > " +
                           std::to_string(step) + ")";
  if (step == steps)
    return NothingToTrain{false, "nothing to train: the run is complete, " + ckpt + " is at step " +
                                     std::to_string(step) + " of [training] steps = " + std::to_string(steps) +
                                     " (" + from + "). To train on: " + more};
  return NothingToTrain{true, ckpt + " is at step " + std::to_string(step) + ", past [training] steps = " +
                                  std::to_string(steps) + " (" + from +
                                  "): the run cannot stop at a step it has passed, and nothing was trained. To train "
                                  "on from step " + std::to_string(step) + ": " + more};
}

std::runtime_error run_dir_error(const fs::path& dir, const std::string& why, bool default_place) {
  return std::runtime_error(
      "cannot create the run directory " + dir.string() + ": " + why +
      (default_place ? " (it is made under the current directory: choose another with --set run.dir=PATH)" : ""));
}

void check_new_run_dir(const fs::path& dir, bool default_place, bool probe) {
  if (!latest_checkpoint(dir).empty())  // (temporaries a killed writer left do not count)
    throw std::runtime_error(dir.string() + " already holds a run with checkpoints; continue it with --resume " +
                             dir.string() + " (or --resume auto), or choose another [run] dir");
  if (!probe) return;
  fs::path at = fs::absolute(dir);
  std::error_code ec;
  while (!fs::exists(at, ec) && at.has_parent_path() && at != at.parent_path()) at = at.parent_path();
  if (!fs::is_directory(at, ec)) throw run_dir_error(dir, at.string() + " is not a directory", default_place);
  if (::access(at.c_str(), W_OK | X_OK) != 0) throw run_dir_error(dir, std::strerror(errno), default_place);
}

namespace {

const config::Section& run_section(const RunConfig& rc, const std::string& name) {
  for (const auto& s : rc.sections)
    if (s.name() == name) return s;
  throw std::logic_error("run section [" + name + "] was not resolved");
}

// With init_from the shape is the Hugging Face model's: preset and vocab_size are not used, and
// n_layer, n_head and n_embd, when set (non-zero), must agree with it (block_size may be smaller:
// the position table is cropped for a shorter context).
model::GPTConfig init_from_config(const RunConfig& rc) {
  const auto& sec = run_section(rc, "model");
  model::GPTConfig m;
  try {
    m = model::read_hf_config(rc.model.init_from);
  } catch (const std::exception& e) {
    throw sec.error("init_from", e.what());
  }
  const int64_t hf_block = m.block_size;
  auto agree = [&](const char* key, int64_t set, int64_t hf) {
    if (set != 0 && set != hf)
      throw sec.error(key, std::to_string(set) + " disagrees with " + (rc.model.init_from / "config.json").string() +
                               " (" + std::to_string(hf) + "); set it to 0 to take the model's");
  };
  agree("n_layer", rc.model.n_layer, m.n_layer);
  agree("n_head", rc.model.n_head, m.n_head);
  agree("n_embd", rc.model.n_embd, m.n_embd);
  if (rc.model.block_size) {
    if (rc.model.block_size > hf_block)
      throw sec.error("block_size", std::to_string(rc.model.block_size) + " exceeds the n_positions " +
                                        std::to_string(hf_block) + " of " + rc.model.init_from.string());
    m.block_size = rc.model.block_size;
  }
  if (sec.was_set("bias") && !rc.model.bias)
    throw sec.error("bias", "false, but a Hugging Face GPT-2 has biases");
  m.dropout = rc.model.dropout;
  return m;
}

// Where the values of `keys` came from, for an error about them together: each one a --set gave
// ("--set model.n_head=5"), else the file and the line of the first one it sets, else the file.
std::string origin_of(const config::Section& sec, std::initializer_list<const char*> keys, const fs::path& file) {
  std::string sets, line;
  for (const char* k : keys) {
    const config::Location at = sec.where(k);
    if (at.source == "--set")
      sets += (sets.empty() ? "" : ", ") + at.str();
    else if (line.empty() && at.line > 0)
      line = at.str();
  }
  return !sets.empty() ? sets : !line.empty() ? line : file.string();
}

model::GPTConfig model_config(const RunConfig& rc) {
  const auto& sec = run_section(rc, "model");
  model::GPTConfig m;
  if (!rc.model.init_from.empty()) {
    m = init_from_config(rc);
  } else {
    try {
      m = model::GPTConfig::preset(rc.model.preset);
    } catch (const std::exception& e) {
      throw sec.error("preset", e.what());
    }
    if (rc.model.n_layer) m.n_layer = rc.model.n_layer;
    if (rc.model.n_head) m.n_head = rc.model.n_head;
    if (rc.model.n_embd) m.n_embd = rc.model.n_embd;
    if (rc.model.block_size) m.block_size = rc.model.block_size;
    m.with_vocab(rc.model.vocab_size);
    m.dropout = rc.model.dropout;
    m.bias = rc.model.bias;
  }
  try {
    m.validate();
  } catch (const std::exception& e) {
    throw config::ConfigError(origin_of(sec, {"preset", "n_layer", "n_head", "n_embd", "block_size", "vocab_size", "dropout"}, rc.file) +
                              ": [model] " + e.what());
  }
  if (rc.training.seq_len > m.block_size) {
    // The context comes from block_size when it is set, else from the preset (or init_from's model).
    const std::string context = sec.was_set("block_size") ? "[model] block_size, " + sec.where("block_size").str()
                                : !rc.model.init_from.empty() ? "the n_positions of " + rc.model.init_from.string()
                                : sec.was_set("preset") ? "the preset \"" + rc.model.preset + "\"'s, " + sec.where("preset").str()
                                                        : "the default preset \"" + rc.model.preset + "\"'s";
    throw run_section(rc, "training")
        .error("seq_len", std::to_string(rc.training.seq_len) + " exceeds the model's context, block_size " +
                              std::to_string(m.block_size) + " (" + context + ")");
  }
  return m;
}

}  // namespace

ResolvedRun resolve_run(const RunRequest& req) {
  ResolvedRun r;
  std::string cfg = req.config;
  if (cfg.empty()) {
    if (req.resume_auto)
      throw std::invalid_argument("--resume auto needs a CONFIG: its [run] dir is the run directory it continues");
    if (req.resume.empty()) throw std::invalid_argument("no config given");
    cfg = (req.resume / "config.toml").string();  // the resolved config the run started with
  }
  r.config_path = config::find_config(cfg, req.source_dir);
  r.doc = config::Document::load(r.config_path, req.overrides);
  r.cfg = resolve_run_config(r.doc, req.source_dir);
  if (req.resume_auto) {
    // The command line's --resume auto is the run's [run] resume: the settings table says so and
    // where it came from, and the run's config.toml records it.
    r.cfg.run.resume = "auto";
    for (auto& sec : r.cfg.sections)
      if (sec.name() == "run") sec.set("resume", std::string("auto"), config::Location{"--resume auto", 0});
  }
  r.spec = graph::GraphSpec::from_config(r.doc);
  r.doc.check_all_used();
  graph::validate(r.spec);  // the graph's structure: stage types, ports, inputs, cycles
  r.model = model_config(r.cfg);
  return r;
}

}  // namespace pipeline::stages
