// synthetic: random tokens of the configured shape, replacing the whole input side, to measure
// compute alone. A few distinct batches of (B, T+1) uint16 rows (pinned on CUDA, as pack's are)
// are made up front and emitted in turn, so the source costs next to nothing per item; they are
// never rewritten, so no copy out of them needs fencing.
#include <c10/core/DeviceGuard.h>

#include <optional>
#include <span>

#include "datasets/lanes/row_hash.h"
#include "graph/stage.h"
#include "stages/types.h"

namespace pipeline::stages {
namespace {

class Synthetic : public graph::Stage {
 public:
  explicit Synthetic(const graph::StageContext& ctx) : rc_(run_context(ctx)) {
    auto B = rc_.cfg.training.batch_size, T = rc_.cfg.training.seq_len;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(rc_.cfg.run.seed));
    int64_t distinct = ctx.options.get_int("distinct");
    // Pinned with the run's device current: the memory belongs to its context, and no context
    // is made on GPU 0 (this runs on the thread that builds the graph).
    c10::OptionalDeviceGuard guard(rc_.device.is_cuda() ? std::optional<c10::Device>(rc_.device) : std::nullopt);
    for (int64_t i = 0; i < distinct; ++i) {
      auto buf = torch::randint(0, rc_.model.vocab_size, {B, T + 1}, gen, torch::kInt64);  // (B, T+1)
      auto rows = buf.to(torch::kUInt16);  // (B, T+1)
      hashes_.push_back(datasets::rows_hash(std::span<const uint16_t>(static_cast<const uint16_t*>(rows.data_ptr()),
                                                                      static_cast<size_t>(rows.numel())),
                                            static_cast<size_t>(T + 1)));
      pool_.push_back(rc_.device.is_cuda() ? rows.pin_memory() : rows);
    }
    next_index_ = first_index_ = rc_.start_step * rc_.cfg.training.grad_accum;
  }

  bool produce(graph::Emitter& out) override {
    if (out.stop_requested()) return false;
    auto B = rc_.cfg.training.batch_size, T = rc_.cfg.training.seq_len;
    const size_t which = static_cast<size_t>(next_index_) % pool_.size();
    const auto& buf = pool_[which];
    Batch b;
    b.rows = buf;  // (B, T+1) uint16
    b.windows = hashes_[which];
    b.B = B;
    b.T = T;
    b.index = next_index_++;
    b.data_step = rc_.start_data_step + (b.index - first_index_) / rc_.cfg.training.grad_accum;
    b.after = DataCursor{};
    out.emit(std::move(b));
    return true;
  }

 private:
  RunContext& rc_;
  std::vector<torch::Tensor> pool_;
  std::vector<uint64_t> hashes_;  // each batch's row hashes, summed (datasets/lanes/row_hash.h)
  int64_t next_index_ = 0, first_index_ = 0;
};

// Declared, with its options, in stages/catalog.cpp.
PIPELINE_STAGE_IMPL(synthetic, {.name = "synthetic",
                                .output = typeid(Batch),
                                .factory = graph::make_factory<Synthetic>()});

}  // namespace
}  // namespace pipeline::stages
