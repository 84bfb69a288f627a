// checkpoint: writes the snapshots train takes (every [checkpoint] every steps and at the end)
// to RUN_DIR/checkpoints/step_NNNNNNNN.ckpt, atomically, keeping the newest `keep`. Writing
// happens here, on its own thread: training only paid for copying the state off the device.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "graph/stage.h"
#include "stages/data_parallel.h"
#include "stages/types.h"

namespace pipeline::stages {
namespace {

namespace fs = std::filesystem;

class Checkpoint : public graph::Stage {
 public:
  explicit Checkpoint(const graph::StageContext& ctx) : rc_(require_run_context(ctx.name)) {}

  void process(graph::Item in, graph::Emitter&) override {
    const auto& r = in.get<StepResult>();
    if (!r.checkpoint) return;
    auto t0 = std::chrono::steady_clock::now();
    r.checkpoint->wait();  // the device-to-host copies of the snapshot
    auto dir = rc_.run_dir / "checkpoints";
    fs::create_directories(dir);
    char name[64];
    std::snprintf(name, sizeof name, "step_%08lld.ckpt", static_cast<long long>(r.checkpoint->step));
    auto path = dir / name;
    if (rc_.dp) {  // data parallel: the checkpoint also holds every other rank's data cursor
      auto state = *r.checkpoint;
      state.metadata = rc_.dp->complete_checkpoint_metadata(state.step, state.metadata);
      model::write_checkpoint(path.string(), state);
    } else {
      model::write_checkpoint(path.string(), *r.checkpoint);
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(rc_.mu);
      rc_.checkpoint_written = path.string();
    }
    char line[256];
    std::snprintf(line, sizeof line, "checkpoint: step %lld -> %s (%.1f MB, %.2f s)",
                  static_cast<long long>(r.checkpoint->step), path.c_str(),
                  static_cast<double>(fs::file_size(path)) / 1e6, s);
    rc_.log->print(line);
    prune(dir);
  }

 private:
  void prune(const fs::path& dir) {
    std::vector<fs::path> all;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".ckpt") all.push_back(e.path());
    std::sort(all.begin(), all.end());  // zero-padded step numbers sort by step
    const auto keep = static_cast<size_t>(rc_.cfg.checkpoint.keep);
    for (size_t i = 0; i + keep < all.size(); ++i) fs::remove(all[i]);
  }

  RunContext& rc_;
};

PIPELINE_STAGE(checkpoint, {.name = "checkpoint",
                            .doc = "writes train's snapshots atomically to RUN_DIR/checkpoints, keeping the newest [checkpoint] keep",
                            .input = graph::port<StepResult>("step"),
                            .output = graph::no_port(),
                            .own_thread = true,
                            .ordered = true,
                            .max_workers = 1,
                            .accepts = [](const graph::Item& it) { return it.get<StepResult>().checkpoint != nullptr; },
                            .factory = graph::make_factory<Checkpoint>()});

}  // namespace
}  // namespace pipeline::stages
