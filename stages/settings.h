// The settings a training run's stages read: one typed struct per run section of a pipeline
// TOML (every section other than [stages.*]). The run layer declares their schemas and resolves
// them (runner/run_config.h); the stages only read them, through the run context (types.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "base/config.h"

namespace pipeline::stages {

struct RunSection {
  std::string name = "run";     // run directory name prefix
  std::string dir;              // explicit run directory ("" = runs/<name>-<timestamp>)
  std::string resume = "never";  // never | auto: continue the run in `dir` when it has a checkpoint
  int64_t seed = 1337;
  std::string device = "auto";  // auto | cpu | cuda
  int64_t threads = 0;          // intra-op threads for torch on CPU (0 = torch default)
  bool autotune = false;        // tune every CPU stage's workers and every edge's capacity
  // Data parallel (under torchrun):
  std::string backend = "auto";  // auto | nccl | gloo
  double dist_timeout_s = 600;   // waiting for the other ranks (start-up, store, collectives)
  double dist_heartbeat_s = 60;  // a rank silent this long is reported as gone
  double dist_bucket_mb = 25;    // gradient all-reduce bucket size
  int64_t master_port = 0;       // srun without torchrun: rank 0's store port (0: from the job id)
};

struct ModelSection {
  std::string preset = "gpt2";
  int64_t n_layer = 0, n_head = 0, n_embd = 0, block_size = 0;  // 0 = the preset's value
  int64_t vocab_size = 50257;
  double dropout = 0.0;
  bool bias = true;
  std::filesystem::path init_from;  // a Hugging Face GPT-2 directory to start from ("" = fresh weights)
};

struct DataSection {
  std::filesystem::path dataset;      // a prepared dataset directory (manifest.json inside), llm.c shards,
                                      // Parquet, or a remote source's URL (s3://, https://, hf://) as written
  std::string train_split = "train";
  std::string val_split = "val";
  bool loop = true;                   // wrap around to the next epoch at the end of the data
  // Remote sources (docs/remote.md); keys and tokens never come from the config.
  std::string endpoint;               // S3: an S3-compatible server ("" : the environment's, or AWS)
  std::string region;                 // S3: the bucket's region ("" : the environment's, or us-east-1)
  std::string profile;                // S3: the AWS profile ("" : AWS_PROFILE, or "default")
  bool allow_http = false;            // http:// sources and S3 endpoints
  std::filesystem::path cache_dir;    // "" : the platform's cache directory (datasets/io/cache.h)
  /// lanes: K lanes, each its own units in the seed's order, rank r serving lanes r, r+W, ...: the
  /// same rows every step whatever the number of ranks (docs/data_order.md). documents: rank r
  /// keeps documents d with d % W == r and cuts one window of B*T+1 tokens a micro-batch (the order
  /// of every run before lanes, which their checkpoints keep).
  std::string order = "lanes";
  int64_t lanes = 0;                  // K (0: auto, the datasets layer's rule)
};

/// Data steps FROM..TO (1-based, inclusive, as metrics.jsonl numbers them).
struct StepRange {
  int64_t first = 0, last = 0;
  bool contains(int64_t step) const { return step >= first && step <= last; }
};

/// [training.guard]: the spike guard (model/net/spike_guard.h, stages/spike_watch.h).
struct GuardSection {
  bool enabled = true;
  int64_t window = 100;       // steps let through whose loss and grad norm make the mean and deviation
  double z = 10.0;            // deviations above the mean that skip a step
  int64_t min_steps = 50;     // z-scores count once the window holds this many steps
  int64_t max_skips = 5;      // skips in a row that roll the run back to its last checkpoint
  int64_t rollback_skip = 50; // data steps a rollback skips at least, from the checkpoint on
  int64_t max_rollbacks = 3;  // rollbacks before the run stops
  std::vector<StepRange> skip_steps;  // data steps read but not trained on (also with enabled = false)
};

struct TrainingSection {
  int64_t steps = 1000;
  int64_t batch_size = 8;     // B, windows per micro-batch
  int64_t seq_len = 1024;     // T
  int64_t grad_accum = 1;     // micro-batches per optimizer step
  double grad_clip = 1.0;     // 0 disables clipping
  std::string dtype = "bf16"; // bf16 | fp32 (autocast dtype for forward)
  std::string matmul_precision = "high";  // fp32 matmuls on CUDA: high (TF32) | highest | medium
  bool cuda_graph = false;    // replay the step as CUDA graphs (model/device/captured_step.h)
  std::string recompute = "none";  // none | mlp | block: what backward computes again (model/net/recompute.h)
  GuardSection guard;
};

struct OptimizerSection {
  double lr = 6e-4, min_lr = 6e-5;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  int64_t warmup_steps = 100;
  bool fused = true;
};

struct EvalSection {
  int64_t every = 0;          // steps between evaluations (0 = off)
  int64_t batches = 8;        // validation batches per evaluation (a fixed set)
  int64_t sample_tokens = 48; // generated sample length (0 = none)
  std::string prompt = "\n";
  double temperature = 0.8;
  int64_t top_k = 40;
  std::filesystem::path hellaswag;  // HellaSwag items (hellaswag_val.jsonl; "" = none)
  int64_t hellaswag_every = 0;      // steps between HellaSwag scores (0 = with every evaluation)
  int64_t hellaswag_items = 0;      // items scored (0 = all)

  /// Whether the (1-based) step `step` computes the validation loss and sample; `last`: the
  /// run's last step, which always does when evaluation is on.
  bool loss_at(int64_t step, bool last) const { return every > 0 && (step % every == 0 || last); }
  /// Whether it scores HellaSwag: every hellaswag_every steps (or `every`), and at the last.
  bool hellaswag_at(int64_t step, bool last) const {
    const int64_t k = hellaswag_every > 0 ? hellaswag_every : every;
    return !hellaswag.empty() && k > 0 && (step % k == 0 || last);
  }
  /// Whether any step evaluates anything.
  bool on() const { return every > 0 || hellaswag_at(0, true); }
};

struct CheckpointSection {
  int64_t every = 0;  // steps between checkpoints (0 = only at the end)
  int64_t keep = 2;   // newest checkpoints kept
  bool at_end = true;
  std::string on_error = "stop";  // stop | warn: what a failed checkpoint write does to the run
};

struct LoggingSection {
  int64_t every = 10;              // steps between progress lines
  std::string live = "auto";       // auto | tty | line | off
  int64_t stats_interval_ms = 50;  // queue occupancy sampling period
  bool trace = true;               // write trace.json
  double peak_tflops = 0;          // device peak for MFU (dense bf16 TFLOP/s); 0: model/device/device_peak.h's table
  bool tensorboard = false;        // TensorBoard event files in the run directory
  std::string http;                // "PORT" or "ADDR:PORT": serve the live page and /metrics ("" = off)
};

struct RunConfig {
  std::filesystem::path file;
  std::filesystem::path source_dir;
  RunSection run;
  ModelSection model;
  DataSection data;
  TrainingSection training;
  OptimizerSection optimizer;
  EvalSection eval;
  CheckpointSection checkpoint;
  LoggingSection logging;
  std::vector<config::Section> sections;  // resolved, for printing and for the run directory
};

}  // namespace pipeline::stages
