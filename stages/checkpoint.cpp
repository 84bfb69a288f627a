// checkpoint: writes the snapshots train takes (every [checkpoint] every steps and at the end)
// to RUN_DIR/checkpoints/step_NNNNNNNN.ckpt, atomically, keeping the newest `keep`. Writing
// happens here, on its own thread: training only paid for enqueuing the copies of the state into
// reused pinned buffers (model/checkpoint/snapshot.h), which go back to train's pool once this stage has
// written them and let go of the step.
// A write that fails stops the run or is logged, as [checkpoint] on_error says.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "base/nvtx.h"

#include "graph/stage.h"
#include "stages/ranks.h"
#include "stages/types.h"

namespace pipeline::stages {
namespace {

namespace fs = std::filesystem;

class Checkpoint : public graph::Stage {
 public:
  explicit Checkpoint(const graph::StageContext& ctx) : rc_(run_context(ctx)) {}

  // It waits on the snapshot's CUDA events: on the run's device, or that makes a context on GPU 0.
  void initialize() override {
    model::use_device(rc_.device);
    if (rc_.writer() && !rc_.run_dir.empty()) list(rc_.run_dir / "checkpoints");
  }

  void process(graph::Item in, graph::Emitter& out) override {
    const auto& r = in.get<StepResult>();
    if (!r.checkpoint) return;
    auto t0 = std::chrono::steady_clock::now();
    {
      const NvtxRange range("wait for the snapshot's copies");
      out.add_device_wait(r.checkpoint->wait());  // the device-to-host copies of the snapshot (sleeps, no spin)
    }
    const NvtxRange range("write checkpoint");
    auto dir = rc_.run_dir / "checkpoints";
    char name[64];
    std::snprintf(name, sizeof name, "step_%08lld.ckpt", static_cast<long long>(r.checkpoint->step));
    auto path = dir / name;
    try {
      fs::create_directories(dir);
      if (rc_.ranks) {  // data parallel: the checkpoint also holds every other rank's data cursor
        auto state = *r.checkpoint;
        state.metadata = rc_.ranks->complete_checkpoint_metadata(state.step, state.metadata);
        model::write_checkpoint(path.string(), state);
      } else {
        model::write_checkpoint(path.string(), *r.checkpoint);
      }
    } catch (const std::exception& e) {
      write_failed(r.checkpoint->step, e.what());
      return;
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
  // A checkpoint that could not be written (disk full, read-only directory). The writer has
  // removed its temporary file and the previous checkpoint is untouched; [checkpoint] on_error
  // says whether the run stops (the engine reports this error and `pipeline run` prints the
  // resume command) or trains on.
  void write_failed(int64_t step, const std::string& why) {
    std::string last;
    {
      std::lock_guard<std::mutex> lock(rc_.mu);
      last = rc_.checkpoint_written;
    }
    std::string msg = "checkpoint of step " + std::to_string(step) + " not written: " + why + "; the last good checkpoint is " +
                      (last.empty() ? std::string("none") : last);
    if (rc_.cfg.checkpoint.on_error == "warn") {
      rc_.log->print("warning: " + msg + " (training goes on: [checkpoint] on_error = \"warn\")");
      return;
    }
    throw std::runtime_error(msg + " (to train on past such errors, set [checkpoint] on_error = \"warn\")");
  }

  // Keeps the newest `keep` checkpoints and removes temporary files that a killed writer left
  // (this stage is the only writer, one checkpoint at a time, so none is being written now).
  void prune(const fs::path& dir) {
    std::vector<fs::path> all;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const auto& p = e.path();
      if (p.extension() == ".ckpt") {
        all.push_back(p);
      } else if (p.extension() == ".tmp" && p.stem().extension() == ".ckpt" && e.is_regular_file(ec)) {
        remove_logged(p);
      }
    }
    std::sort(all.begin(), all.end());  // zero-padded step numbers sort by step
    const auto keep = static_cast<size_t>(rc_.cfg.checkpoint.keep);
    for (size_t i = 0; i + keep < all.size(); ++i) remove_logged(all[i]);
    list(dir);
  }

  // RunContext::checkpoints: what the directory holds now, by step.
  void list(const fs::path& dir) {
    std::vector<std::pair<int64_t, fs::path>> found;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      long long step = -1;
      char tail = 0;
      if (e.path().extension() == ".ckpt" &&
          std::sscanf(e.path().filename().c_str(), "step_%lld.ckp%c", &step, &tail) == 2 && step >= 0)
        found.emplace_back(step, e.path());
    }
    std::sort(found.begin(), found.end());
    std::lock_guard<std::mutex> lock(rc_.mu);
    rc_.checkpoints = std::move(found);
  }

  void remove_logged(const fs::path& p) {
    std::error_code ec;
    if (!fs::remove(p, ec) && ec) rc_.log->print("warning: checkpoint: cannot remove " + p.string() + ": " + ec.message());
  }

  RunContext& rc_;
};

// Declared, with its options, in stages/catalog.cpp.
PIPELINE_STAGE_IMPL(checkpoint, {.name = "checkpoint",
                                 .input = typeid(StepResult),
                                 .accepts = [](const graph::Item& it) { return it.get<StepResult>().checkpoint != nullptr; },
                                 .factory = graph::make_factory<Checkpoint>()});

}  // namespace
}  // namespace pipeline::stages
