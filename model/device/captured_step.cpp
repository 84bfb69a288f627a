// See captured_step.h.
#include "model/device/captured_step.h"

#include <stdexcept>

#include "model/net/autocast.h"

#ifdef PIPELINE_HAVE_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace pipeline::model {

#ifdef PIPELINE_HAVE_CUDA

struct CapturedStep::Impl {
  GPT model;
  AdamW& opt;
  CapturedStepOptions o;
  std::vector<torch::Tensor> params;
  at::cuda::MempoolId_t pool;
  torch::Tensor x, y;      // (B, T) int64 each: the static inputs, rows[:, :T] and rows[:, 1:]
  torch::Tensor loss_sum;  // () fp32: sum over the step's micro-batches of loss / accum
  torch::Tensor norm;      // () fp32: made during the update graph's capture, static since
  std::unique_ptr<at::cuda::CUDAGraph> first, accum, update;

  Impl(GPT m, AdamW& optimizer, CapturedStepOptions options)
      : model(std::move(m)), opt(optimizer), o(options), pool(at::cuda::graph_pool_handle()) {
    const auto dev = model->wte->weight.device();
    if (!dev.is_cuda()) throw std::invalid_argument("CapturedStep: CUDA graphs need the model on CUDA, it is on " + dev.str());
    if (c10::cuda::getCurrentCUDAStream(dev.index()) == c10::cuda::getDefaultCUDAStream(dev.index()))
      throw std::logic_error("CapturedStep: capture needs a non-default current stream");
    if (o.B < 1 || o.T < 1 || o.accum < 1) throw std::invalid_argument("CapturedStep: B, T and accum must be >= 1");
    for (auto& p : model->parameters())
      if (p.requires_grad()) params.push_back(p);
    x = torch::zeros({o.B, o.T}, torch::TensorOptions().dtype(torch::kLong).device(dev));
    y = torch::zeros({o.B, o.T}, torch::TensorOptions().dtype(torch::kLong).device(dev));
    loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(dev));
  }

  // The work each forward/backward graph records; `assign`: the first micro-batch.
  void forward_backward(bool assign) {
    torch::Tensor loss;
    {
      AutocastGuard autocast(torch::kCUDA, o.autocast);
      loss = model->loss(model->forward(x), y);  // ()
    }
    if (o.accum > 1) loss = loss / static_cast<double>(o.accum);
    loss.backward();  // autograd's CUDA thread launches on this (capturing) stream
    torch::NoGradGuard no_grad;
    if (assign)
      loss_sum.copy_(loss.detach());
    else
      loss_sum.add_(loss.detach());
  }

  std::unique_ptr<at::cuda::CUDAGraph> capture(const std::function<void()>& work) {
    auto g = std::make_unique<at::cuda::CUDAGraph>();
    // Thread-local, not torch's default global mode: while train captures, the other stage
    // threads go on making CUDA calls (h2d's copies and host functions, log's and checkpoint's
    // event waits, eval's forward, pinned allocations by pack and eval). In global mode any of
    // those invalidates the capture (cudaErrorStreamCaptureInvalidated), depending on timing;
    // thread-local mode checks only this thread, which makes no unsafe call while capturing.
    // Autograd's device thread launches backward onto the capturing stream, which is allowed.
    g->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    try {
      work();
    } catch (...) {
      // End the capture so the stream is usable for the error path; the graph is discarded.
      try {
        g->capture_end();
      } catch (...) {
      }
      throw;
    }
    g->capture_end();
    return g;
  }
};

CapturedStep::CapturedStep(GPT model, AdamW& optimizer, CapturedStepOptions options)
    : impl_(std::make_unique<Impl>(std::move(model), optimizer, options)) {}

CapturedStep::~CapturedStep() = default;

void CapturedStep::micro_batch(const torch::Tensor& rows, int64_t micro) {
  Impl& s = *impl_;
  TORCH_CHECK(rows.is_cuda() && rows.dim() == 2 && rows.size(0) == s.o.B && rows.size(1) == s.o.T + 1,
              "CapturedStep: expected (B, T+1) = (", s.o.B, ", ", s.o.T + 1, ") rows on CUDA, got ", rows.sizes(), " on ",
              rows.device());
  TORCH_CHECK(micro >= 0 && micro < s.o.accum, "CapturedStep: micro-batch ", micro, " of ", s.o.accum);
  // Widening casts into the static inputs, on the current stream, outside the graphs.
  s.x.copy_(rows.narrow(1, 0, s.o.T));
  s.y.copy_(rows.narrow(1, 1, s.o.T));
  const bool assign = micro == 0;
  auto& graph = assign ? s.first : s.accum;
  if (!graph) {
    if (assign)
      for (auto& p : s.params) p.mutable_grad().reset();  // set_to_none: backward creates static gradients
    graph = s.capture([&] { s.forward_backward(assign); });
  }
  graph->replay();
}

std::pair<torch::Tensor, torch::Tensor> CapturedStep::update(double lr) {
  Impl& s = *impl_;
  if (!s.o.guard) s.opt.set_lr(lr);  // a fill kernel on the current stream, before the replay reads it
  if (!s.update) {
    s.update = s.capture([&] {
      s.norm = clip_grad_norm(s.params, s.o.grad_clip > 0 ? s.o.grad_clip : 1e30);
      if (s.o.guard)
        s.opt.step(s.o.guard->judge(s.loss_sum, s.norm, s.opt));
      else
        s.opt.step();
    });
  }
  s.update->replay();
  return {s.loss_sum, s.norm};
}

#else  // no CUDA in this build

struct CapturedStep::Impl {};

CapturedStep::CapturedStep(GPT, AdamW&, CapturedStepOptions) {
  throw std::invalid_argument("CapturedStep: this build has no CUDA ([training] cuda_graph needs it)");
}
CapturedStep::~CapturedStep() = default;
void CapturedStep::micro_batch(const torch::Tensor&, int64_t) {}
std::pair<torch::Tensor, torch::Tensor> CapturedStep::update(double) { return {}; }

#endif

}  // namespace pipeline::model
