// `pipeline run CONFIG`: trains as the config's graph of stages says, with the live stage view,
// stats and trace in the run directory, Ctrl-C handling and --resume. Under torchrun, each process
// is one data-parallel rank (runner/data_parallel.h); rank 0 speaks and writes for the run.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <unistd.h>

#include "base/atomic_file.h"
#include "cli.h"
#include "run_request.h"
#include "graph/engine.h"
#include "graph/observe/live_view.h"
#include "graph/observe/stats.h"
#include "runner/data_parallel.h"
#include "runner/rank_session.h"
#include "runner/rank_stats.h"
#include "runner/run_setup.h"
#include "runner/tensorboard_log.h"

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
// resolved config and an empty metrics.jsonl.
void remove_unused_run_dir(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    auto name = e.path().filename().string();
    if (name == "config.toml" || (name == "metrics.jsonl" && fs::file_size(e.path(), ec) == 0)) continue;
    return;  // something else is there: keep it
  }
  fs::remove_all(dir, ec);
}

void print_settings(const stages::RunPlan& plan) {
  const auto& ctx = *plan.ctx;
  print_run_header(std::cout, plan.config_path, ctx.device.str(), ctx.run_dir, ctx.model, plan.sections());
  if (ctx.dp)
    std::cout << "data parallel: " << ctx.dp->size() << " ranks, " << dist::backend_name(ctx.dp->backend())
              << "; rank r reads documents d with d % " << ctx.dp->size() << " == r\n";
  if (ctx.start_step > 0)
    std::cout << "resuming from " << ctx.resume_from.string() << " at step " << ctx.start_step << ", data "
              << ctx.start.pos.str() << " +" << ctx.start.skip << " tokens\n";
}

// How to continue this run: with several ranks, torchrun with the same number of them.
std::string resume_command(const stages::RunContext& ctx) {
  std::string dir = ctx.run_dir.string();
  if (!ctx.dp) return "pipeline run --resume " + dir;
  const auto& env = ctx.dp->group().env();
  std::string ranks = env.world_size == env.local_world_size
                          ? "--nproc-per-node=" + std::to_string(env.world_size)
                          : "--nnodes=" + std::to_string(env.world_size / env.local_world_size) +
                                " --nproc-per-node=" + std::to_string(env.local_world_size) + " ...";
  return "torchrun " + ranks + " --no-python pipeline run --resume " + dir + " (" + std::to_string(env.world_size) +
         " ranks, as before)";
}

int run_main(const std::vector<std::string>& args) {
  const stages::RunRequest req = parse_run_request(args, "run");
  auto plan = stages::plan_run(req);
  auto& ctx = *plan.ctx;
  if (ctx.writer()) print_settings(plan);
  if (ctx.cfg.run.threads > 0) at::set_num_threads(static_cast<int>(ctx.cfg.run.threads));

  stages::set_run_context(plan.ctx);
  struct ClearContext {
    ~ClearContext() { stages::set_run_context(nullptr); }
  } clear_context;

  graph::EngineOptions opts = stages::engine_options(ctx);
  // A stage that cannot be built (a missing dataset, say) leaves no run directory behind: the
  // structure of the graph was checked before it was made (plan_run), and what the directory
  // holds so far (config.toml, an empty metrics.jsonl) is removed again.
  std::unique_ptr<graph::Engine> engine_ptr;
  try {
    engine_ptr = std::make_unique<graph::Engine>(plan.spec, opts);
  } catch (const std::exception& e) {
    if (ctx.dp) ctx.dp->group().record_exit(e.what());  // the other ranks stop waiting for this one
    if (req.resume.empty() && ctx.writer()) remove_unused_run_dir(ctx.run_dir);
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
  bool screen = vo.mode == graph::LiveViewOptions::Mode::tty ||
                (vo.mode == graph::LiveViewOptions::Mode::automatic && isatty(STDERR_FILENO));
  graph::LiveView view(engine, std::cerr, vo);
  if (screen) {
    // The screen is redrawn in place: progress lines become its status line instead of
    // scrolling it away (every line is also in metrics.jsonl).
    ctx.log->set_printer([&view](const std::string& line) { view.set_status(line); });
  }

  bool failed = false;
  std::string failure;
  std::optional<stages::RankSession> rank;  // several ranks: signals, peer failures, statistics
  {
    std::optional<graph::SigintGuard> sigint;
    if (ctx.dp)
      rank.emplace(ctx, engine);
    else
      sigint.emplace(engine);
    try {
      engine.run();
    } catch (const std::exception& e) {
      failed = true;
      failure = rank ? rank->explain(e.what()) : e.what();
    }
  }
  ctx.log->set_printer(nullptr);
  auto snap = engine.final_snapshot();
  if (rank) {
    rank->finished(failed ? failure : "", snap);
    if (failed) {
      // A failed data-parallel run ends here: tearing c10d down may wait on collectives with a
      // rank that is gone. Rank 0 shows what it has of every rank's statistics first.
      if (ctx.writer()) {
        auto merged = rank->merged_now(snap);
        std::cout << "\n";
        graph::print_summary(std::cout, stages::rank_rows(merged), stages::analyze_ranks(merged));
      }
      std::cout.flush();
      std::cerr << "pipeline run (" << rank->prefix() << "): error: " << failure << "\n";
      std::string last;
      {
        std::lock_guard<std::mutex> lock(ctx.mu);
        last = ctx.checkpoint_written;
      }
      if (!last.empty()) std::cerr << "last checkpoint: " << last << " (continue with: " << resume_command(ctx) << ")\n";
      std::cerr.flush();
      std::_Exit(1);
    }
    if (!ctx.writer()) return ctx.dp->stopped_early() == stages::DataParallel::EarlyStop::requested ? 130 : 0;
    snap = rank->merged(snap);
    rank->wait_for_others();
  }
  auto verdict = stages::analyze_ranks(snap);
  if (rank && !ctx.run_dir.empty())  // the run's summary holds every rank's stages, and their verdict
    write_file_atomic(ctx.run_dir / "stats_summary.json", graph::to_json(snap, &verdict) + "\n");
  std::cout << "\n";
  graph::print_summary(std::cout, stages::rank_rows(snap), verdict);

  const int64_t done = ctx.last_step.load();
  std::string ckpt;
  {
    std::lock_guard<std::mutex> lock(ctx.mu);
    ckpt = ctx.checkpoint_written;
  }
  if (failed) {
    std::cerr << "pipeline run" << (rank ? " (" + rank->prefix() + ")" : "") << ": error: " << failure << "\n";
    if (!ckpt.empty()) std::cerr << "last checkpoint: " << ckpt << " (continue with: pipeline run --resume " << ctx.run_dir.string() << ")\n";
    return 1;
  }
  const auto early = ctx.dp ? ctx.dp->stopped_early() : stages::DataParallel::EarlyStop::none;
  const bool interrupted = engine.stop_requested() || early == stages::DataParallel::EarlyStop::requested;
  if (interrupted || done < ctx.cfg.training.steps) {
    std::cout << "stopped at step " << done << " of " << ctx.cfg.training.steps;
    if (early == stages::DataParallel::EarlyStop::out_of_data) std::cout << " (a rank ran out of data)";
    if (ctx.dp) std::cout << " on all " << ctx.dp->size() << " ranks";
    std::cout << ".";
    const int64_t saved = ckpt.empty() ? -1 : checkpoint_step(ckpt);
    if (ctx.cfg.checkpoint.at_end && done > ctx.start_step && saved != done) {
      // The drain was cut short (a second Ctrl-C): the final snapshot never reached the disk.
      std::cout << "\n";
      std::cerr << "pipeline run: error: the final checkpoint (step " << done
                << ") was not written: the run was aborted before it could be (" << snap.status << ")";
      if (saved >= 0)
        std::cerr << "; the newest checkpoint is " << ckpt << " (step " << saved << "): " << resume_command(ctx)
                  << " repeats steps " << saved + 1 << ".." << done;
      std::cerr << "\n";
      return 1;
    }
    if (!ckpt.empty())
      std::cout << " Checkpoint " << ckpt << ".\nContinue with: " << resume_command(ctx)
                << "   (it reads the run's own config.toml, --set overrides included)\n";
    else
      std::cout << " No checkpoint was written.\n";
    return interrupted ? 130 : 0;
  }
  std::cout << "done: " << done << " steps";
  if (!ckpt.empty()) std::cout << "; checkpoint " << ckpt;
  if (!ctx.run_dir.empty())
    std::cout << "\nrun directory: " << ctx.run_dir.string() << " (pipeline stats " << ctx.run_dir.string() << ")";
  std::cout << "\n";
  return 0;
}

// Described (summary, usage) in tools/torch_commands.cpp.
PIPELINE_COMMAND_IMPL(run, &run_main);

}  // namespace
}  // namespace pipeline::cli
