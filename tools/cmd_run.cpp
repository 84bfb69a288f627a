// `pipeline run CONFIG`: trains as the config's graph of stages says, with the live stage view,
// stats and trace in the run directory, Ctrl-C handling and --resume. Under torchrun, each process
// is one data-parallel rank (runner/data_parallel.h); rank 0 speaks and writes for the run.
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <optional>
#include <unistd.h>

#include "base/atomic_file.h"
#include "cli.h"
#include "run_request.h"
#include "graph/engine.h"
#include "graph/observe/live_view.h"
#include "graph/observe/stats.h"
#include "graph/observe/http_server.h"
#include "runner/data_parallel.h"
#include "runner/live_server.h"
#include "runner/rank_session.h"
#include "runner/rank_stats.h"
#include "runner/run_setup.h"
#include "runner/signals.h"
#include "runner/tensorboard_log.h"
#include "runner/train_figures.h"

namespace pipeline::cli {
namespace {

// The step of a checkpoint file (checkpoints/step_NNNNNNNN.ckpt), or -1.
int64_t checkpoint_step(const std::string& path) {
  auto name = std::filesystem::path(path).stem().string();
  if (name.rfind("step_", 0) != 0) return -1;
  try {
    return std::stoll(name.substr(5));
  } catch (const std::exception&) {
    return -1;
  }
}

// Removes a run directory this command created if nothing was written into it but the
// resolved config, an empty metrics.jsonl and run.log (which holds the settings table by then:
// the run never started, and the error goes to stderr).
void remove_unused_run_dir(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    auto name = e.path().filename().string();
    if (name == "config.toml" || name == ".lock" ||  // (base/dir_lock.h: this process's)
        name == "run.log" || (name == "metrics.jsonl" && fs::file_size(e.path(), ec) == 0))
      continue;
    return;  // something else is there: keep it
  }
  fs::remove_all(dir, ec);
}

// Prints lines (a table, the verdict) as they were written, on stdout and into run.log.
void print_block(stages::RunLog& log, const std::string& text) {
  log.print(text.ends_with('\n') ? text.substr(0, text.size() - 1) : text);
}

void print_settings(const stages::RunPlan& plan) {
  const auto& ctx = *plan.ctx;
  std::ostringstream os;
  print_run_header(os, plan.config_path, ctx.device.str(), ctx.run_dir, ctx.model, plan.sections(), plan.doc.removed());
  if (plan.dp)
    os << "data parallel: " << plan.dp->size() << " ranks, " << dist::backend_name(plan.dp->backend())
       << "; rank r reads documents d with d % " << plan.dp->size() << " == r\n";
  if (ctx.start_step > 0)
    os << "resuming from " << ctx.resume_from.string() << " at step " << ctx.start_step << ", data "
       << ctx.start.pos.str() << " +" << ctx.start.skip << " tokens\n";
  print_block(*ctx.log, os.str());
}

// The final tables and the verdict, after a blank line.
void print_final_summary(stages::RunLog& log, const graph::Snapshot& snap, const graph::Verdict& verdict) {
  std::ostringstream os;
  os << "\n";
  graph::print_summary(os, stages::rank_rows(snap), verdict);
  print_block(log, os.str());
}

// How to continue this run: with several ranks, torchrun (or srun) with the same number of them.
std::string resume_command(const stages::RunPlan& plan) {
  std::string dir = plan.ctx->run_dir.string();
  if (!plan.dp) return "pipeline run --resume " + dir;
  const auto& env = plan.dp->group().env();
  if (env.slurm)
    return "srun --ntasks=" + std::to_string(env.world_size) + " pipeline run --resume " + dir + " (" +
           std::to_string(env.world_size) + " ranks, as before; tools/slurm/train.sbatch does it by itself)";
  std::string ranks = env.world_size == env.local_world_size
                          ? "--nproc-per-node=" + std::to_string(env.world_size)
                          : "--nnodes=" + std::to_string(env.world_size / env.local_world_size) +
                                " --nproc-per-node=" + std::to_string(env.local_world_size) + " ...";
  return "torchrun " + ranks + " --no-python pipeline run --resume " + dir + " (" + std::to_string(env.world_size) +
         " ranks, as before)";
}

// Why the spike guard stopped the run, "" when it did not.
std::string guard_stop(stages::RunContext& ctx) {
  std::lock_guard<std::mutex> lock(ctx.mu);
  return ctx.guard_stop;
}

// The last checkpoint written (or resumed from), "" when none.
std::string last_checkpoint(stages::RunContext& ctx) {
  std::lock_guard<std::mutex> lock(ctx.mu);
  return ctx.checkpoint_written;
}

int run_main(const std::vector<std::string>& args) {
  // First of all: from here on a signal never costs the checkpoint, and a closed pipe or terminal
  // never ends the run (runner/signals.h). It outlives every line this command prints.
  stages::RunSignals signals;
  const stages::RunRequest req = parse_run_request(args, "run");
  auto plan = stages::plan_run(req);
  auto& ctx = *plan.ctx;
  if (ctx.writer()) print_settings(plan);
  // A resumed run that has reached its steps trains nothing: complete is exit 0 (a scheduler that
  // starts a finished job again is done), past them an error (runner/run_resolve.h).
  if (const auto none = stages::nothing_to_train(ctx.cfg, ctx.start_step, ctx.resume_from.string(), ctx.run_dir)) {
    if (none->past) {
      ctx.log->error("pipeline run: error: " + none->message);
      return 1;
    }
    ctx.log->print(none->message);
    return 0;
  }
  if (ctx.cfg.run.threads > 0) at::set_num_threads(static_cast<int>(ctx.cfg.run.threads));

  graph::EngineOptions opts = stages::engine_options(ctx);
  opts.host = plan.ctx;  // what the training stages are built with (stages::run_context)
  stages::TrainFigures figures(ctx);  // loss, tokens/s, ... in each stats report
  opts.annotate = [&figures](graph::Snapshot& s) { figures.annotate(s); };
  // The live page and /metrics, bound now so that a port in use stops the run before it starts.
  std::unique_ptr<graph::LiveServer> server;
  try {
    server = stages::start_live_server(ctx, req.serve);
  } catch (const std::exception& e) {
    if (plan.dp) plan.dp->group().record_exit(e.what());
    if (ctx.resume_from.empty() && ctx.writer()) remove_unused_run_dir(ctx.run_dir);
    throw;
  }
  // A stage that cannot be built (a missing dataset, say) leaves no run directory behind: the
  // structure of the graph was checked before it was made (plan_run), and what the directory
  // holds so far (config.toml, an empty metrics.jsonl, run.log with the settings) is removed again.
  std::unique_ptr<graph::Engine> engine_ptr;
  try {
    engine_ptr = std::make_unique<graph::Engine>(plan.spec, opts);
  } catch (const std::exception& e) {
    if (plan.dp) plan.dp->group().record_exit(e.what());  // the other ranks stop waiting for this one
    if (ctx.resume_from.empty() && ctx.writer()) remove_unused_run_dir(ctx.run_dir);
    throw;
  }
  graph::Engine& engine = *engine_ptr;
  auto tensorboard = stages::TensorBoardLog::attach(engine, ctx);  // [logging] tensorboard

  graph::LiveViewOptions vo;
  const auto& live = ctx.cfg.logging.live;
  vo.mode = live == "tty" ? graph::LiveViewOptions::Mode::tty
            : live == "line" ? graph::LiveViewOptions::Mode::line
            : live == "off"  ? graph::LiveViewOptions::Mode::off
                             : graph::LiveViewOptions::Mode::automatic;
  if (!ctx.writer()) vo.mode = graph::LiveViewOptions::Mode::off;
  vo.on_write_error = [log = ctx.log](int err) { log->output_lost(2, err); };
  bool screen = vo.mode == graph::LiveViewOptions::Mode::tty ||
                (vo.mode == graph::LiveViewOptions::Mode::automatic && isatty(STDERR_FILENO));
  graph::LiveView view(engine, std::cerr, vo);
  if (screen) {
    // The screen is redrawn in place: progress lines become its status line instead of
    // scrolling it away (every line is also in metrics.jsonl and run.log).
    ctx.log->set_printer([&view](const std::string& line) { view.set_status(line); });
  }

  bool failed = false;
  std::string failure;
  std::optional<stages::RankSession> rank;  // several ranks: stopping together, peer failures, statistics
  if (plan.dp) rank.emplace(ctx, *plan.dp, engine);
  if (server) stages::feed_live_server(*server, engine, rank);
  // One path for a stop, whether one process or one rank of several: the first signal stops after
  // the current step with a checkpoint (several ranks agree on the step first), a later one aborts
  // (runner/signals.h: one within 2 s is the same request).
  signals.bind({.stop =
                    [&](int sig) {
                      if (rank)
                        rank->request_stop();
                      else
                        engine.stop();
                      // After the request: a write that blocks (a full pipe) must not hold the stop back.
                      ctx.log->error("pipeline run: " + stages::RunSignals::name(sig) +
                                     ": stopping after the current step, with a checkpoint (another signal, "
                                     "2 s or more after this one, stops at once)");
                    },
                .abort =
                    [&](int sig) {
                      if (rank)
                        rank->abort(128 + sig);
                      else
                        engine.abort();
                    },
                .checkpoint = [&] { ctx.checkpoint_requests.fetch_add(1); }});
  try {
    engine.run();
  } catch (const std::exception& e) {
    failed = true;
    failure = rank ? rank->explain(e.what()) : e.what();
  }
  signals.unbind();  // the engine and the session they act on are done
  ctx.log->set_printer(nullptr);
  auto snap = engine.final_snapshot();
  const std::string who = rank ? " (" + rank->prefix() + ")" : "";
  if (rank) {
    rank->finished(failed ? failure : "", snap);
    if (failed) {
      // A failed data-parallel run ends here: tearing c10d down may wait on collectives with a
      // rank that is gone. Rank 0 shows what it has of every rank's statistics first.
      if (ctx.writer()) {
        auto merged = rank->merged_now(snap);
        print_final_summary(*ctx.log, merged, stages::analyze_ranks(merged));
      }
      ctx.log->error("pipeline run" + who + ": error: " + failure);
      const std::string last = last_checkpoint(ctx);
      if (!last.empty()) ctx.log->error("last checkpoint: " + last + " (continue with: " + resume_command(plan) + ")");
      std::cerr.flush();
      std::_Exit(1);
    }
    if (!ctx.writer()) {
      rank->wait_for_others();  // (this rank may host the store: srun's first node's first task)
      if (!guard_stop(ctx).empty()) return 1;
      if (plan.dp->stopped_early() != stages::DataParallel::EarlyStop::requested) return 0;
      return 128 + (signals.stop_signal() ? signals.stop_signal() : SIGINT);
    }
    snap = rank->merged(snap);
    rank->wait_for_others();
  }
  auto verdict = stages::analyze_ranks(snap);
  if (rank && !ctx.run_dir.empty())  // the run's summary holds every rank's stages, and their verdict
    write_file_atomic(ctx.run_dir / "stats_summary.json", graph::to_json(snap, &verdict) + "\n");
  print_final_summary(*ctx.log, snap, verdict);

  // What the run ends with goes to run.log too: the resume command survives a terminal or a pipe
  // that is gone.
  const int64_t done = ctx.last_step.load();
  const std::string ckpt = last_checkpoint(ctx);
  if (failed) {
    ctx.log->error("pipeline run" + who + ": error: " + failure);
    if (!ckpt.empty()) ctx.log->error("last checkpoint: " + ckpt + " (continue with: " + resume_command(plan) + ")");
    return 1;
  }
  // [training] steps counts updates; a step the spike guard skipped, or data it skipped, is a step
  // without one.
  const int64_t updates = ctx.updates.load();
  const std::string of_total = updates == done ? " of " + std::to_string(ctx.cfg.training.steps)
                                               : " (" + std::to_string(updates) + " of " +
                                                     std::to_string(ctx.cfg.training.steps) + " updates)";
  if (const std::string why = guard_stop(ctx); !why.empty()) {
    ctx.log->error("pipeline run: the spike guard stopped the run at step " + std::to_string(done) + of_total + ": " + why);
    if (!ckpt.empty()) ctx.log->error("last checkpoint: " + ckpt + " (continue with: " + resume_command(plan) + ")");
    return 1;
  }
  const auto early = plan.dp ? plan.dp->stopped_early() : stages::DataParallel::EarlyStop::none;
  const bool interrupted = engine.stop_requested() || early == stages::DataParallel::EarlyStop::requested;
  const int sig = signals.stop_signal() ? signals.stop_signal() : SIGINT;
  if (interrupted || updates < ctx.cfg.training.steps) {
    std::string line = (interrupted && signals.stop_signal() ? stages::RunSignals::name(sig) + ": " : std::string()) +
                       "stopped at step " + std::to_string(done) + of_total;
    if (early == stages::DataParallel::EarlyStop::out_of_data) line += " (a rank ran out of data)";
    if (plan.dp) line += " on all " + std::to_string(plan.dp->size()) + " ranks";
    line += ".";
    const int64_t saved = ckpt.empty() ? -1 : checkpoint_step(ckpt);
    if (ctx.cfg.checkpoint.at_end && done > ctx.start_step && saved != done) {
      // The drain was cut short (a second signal): the final snapshot never reached the disk.
      ctx.log->print(line);
      std::string err = "pipeline run: error: the final checkpoint (step " + std::to_string(done) +
                        ") was not written: the run was aborted before it could be (" + snap.status + ")";
      if (saved >= 0)
        err += "; the newest checkpoint is " + ckpt + " (step " + std::to_string(saved) + "): " + resume_command(plan) +
               " repeats steps " + std::to_string(saved + 1) + ".." + std::to_string(done);
      ctx.log->error(err);
      return 1;
    }
    if (!ckpt.empty()) {
      ctx.log->print(line + " Checkpoint " + ckpt + ".");
      ctx.log->print("Continue with: " + resume_command(plan) +
                     "   (it reads the run's own config.toml, --set overrides included)");
    } else {
      ctx.log->print(line + " No checkpoint was written.");
    }
    return interrupted ? 128 + sig : 0;
  }
  std::string line = "done: " + std::to_string(done) + " steps";
  if (updates != done) line += " (" + std::to_string(updates) + " updates)";
  if (!ckpt.empty()) line += "; checkpoint " + ckpt;
  ctx.log->print(line);
  if (!ctx.run_dir.empty())
    ctx.log->print("run directory: " + ctx.run_dir.string() + " (pipeline stats " + ctx.run_dir.string() + ")");
  return 0;
}

// Described (summary, usage) in tools/torch_commands.cpp.
PIPELINE_COMMAND_IMPL(run, &run_main);

}  // namespace
}  // namespace pipeline::cli
