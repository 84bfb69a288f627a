// train: forward and loss under bf16 autocast, backward, gradient clipping, AdamW step with the
// warmup + cosine schedule, gradient accumulation to the global batch. Runs on a thread of its
// own (CUDA stream, autocast and grad mode are thread-local). On CUDA a step makes no host sync:
// it waits for the batch's copy event on its own stream, and the loss and gradient norm leave
// the device through a non-blocking copy into pinned memory with an event that log waits on.
#include <chrono>

#include "graph/stage.h"
#include "model/autocast.h"
#include "model/optim.h"
#include "model/schedule.h"
#include "stages/data_parallel.h"
#include "stages/types.h"

#ifdef PIPELINE_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace pipeline::stages {
namespace {

class Train : public graph::Stage {
 public:
  explicit Train(const graph::StageContext& ctx) : rc_(require_run_context(ctx.name)) {
    const auto& t = rc_.cfg.training;
    if (t.seq_len > rc_.model.block_size)
      throw std::invalid_argument("[training] seq_len = " + std::to_string(t.seq_len) +
                                  " exceeds the model's block_size " + std::to_string(rc_.model.block_size));
  }

  void initialize() override {
    const auto& cfg = rc_.cfg;
#ifdef PIPELINE_HAVE_CUDA
    if (rc_.device.is_cuda()) {
      c10::cuda::set_device(rc_.device.index());
      stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, rc_.device.index());
      c10::cuda::setCurrentCUDAStream(*stream_);  // this thread's current stream from now on
    }
#endif
    model_ = model::GPT(rc_.model, static_cast<uint64_t>(cfg.run.seed));
    model_->to(rc_.device);
    model_->train();
    model::AdamWOptions o;
    o.lr = cfg.optimizer.lr;
    o.beta1 = cfg.optimizer.beta1;
    o.beta2 = cfg.optimizer.beta2;
    o.eps = cfg.optimizer.eps;
    o.weight_decay = cfg.optimizer.weight_decay;
    o.fused = cfg.optimizer.fused;
    opt_ = std::make_unique<model::AdamW>(model_->named_parameters(), o);
    if (!rc_.resume_from.empty()) {
      auto state = model::read_checkpoint(rc_.resume_from.string());
      model::restore(state, model_, opt_.get());
    }
    for (auto& p : model_->parameters()) params_.push_back(p);
    // Data parallel: every rank starts from rank 0's weights; gradients are averaged in backward.
    if (rc_.dp) {
      sync_ = std::make_unique<TrainSync>(*rc_.dp, cfg, params_);
      rc_.log->print(sync_->describe_buckets());
    }
    sched_ = model::LrSchedule{cfg.optimizer.lr, cfg.optimizer.min_lr, cfg.optimizer.warmup_steps, cfg.training.steps};
    step_ = rc_.start_step;
    cursor_ = rc_.start;
    step_cursor_ = rc_.start;
    autocast_ = cfg.training.dtype == "bf16";
    if (step_ >= cfg.training.steps) finish();
  }

  void process(graph::Item in, graph::Emitter& out) override {
    if (done_) return;  // the run has its steps: what is still queued is not needed
    const auto accum = rc_.cfg.training.grad_accum;
    const bool last_micro_batch = micro_ + 1 == accum;
    if (sync_ && !sync_->before_forward(last_micro_batch)) return stop_with_the_others(out);
    auto b = in.take<Batch>();
    torch::Tensor x = b.x, y = b.y;  // (B, T)
    if (rc_.device.is_cuda()) {
#ifdef PIPELINE_HAVE_CUDA
      if (b.ready) {
        // Order the copy before our kernels on the device; the host does not wait.
        static_cast<at::cuda::CUDAEvent*>(b.ready.get())->block(*stream_);
        // x and y were allocated on h2d's stream: keep the allocator from reusing them while
        // this stream still reads them.
        c10::cuda::CUDACachingAllocator::recordStream(x.storage().data_ptr(), *stream_);
      } else if (!x.is_cuda()) {
        auto both = torch::stack({x, y}).to(rc_.device, /*non_blocking=*/false);  // (2, B, T): no h2d stage
        x = both[0];
        y = both[1];
      }
#endif
    }
    torch::Tensor loss;
    {
      model::AutocastGuard autocast(rc_.device.type(), autocast_);
      auto logits = model_->forward(x);  // (B, T, V)
      loss = model_->loss(logits, y);    // ()
    }
    if (accum > 1) loss = loss / static_cast<double>(accum);
    if (sync_) sync_->before_backward(loss, last_micro_batch);
    loss.backward();  // outside autocast, as in PyTorch
    loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss.detach() : loss.detach();
    cursor_ = b.after;
    if (++micro_ < accum) return;
    micro_ = 0;
    step(out);
  }

  void finalize(graph::Emitter& out) override {
    // Stopped before the last step (Ctrl-C, or the data ran out with loop = false): record where
    // we are so `--resume` continues from here. A partial accumulation is dropped; its batches
    // are read again on resume because the cursor is that of the last completed step.
    if (done_) return;
    if (sync_) sync_->end_of_input();  // data parallel: the other ranks stop after this step too
    emit_final_checkpoint(out);
  }

 private:
  void emit_final_checkpoint(graph::Emitter& out) {
    if (!rc_.cfg.checkpoint.at_end || step_ == rc_.start_step) return;
    StepResult r;
    r.step = step_;
    r.last = true;
    r.cursor = step_cursor_;
    r.issued = std::chrono::steady_clock::now();
    if (!sync_ || sync_->checkpoint_here(step_, step_cursor_)) r.checkpoint = snapshot();
    out.emit(std::move(r));
  }

  // Data parallel: the ranks agreed to stop before this step (a stop request or a rank out of
  // data), so every rank checkpoints the same step.
  void stop_with_the_others(graph::Emitter& out) {
    emit_final_checkpoint(out);
    finish();
  }

  void step(graph::Emitter& out) {
    const auto& cfg = rc_.cfg;
    torch::Tensor norm = cfg.training.grad_clip > 0 ? model::clip_grad_norm(params_, cfg.training.grad_clip)
                                                    : model::clip_grad_norm(params_, 1e30);  // the norm, no clipping
    const double lr = sched_.at(step_);
    opt_->set_lr(lr);
    opt_->step();
    opt_->zero_grad();
    ++step_;
    step_cursor_ = cursor_;

    StepResult r;
    r.step = step_;
    r.tokens = cfg.training.batch_size * cfg.training.seq_len * cfg.training.grad_accum * rc_.partition.world;  // all ranks
    r.lr = lr;
    r.cursor = cursor_;
    r.last = step_ >= cfg.training.steps;
    if (sync_) sync_->average(loss_sum_, norm, r);  // the logged loss and norm: means over the ranks
    if (cfg.eval.every > 0 && (step_ % cfg.eval.every == 0 || r.last) && rc_.writer()) {
      auto w = std::make_shared<EvalWeights>();
      w->step = step_;
      torch::NoGradGuard no_grad;
      for (const auto& p : model_->named_parameters()) w->weights.emplace_back(p.key(), p.value().detach().clone());
      r.eval = std::move(w);
    }
    if (((cfg.checkpoint.every > 0 && step_ % cfg.checkpoint.every == 0) || (r.last && cfg.checkpoint.at_end)) &&
        (!sync_ || sync_->checkpoint_here(step_, step_cursor_)))
      r.checkpoint = snapshot();
#ifdef PIPELINE_HAVE_CUDA
    if (rc_.device.is_cuda()) {
      auto pinned = torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(true);
      r.loss = torch::empty({}, pinned);
      r.grad_norm = torch::empty({}, pinned);
      r.loss.copy_(loss_sum_, /*non_blocking=*/true);
      r.grad_norm.copy_(norm, /*non_blocking=*/true);
      auto ev = std::make_shared<at::cuda::CUDAEvent>();
      ev->record(*stream_);  // after the copies and the eval weight clones
      r.done = ev;
    }
#endif
    if (!r.done) {
      r.loss = loss_sum_.to(torch::kFloat32);
      r.grad_norm = norm.to(torch::kFloat32);
    }
    loss_sum_ = torch::Tensor();
    r.issued = std::chrono::steady_clock::now();
    rc_.last_step.store(step_);
    if (r.last) finish();
    out.emit(std::move(r));
  }

  std::shared_ptr<const model::CheckpointState> snapshot() {
    std::string meta = "{\"step\":" + std::to_string(step_) + ",\"cursor\":" + step_cursor_.to_json() +
                       ",\"seed\":" + std::to_string(rc_.cfg.run.seed) + ",\"model\":" + rc_.model.to_json() + "}";
    return std::make_shared<model::CheckpointState>(model::snapshot(model_, opt_.get(), step_, meta, /*non_blocking=*/true));
  }

  void finish() {
    if (sync_) sync_->finish();
    done_ = true;
    rc_.input_done.store(true);  // sources stop; what is in flight drains and is dropped here
  }

  RunContext& rc_;
  model::GPT model_{nullptr};
  std::unique_ptr<model::AdamW> opt_;
  std::vector<torch::Tensor> params_;
  model::LrSchedule sched_;
  int64_t step_ = 0, micro_ = 0;
  bool autocast_ = true, done_ = false;
  torch::Tensor loss_sum_;
  DataCursor cursor_, step_cursor_;
  std::unique_ptr<TrainSync> sync_;  // data parallel only
#ifdef PIPELINE_HAVE_CUDA
  std::optional<c10::cuda::CUDAStream> stream_;
#endif
};

PIPELINE_STAGE(train, {.name = "train",
                       .doc = "forward/backward/AdamW step of the GPT-2 model ([model], [training], [optimizer]); bf16 autocast",
                       .input = graph::port<Batch>("batch"),
                       .output = graph::port<StepResult>("step"),
                       .own_thread = true,
                       .ordered = true,
                       .max_workers = 1,
                       .on_stop = graph::OnStop::discard,
                       .factory = graph::make_factory<Train>()});

}  // namespace
}  // namespace pipeline::stages
