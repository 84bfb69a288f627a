// See run_setup.h.
#include "runner/run_setup.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <iostream>
#include <optional>
#include <set>

#include "base/atomic_file.h"
#include "base/json.h"
#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/checkpoint_config.h"
#include "model/device/device_event.h"
#include "model/dist/dist_env.h"
#include "model/dist/slurm_env.h"
#include "runner/data_parallel.h"
#include "runner/lane_setup.h"
#include "runner/resume_records.h"

namespace pipeline::stages {

namespace fs = std::filesystem;

std::vector<config::Section> RunPlan::sections() const {
  auto out = ctx->cfg.sections;
  for (const auto& s : spec.stages)
    if (s.resolved) out.push_back(*s.resolved);
  return out;
}

namespace {

// Under torchrun, each rank on a machine takes the GPU numbered by its LOCAL_RANK (under srun,
// by its SLURM_LOCALID).
torch::Device pick_device(const RunConfig& rc, const std::optional<dist::LaunchEnv>& env) {
  const auto& d = rc.run.device;
  bool cuda = torch::cuda::is_available();
  if (d == "cuda" && !cuda)
    throw config::ConfigError(rc.file.string() + ": [run] device: \"cuda\" was asked for but no CUDA device is available");
  if (d == "cuda" || (d == "auto" && cuda)) {
    int index = env ? env->local_rank : 0;
    const int count = static_cast<int>(torch::cuda::device_count());
    // srun --gpus-per-task=1 (or --gpu-bind) shows each task its own GPU, as device 0.
    if (env && env->slurm && count == 1) index = 0;
    if (index >= count)
      throw dist::LaunchError(std::string(env->slurm ? "SLURM_LOCALID" : "LOCAL_RANK") + " is " + std::to_string(index) +
                              " but this machine has " + std::to_string(count) + " CUDA device" + (count == 1 ? "" : "s") +
                              ": start at most " + std::to_string(count) + " ranks per machine (" +
                              (env->slurm ? "srun --ntasks-per-node" : "torchrun --nproc-per-node") + ")");
    return torch::Device(torch::kCUDA, static_cast<torch::DeviceIndex>(index));
  }
  return torch::kCPU;
}

dist::BackendKind pick_backend(const RunConfig& rc, const torch::Device& device) {
  const auto& b = rc.run.backend;
  if (b == "nccl" && !device.is_cuda())
    throw config::ConfigError(rc.file.string() + ": [run] backend: \"nccl\" needs CUDA devices, and this run trains on " +
                              device.str() + " (use \"gloo\", or \"auto\")");
  if (b == "nccl" || (b == "auto" && device.is_cuda())) return dist::BackendKind::nccl;
  return dist::BackendKind::gloo;
}

// What every rank must agree on, one "section.key = value" line each: the resolved settings
// minus those that may differ between machines without changing what is trained (paths, names,
// thread and worker counts, logging, and how long a delay or spin stage holds each item, so that
// one machine can be slowed on purpose).
std::string config_fingerprint(const RunPlan& plan) {
  std::set<std::string> timing_only;  // "stages.<name>" of the delay and spin stages
  std::set<std::string> fetching;     // "stages.<name>" of the fetch stage: how fast, never what
  for (const auto& st : plan.spec.stages) {
    if (st.type == "delay" || st.type == "spin") timing_only.insert("stages." + st.name);
    if (st.type == "fetch") fetching.insert("stages." + st.name);
  }
  auto skip = [&](const std::string& section, const std::string& key) {
    if (section == "logging") return true;
    if (section == "run") return key == "name" || key == "dir" || key == "threads" || key == "device";
    // Where a machine reaches the data and caches it may differ (a nearer endpoint, a local disk).
    if (section == "data")
      return key == "dataset" || key == "endpoint" || key == "region" || key == "profile" || key == "allow_http" ||
             key == "cache_dir";
    if (fetching.count(section)) return key != "type";
    if (timing_only.count(section)) return key == "ms" || key == "jitter_ms" || key == "seed";
    if (section.rfind("stages.", 0) == 0)
      return key == "dataset" || key == "mix" || key == "workers" || key == "capacity";
    return false;
  };
  std::string out;
  for (const auto& s : plan.sections()) {
    std::string toml = config::to_toml({s});
    for (size_t at = toml.find('\n') + 1; at < toml.size();) {  // past the [section] line
      size_t end = toml.find('\n', at);
      std::string line = toml.substr(at, end - at);
      at = end + 1;
      if (line.empty()) continue;
      if (!skip(s.name(), line.substr(0, line.find(' ')))) out += s.name() + "." + line + "\n";
    }
  }
  return out;
}

// Joins the other ranks (torchrun): the data-parallel group, and this rank's share of the data.
void join_ranks(RunPlan& plan, const dist::LaunchEnv& env) {
  auto& ctx = *plan.ctx;
  const auto& run = ctx.cfg.run;
  dist::GroupOptions o;
  o.backend = pick_backend(ctx.cfg, ctx.device);
  o.device = ctx.device;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(run.dist_timeout_s * 1000));
  o.heartbeat_timeout = std::chrono::milliseconds(static_cast<int64_t>(run.dist_heartbeat_s * 1000));
  o.config_fingerprint = config_fingerprint(plan);
  plan.dp = std::make_shared<DataParallel>(dist::Group::join(env, o), o.backend);
  ctx.ranks = plan.dp;
  ctx.partition = {static_cast<uint32_t>(env.rank), static_cast<uint32_t>(env.world_size)};
}

std::string timestamp() {
  auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

// The checkpoint a run continues from in `dir`, chosen by rank 0 (or the only process) and taken
// from it by the other ranks, so that every rank resumes from the same one. Explicit --resume: the
// newest, and an error when there is none. auto: the newest that reads back whole (one that does
// not is named on stderr and passed over), or none when `dir` holds no checkpoint yet; checkpoints
// none of which reads back are an error, never a fresh start over them. `state` is the chosen
// checkpoint when it was read already (auto, on the choosing rank), so it is not read twice.
struct AgreedCheckpoint {
  fs::path path;  // empty: none, start the run
  std::optional<model::CheckpointState> state;
};

AgreedCheckpoint agreed_checkpoint(DataParallel* dp, const fs::path& dir, bool automatic) {
  if (dp && dp->rank() != 0) {
    auto chosen = dp->group().get("resume_from");
    return {chosen == "-" ? fs::path() : fs::path(chosen), std::nullopt};
  }
  AgreedCheckpoint out;
  fs::path& chosen = out.path;
  if (!automatic) {
    if (!fs::is_directory(dir)) throw std::runtime_error(dir.string() + ": no such run directory");
    chosen = latest_checkpoint(dir);
    if (chosen.empty())
      throw std::runtime_error(dir.string() + ": no checkpoint in " + (dir / "checkpoints").string() + " to resume from");
  } else {
    const auto all = checkpoints_newest_first(dir);
    for (const auto& c : all) {
      try {
        out.state = model::read_checkpoint(c.string());  // checks every length and the CRC
        chosen = c;
        break;
      } catch (const std::exception& e) {
        std::cerr << "pipeline run: --resume auto: passing over " << c.string() << ": " << e.what() << "\n";
      }
    }
    if (chosen.empty() && !all.empty())
      throw std::runtime_error(dir.string() + ": none of its " + std::to_string(all.size()) +
                               " checkpoints reads back whole (see above); not starting over them");
  }
  if (dp) dp->group().set("resume_from", chosen.empty() ? "-" : chosen.string());
  return out;
}

// The checkpoint an explicit --resume chose (its run's newest). One that does not read back whole
// (damaged after it was written: its writer renames only complete files) is an error, as the
// user named this run; the error says which older checkpoint the run can go back to, and how.
model::CheckpointState read_named_checkpoint(const fs::path& ckpt) {
  try {
    return model::read_checkpoint(ckpt.string());
  } catch (const std::exception& e) {
    const auto all = checkpoints_newest_first(ckpt.parent_path().parent_path());
    auto older = std::find_if(all.begin(), all.end(), [&](const fs::path& c) { return c != ckpt; });
    if (older == all.end()) throw;
    throw std::runtime_error(std::string(e.what()) + ". The run holds an older checkpoint, " + older->string() +
                             ": move the damaged one aside (mv " + ckpt.string() + " " + ckpt.string() +
                             ".damaged) and run the same command again to resume from the newest that reads back "
                             "(--resume auto passes over damaged checkpoints by itself)");
  }
}

// Keeps a resumed run's global batch: the checkpoint's micro-batches per step, shared by this
// run's ranks (unless this command sets training.grad_accum itself). Returns a line for the log
// when the number of ranks or grad_accum changed, "" otherwise.
std::string adapt_grad_accum(const std::string& metadata, const RunRequest& req, int world, RunConfig& cfg,
                             const std::string& ckpt) {
  const bool set_here = std::any_of(req.overrides.begin(), req.overrides.end(), [](const std::string& o) {
    return o.rfind("training.grad_accum=", 0) == 0;
  });
  if (set_here) return "";
  const ResumedBatch b = resumed_batch(metadata, world, cfg.training, ckpt);
  const int64_t before = cfg.training.grad_accum;
  cfg.training.grad_accum = b.grad_accum;
  if (b.written_by == world && b.grad_accum == before) return "";
  for (auto& sec : cfg.sections)  // the settings table shows what the run trains with, and why
    if (sec.name() == "training")
      sec.set("grad_accum", b.grad_accum, config::Location{"checkpoint", 0});
  auto ranks = [](int n) { return n == 1 ? std::string("1 process") : std::to_string(n) + " ranks"; };
  return "resuming a checkpoint of " + ranks(b.written_by) + " on " + ranks(world) + ": grad_accum " +
         std::to_string(b.grad_accum) + " (it was " + std::to_string(b.written_grad_accum) + "), the same " +
         std::to_string(b.micro_batches) + " micro-batches of " + std::to_string(cfg.training.batch_size) + "x" +
         std::to_string(cfg.training.seq_len) + " tokens a step; the data goes on where they left it, dealt out over " +
         ranks(world);
}

// The run directory (new, or the one --resume names), the checkpoint to resume from and this
// rank's data position in it, and the run log. With several ranks, rank 0 names a new run
// directory and is the only one to write into it.
void locate_run(RunPlan& plan, const RunRequest& req) {
  auto& ctx = plan.ctx;
  DataParallel* dp = plan.dp.get();
  const int rank = dp ? dp->rank() : 0;
  const int world = dp ? dp->size() : 1;
  const bool automatic = req.resume.empty() && req.create_run_dir && (req.resume_auto || ctx->cfg.run.resume == "auto");
  if (automatic && ctx->cfg.run.dir.empty())
    throw config::ConfigError(ctx->cfg.file.string() +
                              ": --resume auto needs [run] dir: a restarted run finds its checkpoints there (the "
                              "default runs/<name>-<timestamp> is new at every start)");

  AgreedCheckpoint agreed;
  if (!req.resume.empty() || automatic)
    agreed = agreed_checkpoint(dp, automatic ? fs::path(ctx->cfg.run.dir) : req.resume, automatic);
  const fs::path& ckpt = agreed.path;
  const bool resuming = !ckpt.empty();
  std::string resplit;  // what a resume on another number of ranks changed, for the log
  std::string superseded_note;  // records past the checkpoint moved out of metrics.jsonl
  if (resuming) {
    auto state = agreed.state ? std::move(*agreed.state) : read_named_checkpoint(ckpt);
    check_resumable(state.metadata, ctx->cfg, ctx->model, ckpt.string());
    model::restore_rng(state);  // dropout goes on with the masks it would have drawn (set_torch_globals seeded first)
    ctx->start = checkpoint_cursor(state.metadata, rank, world, ckpt.string());
    resplit = adapt_grad_accum(state.metadata, req, world, ctx->cfg, ckpt.string());
    // The order it was written in (a checkpoint from before lanes: the documents order).
    const CheckpointOrder held = checkpoint_order(state.metadata, ckpt.string());
    apply_checkpoint_order(held, req, ctx->cfg, world, ckpt.string());
    ctx->start_data_step = held.data_step;
    ctx->start_step = state.step;
    ctx->start_guard = GuardRecord::from_metadata(json_parse(state.metadata), state.step, ckpt.string());
    ctx->resume_from = ckpt;
    ctx->checkpoint_written = ckpt.string();  // the newest good checkpoint until this run writes one
    ctx->run_dir = automatic ? fs::path(ctx->cfg.run.dir) : req.resume;
  } else if (req.create_run_dir && rank != 0) {
    ctx->run_dir = dp->group().get("run_dir");  // named by rank 0 (its clock, its checks)
  } else if (req.create_run_dir) {
    ctx->run_dir = ctx->cfg.run.dir.empty() ? fs::path("runs") / (ctx->cfg.run.name + "-" + timestamp())
                                            : fs::path(ctx->cfg.run.dir);
    check_new_run_dir(ctx->run_dir, ctx->cfg.run.dir.empty(), /*probe=*/false);
  }
  const bool writer = ctx->writer();
  if (!ctx->run_dir.empty() && writer) {
    std::error_code ec;
    fs::create_directories(ctx->run_dir, ec);
    if (ec) throw run_dir_error(ctx->run_dir, ec.message(), ctx->cfg.run.dir.empty() && req.resume.empty());
    // Two runs in one directory would rotate each other's checkpoints away and interleave their
    // logs (a job requeued while the old one still runs, the same --resume in two terminals).
    plan.run_dir_lock = std::make_unique<DirLock>(ctx->run_dir, "run directory");
    if (resuming) {  // the steps past the checkpoint are trained again: their old records move out
      if (const size_t moved = supersede_metrics_after(ctx->run_dir, ctx->start_step); moved > 0)
        superseded_note = "resuming from step " + std::to_string(ctx->start_step) + ": " + std::to_string(moved) +
                          " records of metrics.jsonl past it (logged before the run stopped, trained again now) "
                          "moved to metrics.superseded.jsonl";
    }
    if (!resuming) {
      // --resume reads this file back: a run whose config.toml could not be written must not start.
      write_file_atomic(ctx->run_dir / "config.toml", "# Resolved configuration of this run (from " +
                                                          plan.config_path.string() + ").\n\n" +
                                                          config::to_toml(plan.sections()));
    }
    if (dp && !resuming) dp->group().set("run_dir", ctx->run_dir.string());
  }
  // Ranks other than 0 write nothing and print nothing: rank 0 speaks for the run.
  ctx->log = std::make_shared<RunLog>(writer ? ctx->run_dir : fs::path(), /*print=*/writer);
  if (!resplit.empty()) ctx->log->print(resplit);
  if (!superseded_note.empty()) ctx->log->print(superseded_note);
}

// Under Slurm, the job and how often it was requeued, in the run log and in metrics.jsonl (a line
// of its own, before the steps this allocation trains): which allocation trained which steps.
void note_slurm_job(const RunContext& ctx, const std::optional<dist::LaunchEnv>& env) {
  const auto job = dist::slurm_job(dist::process_env());
  if (!job || !ctx.writer()) return;
  const int ranks = env ? env->world_size : 1;
  std::string line = job->str() + ": " + (env ? env->str() : "one process");
  if (env) line += env->slurm ? ", ranks from srun" : env->torchrun() ? ", ranks from torchrun" : "";
  line += ctx.start_step > 0 ? "; continues from step " + std::to_string(ctx.start_step) : "; starts the run";
  ctx.log->print(line);
  ctx.log->metric("{\"slurm_job_id\":" + json_quote(job->id) + ",\"slurm_restart_count\":" +
                  std::to_string(job->restart_count) + (job->array.empty() ? "" : ",\"slurm_array\":" + json_quote(job->array)) +
                  ",\"start_step\":" + std::to_string(ctx.start_step) + ",\"ranks\":" + std::to_string(ranks) + "}");
}

// The process-wide torch settings the run trains with, set once on this thread before the engine
// starts, never by a stage (train's thread and eval's would race on them): fp32 matmuls (those
// outside autocast, and all of an fp32 run) on TF32 cores or not, and the default generators
// seeded from [run] seed, from which dropout draws its masks. A resumed run then restores the
// generator states its checkpoint holds (locate_run).
void set_torch_globals(const RunContext& ctx) {
  if (ctx.device.is_cuda()) at::globalContext().setFloat32MatmulPrecision(ctx.cfg.training.matmul_precision);
  torch::manual_seed(static_cast<uint64_t>(ctx.cfg.run.seed));
}

}  // namespace

graph::EngineOptions engine_options(const RunContext& ctx) {
  graph::EngineOptions opts;
  opts.run_dir = ctx.writer() ? ctx.run_dir : std::filesystem::path();  // ranks > 0: stats go to rank 0
  opts.sample_interval = std::chrono::milliseconds(ctx.cfg.logging.stats_interval_ms);
  opts.trace = ctx.cfg.logging.trace;
  opts.autotune = ctx.cfg.run.autotune;
  return opts;
}

RunPlan plan_run(const RunRequest& req) {
  ResolvedRun resolved = resolve_run(req);  // config, graph and model, before anything touches the disk
  RunPlan plan;
  plan.config_path = std::move(resolved.config_path);
  plan.doc = std::move(resolved.doc);
  plan.spec = std::move(resolved.spec);
  auto ctx = std::make_shared<RunContext>();
  plan.ctx = ctx;
  ctx->cfg = std::move(resolved.cfg);
  ctx->model = resolved.model;
  ctx->store_options = store_options_of(ctx->cfg, plan.spec);
  // Set by torchrun, or by srun; none for one process.
  const auto env = dist::launch_env(dist::process_env(), static_cast<uint16_t>(ctx->cfg.run.master_port));
  ctx->device = pick_device(ctx->cfg, env);
  // This thread builds the stages, and some allocate pinned memory as they are built: with the
  // run's device current, or each rank would make a context on GPU 0 as well.
  model::use_device(ctx->device);
  set_torch_globals(*ctx);
  if (env && req.create_run_dir) join_ranks(plan, *env);
  try {
    locate_run(plan, req);
    if (ctx->cfg.data.order == "lanes")  // K, this rank's lanes and where they start (docs/data_order.md)
      ctx->lanes = lane_session(ctx->cfg, plan.dp ? static_cast<uint32_t>(plan.dp->rank()) : 0,
                                plan.dp ? static_cast<uint32_t>(plan.dp->size()) : 1, ctx->start.lanes);
    note_slurm_job(*ctx, plan.dp ? env : std::nullopt);
  } catch (const std::exception& e) {
    if (plan.dp) plan.dp->group().record_exit(e.what());  // the others stop waiting for this rank
    throw;
  }
  return plan;
}

}  // namespace pipeline::stages
