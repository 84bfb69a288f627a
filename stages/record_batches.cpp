// record_batches: passes batches through unchanged and records each one's input tokens, to audit
// exactly what a run (or, with torchrun, each rank) trained on: RUN_DIR/batches.u16, or
// RUN_DIR/batches.rank<R>.u16 for data-parallel rank R. The file holds uint16 ids in native byte
// order (little-endian on x86 and ARM), B*T per batch (x, row by row), in training order, and only
// the run's steps * grad_accum batches (pack reads ahead of training; the batches past the last
// step are not recorded). In the documents order a batch's rows are cut from one window of
// B*T+1 tokens, and with `last_target = true` the file ends with one token more: the last batch's
// last target (its last row's last token), so that the file is the whole token stream trained on,
// inputs and targets: batch i's y is tokens [i*B*T + 1, (i+1)*B*T + 1) (tools/parity_train.py
// replays a run from it). In the lanes order rows are no stream, and last_target is refused. A
// resumed run cuts the file back to the batches before its checkpoint and
// goes on from there, so a finished run's file is its token stream, interruptions or not (an
// interrupted run's may end with batches read ahead of its last step). Insert it after pack (on
// host tensors), e.g.
//   --set stages.rec.type=record_batches --set stages.rec.input=pack --set stages.h2d.input=rec
#include <c10/core/DeviceGuard.h>

#include <cstdio>
#include <optional>

#include "graph/stage.h"
#include "stages/dry_run.h"
#include "stages/ranks.h"
#include "stages/types.h"

namespace pipeline::stages {
namespace {

class RecordBatches : public graph::Stage {
 public:
  explicit RecordBatches(const graph::StageContext& ctx) : rc_(run_context(ctx)) {
    std::filesystem::path path = ctx.options.get_string("path");
    if (path.empty()) {
      if (rc_.run_dir.empty())
        throw std::invalid_argument("[stages." + ctx.name + "] path: no run directory to write into; set a path");
      path = rc_.run_dir / (rc_.ranks ? "batches.rank" + std::to_string(rc_.ranks->rank()) + ".u16" : "batches.u16");
    }
    const auto& t = rc_.cfg.training;
    const int64_t batch_bytes = t.batch_size * t.seq_len * static_cast<int64_t>(sizeof(uint16_t));
    end_index_ = t.steps * t.grad_accum;
    last_target_ = ctx.options.get_bool("last_target");
    check_recording(rc_.cfg, ctx.options, ctx.name);
    // Keep what was trained before the checkpoint this run starts from; drop what came after it.
    const auto keep = static_cast<std::uintmax_t>(rc_.start_step * t.grad_accum * batch_bytes);
    std::error_code ec;
    if (std::filesystem::exists(path) && std::filesystem::file_size(path) > keep)
      std::filesystem::resize_file(path, keep, ec);
    if (ec) throw std::runtime_error(path.string() + ": cannot cut back to " + std::to_string(keep) + " bytes: " + ec.message());
    file_ = std::fopen(path.c_str(), "ab");
    if (!file_) throw std::runtime_error(path.string() + ": cannot open for appending");
    path_ = path.string();
  }
  ~RecordBatches() override {
    if (file_) std::fclose(file_);
  }

  void process(graph::Item in, graph::Emitter& out) override {
    const auto& b = in.get<Batch>();
    if (b.index >= end_index_) return out.emit_item(std::move(in));  // read ahead of the last step
    // After h2d the window is on the device, written on h2d's stream: wait for that copy (a host
    // wait, on this thread; the copy back runs on this thread's stream, which does not know of
    // h2d's), with the run's device current for the CUDA calls.
    c10::OptionalDeviceGuard guard(b.rows.is_cuda() ? std::optional<c10::Device>(b.rows.device()) : std::nullopt);
    if (b.ready) out.add_device_wait(b.ready->wait());
    // x: rows[:, :T], row by row, and after the last batch its last target too when asked (the
    // last row's last token).
    auto rows = b.rows.to(torch::kCPU).to(torch::kInt32).contiguous();  // (B, T+1)
    const int32_t* p = rows.data_ptr<int32_t>();
    ids_.clear();
    for (int64_t r = 0; r < b.B; ++r)
      for (int64_t t = 0; t < b.T; ++t) ids_.push_back(static_cast<uint16_t>(p[r * (b.T + 1) + t]));
    if (last_target_ && b.index == end_index_ - 1) ids_.push_back(static_cast<uint16_t>(p[b.B * (b.T + 1) - 1]));
    if (std::fwrite(ids_.data(), sizeof(uint16_t), ids_.size(), file_) != ids_.size() || std::fflush(file_) != 0)
      throw std::runtime_error(path_ + ": write failed");
    out.emit_item(std::move(in));
  }

 private:
  RunContext& rc_;
  std::FILE* file_ = nullptr;
  std::string path_;
  std::vector<uint16_t> ids_;
  int64_t end_index_ = 0;  // batches from this index on are never trained
  bool last_target_ = false;
};

// Declared, with its options, in stages/catalog.cpp.
PIPELINE_STAGE_IMPL(record_batches, {.name = "record_batches",
                                     .input = typeid(Batch),
                                     .output = typeid(Batch),
                                     .factory = graph::make_factory<RecordBatches>()});

}  // namespace
}  // namespace pipeline::stages
