// See dry_run.h.
#include "stages/dry_run.h"

#include <algorithm>
#include <memory>
#include <stdexcept>

#include "datasets/dataset_error.h"
#include "datasets/io/store.h"
#include "datasets/io/url.h"
#include "datasets/sources/dataset_manifest.h"
#include "datasets/sources/split_tokens.h"
#include "model/hf/hf_config.h"

namespace pipeline::stages {

namespace {

// A source a stage names (its dataset, a mix entry), found as [data] dataset is: a remote source's
// URL as written, a path by config::resolve_data_path (the working directory, the config's, the
// source tree).
std::filesystem::path resolve_source(const std::string& text, const RunConfig& cfg) {
  return datasets::io::is_remote_source(text) ? std::filesystem::path(text)
                                              : config::resolve_data_path(text, cfg.file, cfg.source_dir);
}

// A mix entry, "SOURCE=WEIGHT".
datasets::MixSource parse_mix_entry(const std::string& entry, const RunConfig& cfg, const std::string& stage) {
  const auto [source, weight] = datasets::split_mix_entry(entry, "[stages." + stage + "] mix");
  datasets::MixSource src;
  src.weight = weight;
  src.dir = resolve_source(source, cfg);
  return src;
}

const RunPreview& run_preview(const graph::StageContext& ctx) {
  const auto* p = std::any_cast<std::shared_ptr<const RunPreview>>(&ctx.host);
  if (!p || !*p) throw std::logic_error("stage '" + ctx.name + "': a dry run without the run's settings");
  return **p;
}

}  // namespace

datasets::SourceRequest source_request(const RunConfig& cfg, const config::Section& options, const std::string& stage,
                                       bool tokens) {
  datasets::SourceRequest r;
  const auto& dir = options.get_string("dataset");
  const auto& split = options.get_string("split");
  r.dataset = dir.empty() ? cfg.data.dataset : resolve_source(dir, cfg);
  r.split = split.empty() ? cfg.data.train_split : split;
  r.tokens = tokens;
  r.seed = static_cast<uint64_t>(cfg.run.seed);
  r.loop = cfg.data.loop;
  r.shuffle = options.get_bool("shuffle");
  if (tokens) {
    r.llmc_unit_tokens = static_cast<uint64_t>(options.get_int("llmc_unit_tokens"));
    return r;
  }
  r.column = options.get_string("column");
  for (const auto& e : options.get_string_list("mix")) r.mix.push_back(parse_mix_entry(e, cfg, stage));
  return r;
}

datasets::OpenedSource open_stage_source(const datasets::SourceRequest& r, const std::string& stage) {
  if (r.mix.empty() && !datasets::io::is_remote_source(r.dataset.string()) && !datasets::is_parquet_source(r.dataset)) {
    // The other kind of prepared dataset: say which stage reads it, before its reader refuses it.
    const auto kind = datasets::load_dataset_manifest(r.dataset).kind;
    if (r.tokens && kind == datasets::ShardKind::text)
      throw datasets::DatasetError(r.dataset.string() + " holds text, and [stages." + stage +
                                   "] (read_tokens) reads token ids: read it with read_shards and tokenize, or "
                                   "prepare it with `pipeline prepare --tokens`");
    if (!r.tokens && kind == datasets::ShardKind::tokens)
      throw datasets::DatasetError(r.dataset.string() + " holds token ids (prepared with --tokens), and [stages." +
                                   stage + "] (read_shards) reads text: read it with read_tokens, which replaces "
                                   "read_shards and tokenize (--set stages." + stage +
                                   ".type=read_tokens, then remove tokenize with --set stages.tokenize= and feed "
                                   "pack from " + stage + ")");
  }
  datasets::OpenedSource s = datasets::open_source(r);
  // The lanes order knows what its sources hold once it has catalogued them (llm.c, Parquet).
  if (s.order && (s.order->content == datasets::UnitContent::tokens) != r.tokens) {
    const bool text = !r.tokens;
    throw std::invalid_argument("[stages." + stage + "]: " + s.order->sources.front().catalog->source + " holds " +
                                (text ? "tokens" : "text") + ", and this stage reads " + (text ? "text" : "tokens") +
                                (text ? " (tokens are read by a read_tokens stage, without tokenize)"
                                      : " (text is read by read_shards, then tokenize)"));
  }
  return s;
}

void check_recording(const RunConfig& cfg, const config::Section& options, const std::string& stage) {
  if (options.get_bool("last_target") && cfg.data.order != "documents")
    throw std::invalid_argument("[stages." + stage + "] last_target = true records a token stream, which only [data] "
                                "order = \"documents\" trains on (its rows are cut from one window); this run's order "
                                "is \"" + cfg.data.order + "\"");
}

std::vector<uint16_t> validation_tokens(const RunConfig& cfg, const config::Section& options, const std::string& stage,
                                        int64_t batches, const datasets::io::StoreOptions& store) {
  static constexpr const char* kTooSmall =
      ": prepare it with a larger --val-fraction, or turn evaluation off with [eval] every = 0";
  const std::string& own = options.get_string("dataset");
  const std::filesystem::path source = own.empty() ? cfg.data.dataset : resolve_source(own, cfg);
  const std::string shown = datasets::io::redact_urls(source.string());
  const int64_t B = cfg.training.batch_size, T = cfg.training.seq_len;
  const auto parquet_needs_own = [&] {
    return std::runtime_error(shown + ": Parquet has no validation split: set [stages." + stage +
                              "] dataset (a held-out Parquet file or directory, or a prepared dataset) or turn "
                              "evaluation off with [eval] every = 0");
  };
  // A local source's manifest is checked first; a remote source's catalogue checks the split as it
  // opens (a missing split is an error naming the source and split), without a second request.
  if (datasets::io::is_remote_source(source.string())) {
  } else if (datasets::is_parquet_source(source)) {
    if (own.empty()) throw parquet_needs_own();
  } else if (auto manifest = datasets::load_dataset_manifest(source); !manifest.splits.count(cfg.data.val_split)) {
    throw std::runtime_error(source.string() + ": no split '" + cfg.data.val_split +
                             "' for evaluation ([data] val_split)");
  } else if (manifest.items(cfg.data.val_split) == 0 && manifest.documents(cfg.data.val_split) == 0) {
    throw std::runtime_error(source.string() + ": the '" + cfg.data.val_split + "' split holds no data" + kTooSmall);
  }
  datasets::SplitTokens split;
  split.open(source, cfg.data.val_split, store);
  if (split.whole_source() && own.empty()) throw parquet_needs_own();
  std::vector<uint16_t> ids(static_cast<size_t>(batches * B * T + 1));
  ids.resize(split.read(ids));
  if ((static_cast<int64_t>(ids.size()) - 1) / (B * T) < 1)
    throw std::runtime_error(shown + ": the '" + cfg.data.val_split + "' split has " +
                             std::to_string(ids.size()) + " tokens, fewer than one evaluation batch (" +
                             std::to_string(B * T + 1) + ")" + kTooSmall);
  return ids;
}

datasets::HellaSwagSet evaluation_items(const RunConfig& cfg, const model::GPTConfig& model) {
  if (cfg.eval.hellaswag.empty()) return {};
  auto items = datasets::load_hellaswag(cfg.eval.hellaswag, cfg.eval.hellaswag_items);
  datasets::check_hellaswag_fits(items, model.block_size);
  return items;
}

void check_training(const RunConfig& cfg, const model::GPTConfig& model, std::optional<bool> cuda, bool ranks) {
  const auto& t = cfg.training;  // (seq_len against the model's context: resolve_run, naming where each came from)
  if (!t.cuda_graph) return;
  if (cuda == false)
    throw std::invalid_argument("[training] cuda_graph = true needs CUDA, but the run is on the CPU ([run] device = \"" +
                                cfg.run.device + "\"; set cuda_graph = false, or [run] device = \"cuda\" on a machine "
                                "with a GPU)");
  if (ranks)
    throw std::invalid_argument("[training] cuda_graph = true is not supported with several ranks yet (the captured "
                                "step has no gradient all-reduce): set it to false under torchrun");
  if (t.recompute == "block" && model.dropout > 0)
    throw std::invalid_argument("[training] recompute = \"block\" with [model] dropout > 0 cannot run as CUDA graphs (the "
                                "recomputation puts the generators' states back, which a captured graph cannot): set "
                                "cuda_graph = false, recompute = \"mlp\", or dropout = 0");
  if (!cfg.optimizer.fused)
    throw std::invalid_argument("[training] cuda_graph = true needs [optimizer] fused = true (the captured step is "
                                "the fused AdamW)");
}

namespace {

// A read stage's dry run: its source opened in the run's order (a fresh start's position, in the
// documents order: a resumed run's is in its checkpoint's tensors, which check does not read).
// A remote source is not opened: check touches the network only when asked (`check --probe`
// lists each remote source; docs/remote.md).
void open_preview_source(const graph::StageContext& ctx, bool tokens) {
  const auto& run = run_preview(ctx);
  datasets::SourceRequest r = source_request(run.cfg, ctx.options, ctx.name, tokens);
  const auto remote = [](const std::filesystem::path& p) { return datasets::io::is_remote_source(p.string()); };
  if (r.mix.empty() ? remote(r.dataset) : std::any_of(r.mix.begin(), r.mix.end(), [&](const auto& m) { return remote(m.dir); }))
    return;
  r.lanes = run.lanes;
  open_stage_source(r, ctx.name);
}

}  // namespace

void dry_run_read_shards(const graph::StageContext& ctx) { open_preview_source(ctx, false); }

void dry_run_read_tokens(const graph::StageContext& ctx) { open_preview_source(ctx, true); }

void dry_run_record_batches(const graph::StageContext& ctx) {
  check_recording(run_preview(ctx).cfg, ctx.options, ctx.name);
}

void dry_run_eval(const graph::StageContext& ctx) {
  const auto& run = run_preview(ctx);
  const std::string& own = ctx.options.get_string("dataset");
  const bool remote = datasets::io::is_remote_source(own.empty() ? run.cfg.data.dataset.string() : own);
  if (run.cfg.eval.every > 0 && !remote) validation_tokens(run.cfg, ctx.options, ctx.name, 1);  // (remote: --probe)
  evaluation_items(run.cfg, run.model);
}

void dry_run_train(const graph::StageContext& ctx) {
  const auto& run = run_preview(ctx);
  std::optional<bool> cuda;
  if (run.cfg.run.device != "auto") cuda = run.cfg.run.device == "cuda";
  check_training(run.cfg, run.model, cuda, false);
  // init_from's weights: the files there, their headers read (which tensor is which, and its
  // shape, is checked as they are loaded).
  if (!run.resumes && !run.cfg.model.init_from.empty()) model::HfWeightFiles files(run.cfg.model.init_from);
}

}  // namespace pipeline::stages
