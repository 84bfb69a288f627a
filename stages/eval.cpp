// eval: every [eval] every steps, the validation loss over a fixed set of batches from the
// validation split and a short sample from a fixed prompt (KV cache, under the training's
// autocast); with [eval] hellaswag, every hellaswag_every steps (default: with each of those), the
// HellaSwag accuracy (model/eval/hellaswag.h). It runs on its own thread and stream with its own copy
// of the model (weights handed over by train), so neither training nor the input side waits for it.
//
// Stream order, not host waits: eval's stream waits on the step's event (after which train's
// weight clones are complete) before copying them into its model, and records its stream on
// each clone, so the caching allocator does not reuse a clone's memory until that copy has run,
// whichever thread drops the step. The results (loss sum, the sample's ids, HellaSwag's losses)
// come back in pinned buffers behind one event, waited for without spinning.
//
// On a CPU run the evaluation itself (the model's passes, on a thread of its own at idle
// priority, base/idle_thread.h) takes only the cycles training leaves; this stage's thread, which
// takes the engine's locks and wakes its workers, keeps its priority.
#include <cstdio>
#include <memory>

#include "base/idle_thread.h"
#include "base/nvtx.h"

#include "datasets/eval/hellaswag.h"
#include "base/json.h"
#include "datasets/tokenizer/tokenizer.h"
#include "graph/stage.h"
#include "model/net/autocast.h"
#include "model/eval/generate.h"
#include "model/eval/hellaswag.h"
#include "stages/dry_run.h"
#include "stages/types.h"

#ifdef PIPELINE_HAVE_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace pipeline::stages {
namespace {

class Eval : public graph::Stage {
 public:
  explicit Eval(const graph::StageContext& ctx)
      : rc_(run_context(ctx)), active_(rc_.cfg.eval.on() && rc_.writer()) {
    if (!active_) return;  // data parallel: rank 0 evaluates, the others train only
    // The fixed validation set ([eval] batches of B×T, the first tokens of the split as training
    // sees them) and HellaSwag's items, read, tokenized and checked now, while the graph is built:
    // a bad file stops the run before it trains (stages/dry_run.h, which `pipeline check` runs too).
    if (rc_.cfg.eval.every > 0) {
      const auto ids = validation_tokens(rc_.cfg, ctx.options, ctx.name, rc_.cfg.eval.batches);
      const int64_t B = rc_.cfg.training.batch_size, T = rc_.cfg.training.seq_len;
      n_batches_ = std::min<int64_t>(rc_.cfg.eval.batches, (static_cast<int64_t>(ids.size()) - 1) / (B * T));
      val_ = torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kInt64);  // (N)
    }
    hellaswag_ = evaluation_items(rc_.cfg, rc_.model);
    // Built here, while the graph is built, not in initialize(): module constructors draw from
    // the global CPU generator, and train draws its dropout masks from it once it runs.
    model_ = model::GPT(rc_.model, static_cast<uint64_t>(rc_.cfg.run.seed));
  }

  void initialize() override {
    if (!active_) return;
    // On a CPU run evaluation shares the cores with training: its passes, and the OpenMP threads
    // they start (which inherit it), run under SCHED_IDLE (where refused, at nice +19), so that
    // they take the cycles training leaves idle rather than the ones it trains with. Only they
    // do: this thread takes locks that train and the input side take, and may create the
    // engine's TBB workers (which would inherit its priority) when it hands on its results. It is
    // asynchronous work: its results may come later, the steps may not; should it fall behind by
    // its whole input queue, train waits for it, and then the cores are idle for it.
    if (!rc_.device.is_cuda()) idle_ = std::make_unique<IdleThread>("eval compute");
#ifdef PIPELINE_HAVE_CUDA
    if (rc_.device.is_cuda()) {
      model::use_device(rc_.device);
      c10::cuda::setCurrentCUDAStream(c10::cuda::getStreamFromPool(false, rc_.device.index()));
    }
#endif
    model_->to(rc_.device);
    model_->eval();
    if (val_.defined()) val_ = val_.to(rc_.device);
  }

  void process(graph::Item in, graph::Emitter& out) override {
    const auto& r = in.get<StepResult>();
    if (!r.eval) return;
    const c10::Stream stream = model::current_stream(rc_.device);
    Results res;
    if (idle_)
      idle_->run([&] { res = evaluate(r, stream); });
    else
      res = evaluate(r, stream);
    if (rc_.device.is_cuda()) {
      model::DeviceEvent fetched;
      fetched.record(stream);
      out.add_device_wait(fetched.wait());
    }
    report(r.eval->step, res);
  }

 private:
  // What an evaluation computed, on the host (behind the stream's next event on a GPU).
  struct Results {
    torch::Tensor loss_sum;  // () fp32, undefined when the step had no validation loss
    torch::Tensor ids;       // (sample_tokens) int64, undefined without a sample
    model::HellaSwagLosses hellaswag;
    bool loss_due = false;
  };

  // The step's evaluation: train's weights copied in, the validation loss, the sample and
  // HellaSwag's losses, each copied to the host (pinned, non-blocking on a GPU).
  Results evaluate(const StepResult& r, const c10::Stream& stream) {
    {
      torch::NoGradGuard no_grad;
      if (r.done) r.done->block(stream);  // train's clones are complete at that event: a device-side wait
      auto params = model_->named_parameters();
      for (const auto& [name, w] : r.eval->weights) {
        params[name].copy_(w);
        if (w.is_cuda()) w.record_stream(stream);  // allocated on train's stream, read on ours
      }
    }
    const auto B = rc_.cfg.training.batch_size, T = rc_.cfg.training.seq_len;
    const bool loss_due = r.eval->loss && val_.defined(), hellaswag_due = r.eval->hellaswag && !hellaswag_.items.empty();
    torch::Tensor loss_sum, ids;
    model::HellaSwagLosses hellaswag;
    {
      torch::NoGradGuard no_grad;
      model::AutocastGuard autocast(rc_.device.type(), rc_.cfg.training.dtype == "bf16");
      if (loss_due) {
        const NvtxRange range("validation loss");
        loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(rc_.device));
        for (int64_t i = 0; i < n_batches_; ++i) {
          auto buf = val_.narrow(0, i * B * T, B * T + 1);  // (B*T+1)
          auto x = buf.narrow(0, 0, B * T).view({B, T});    // (B, T)
          auto y = buf.narrow(0, 1, B * T).view({B, T});    // (B, T)
          loss_sum.add_(model_->loss(model_->forward(x), y));
        }
      }
      if (loss_due && rc_.cfg.eval.sample_tokens > 0) {
        const NvtxRange sampling("sample (KV cache)");
        const auto& tok = datasets::Tokenizer::gpt2();
        auto ids32 = tok.encode_ordinary(rc_.cfg.eval.prompt);
        std::vector<int64_t> prompt(ids32.begin(), ids32.end());
        if (prompt.empty()) prompt.push_back(datasets::Tokenizer::eot_id);
        model::SampleOptions so;
        so.n_tokens = rc_.cfg.eval.sample_tokens;
        so.temperature = rc_.cfg.eval.temperature;
        so.top_k = rc_.cfg.eval.top_k;
        so.seed = static_cast<uint64_t>(rc_.cfg.run.seed);
        ids = model::sample_on_device(model_, prompt, so);  // (sample_tokens) int64, on the device
      }
      if (hellaswag_due) {
        const NvtxRange range("HellaSwag");
        hellaswag = model::hellaswag_losses(model_, hellaswag_);  // (4 * items) on the device
      }
    }
    // The loss sum, the sample's ids and HellaSwag's losses come back in one transfer each,
    // behind one event.
    Results res;
    res.loss_sum = loss_sum.defined() ? to_host(loss_sum) : torch::Tensor();
    res.ids = ids.defined() ? to_host(ids) : torch::Tensor();
    res.hellaswag = std::move(hellaswag);
    if (res.hellaswag.sums.defined()) res.hellaswag.sums = to_host(res.hellaswag.sums);
    res.loss_due = loss_due;
    return res;
  }

  // The evaluation's line in the output and in metrics.jsonl, once its results are on the host.
  void report(long long step, const Results& res) {
    std::string text = "eval  step " + std::to_string(step), metric = "{\"step\":" + std::to_string(step);
    char part[160];
    if (res.loss_sum.defined()) {
      const double val_loss = res.loss_sum.item<double>() / static_cast<double>(n_batches_);
      std::snprintf(part, sizeof part, " | val loss %.4f over %lld batches", val_loss, static_cast<long long>(n_batches_));
      text += part;
      metric += ",\"val_loss\":" + std::to_string(val_loss);
    }
    if (res.hellaswag.sums.defined()) {
      const model::HellaSwagResult h = model::hellaswag_result(hellaswag_, res.hellaswag);
      std::snprintf(part, sizeof part, " | hellaswag acc_norm %.4f (acc %.4f, %lld items)", h.acc_norm(), h.acc(),
                    static_cast<long long>(h.n));
      text += part;
      std::snprintf(part, sizeof part, ",\"hellaswag_acc_norm\":%.6f,\"hellaswag_acc\":%.6f,\"hellaswag_items\":%lld",
                    h.acc_norm(), h.acc(), static_cast<long long>(h.n));
      metric += part;
    }
    if (res.loss_due) {
      std::string sample;
      if (res.ids.defined()) {
        const auto& tok = datasets::Tokenizer::gpt2();
        std::vector<uint32_t> gen;
        const auto* p = res.ids.data_ptr<int64_t>();
        for (int64_t i = 0; i < res.ids.numel(); ++i)
          if (p[i] < static_cast<int64_t>(tok.vocab_size())) gen.push_back(static_cast<uint32_t>(p[i]));
        sample = rc_.cfg.eval.prompt + tok.decode(gen);
      }
      if (!sample.empty()) text += "\n  sample: " + indent(sample);
      metric += ",\"sample\":" + json_quote(sample);
    }
    rc_.log->print(text);
    rc_.log->metric(metric + "}");
  }

  // A host copy of t: a non-blocking copy into pinned memory on CUDA (complete at the next event).
  torch::Tensor to_host(const torch::Tensor& t) const {
    if (!t.is_cuda()) return t;
    auto host = torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(true));
    host.copy_(t, /*non_blocking=*/true);
    return host;
  }

  static std::string indent(const std::string& s) {
    std::string out;
    for (char c : s) {
      out += c;
      if (c == '\n') out += "          ";
    }
    return out;
  }

  RunContext& rc_;
  bool active_;
  model::GPT model_{nullptr};
  torch::Tensor val_;  // undefined when [eval] every = 0 (HellaSwag only)
  int64_t n_batches_ = 0;
  datasets::HellaSwagSet hellaswag_;  // empty without [eval] hellaswag
  std::unique_ptr<IdleThread> idle_;  // a CPU run's evaluations run there (initialize())
};

// Declared, with its options, in stages/catalog.cpp.
PIPELINE_STAGE_IMPL(eval, {.name = "eval",
                           .input = typeid(StepResult),
                           .accepts = [](const graph::Item& it) { return it.get<StepResult>().eval != nullptr; },
                           .factory = graph::make_factory<Eval>()});

}  // namespace
}  // namespace pipeline::stages
