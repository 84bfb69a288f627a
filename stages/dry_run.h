// What the training stages open and check as they are built, without LibTorch: the functions
// their constructors call, and the dry run of each type that `pipeline check` makes
// (graph::StageType::dry_run, declared in catalog.cpp) so that a config it calls valid is one
// that `pipeline run` builds. The dry run opens what the stage would open (its dataset, in the
// data order the run reads it in, its validation split, HellaSwag's items) and checks what it
// would check; the device and the ranks are decided when a run starts, and what depends on them
// is checked then.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/config.h"
#include "datasets/eval/hellaswag.h"
#include "datasets/sources/open_source.h"
#include "graph/stage.h"
#include "model/net/gpt_config.h"
#include "stages/settings.h"

namespace pipeline::stages {

/// The source a read stage named `stage` reads (read_tokens: `tokens`): its options' dataset (else
/// [data] dataset), split (else [data] train_split), shuffle, mix and column (read_shards) or
/// llm.c's unit size (read_tokens), and the run's seed and [data] loop. The caller sets the order
/// (the lanes order's K), and in the documents order the start position and this rank's partition
/// (a fresh run on one process: the beginning, and all of it).
datasets::SourceRequest source_request(const RunConfig& cfg, const config::Section& options, const std::string& stage,
                                       bool tokens);

/// Opens it (datasets::open_source), in either order. Data of the other kind (token ids for
/// read_shards, text for read_tokens) is an error that says which stage reads it.
datasets::OpenedSource open_stage_source(const datasets::SourceRequest& r, const std::string& stage);

/// [stages.NAME] (record_batches) options that the run's order cannot record: last_target in the
/// lanes order.
void check_recording(const RunConfig& cfg, const config::Section& options, const std::string& stage);

/// Eval's fixed validation set: the first `batches`·B·T+1 tokens (eval: [eval] batches) of the
/// validation split of the eval stage's own `dataset` or [data] dataset (a held-out Parquet
/// source: its first documents), as training sees them. Throws naming the source when there is no
/// such split, it is empty, or it holds less than one batch (which one batch's tokens show: the
/// dry run reads no more).
std::vector<uint16_t> validation_tokens(const RunConfig& cfg, const config::Section& options, const std::string& stage,
                                        int64_t batches);

/// [eval] hellaswag's items, read and checked against the model's context (empty without it).
datasets::HellaSwagSet evaluation_items(const RunConfig& cfg, const model::GPTConfig& model);

/// Training settings that cannot run together. `cuda`: whether the run trains on CUDA (nullopt:
/// not decided yet, as with [run] device = "auto" before a run starts); `ranks`: data parallel.
void check_training(const RunConfig& cfg, const model::GPTConfig& model, std::optional<bool> cuda, bool ranks);

/// What a dry run knows of its run: StageContext::host holds a std::shared_ptr<const RunPreview>.
struct RunPreview {
  RunConfig cfg;    // cfg.data.order: a resume's, from its checkpoint
  model::GPTConfig model;
  bool resumes = false;  // from a checkpoint (whose weights train loads instead of [model] init_from's)
  uint32_t lanes = 0;    // the lanes order's K, settled as run settles it (runner/lane_setup.h); 0: documents
};

/// The dry runs the catalog declares: a read stage opens its source in the run's order, eval its
/// validation set and items, record_batches checks what it records, train checks its settings
/// and opens [model] init_from's weight files.
void dry_run_read_shards(const graph::StageContext& ctx);
void dry_run_read_tokens(const graph::StageContext& ctx);
void dry_run_record_batches(const graph::StageContext& ctx);
void dry_run_eval(const graph::StageContext& ctx);
void dry_run_train(const graph::StageContext& ctx);

}  // namespace pipeline::stages
