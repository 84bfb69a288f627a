// train: forward and loss under bf16 autocast, backward, gradient clipping, AdamW step with the
// warmup + cosine schedule, gradient accumulation to the global batch. Runs on a thread of its
// own (CUDA stream, autocast and grad mode are thread-local). On CUDA a step makes no host sync:
// it waits for the batch's copy event on its own stream, widens the uint16 rows there, and the
// loss and gradient norm leave the device through a non-blocking copy into pinned memory with an
// event that log waits on. Events around forward, backward and the step time them on the
// device; log reads them once the step is done. With [training] cuda_graph, forward+backward and
// clip+AdamW are replayed as CUDA graphs after 3 eager steps (model/device/captured_step.h). Before
// each step it waits, sleeping, for the step before the last to complete (model/device/run_ahead.h), so
// the host never runs more than two steps ahead of the GPU. The process-wide torch settings
// (matmul precision, the seed, a resumed run's generator states) are the run layer's
// (runner/run_setup.cpp), set before the engine starts: this stage changes none of them.
//
// With [training.guard] the update is judged on the device (model/net/spike_guard.h): a spiking
// step is skipped without a host sync, and the learning rate comes from the updates taken. The
// host reads the verdicts a step late (stages/spike_watch.h) and, after a streak of skips, rolls
// the weights, the optimizer and the detector back to the newest checkpoint from before it,
// in place, while the data goes on: the steps since that checkpoint, and up to rollback_skip from
// it, are read but not trained on, as are [training.guard] skip_steps. `step` counts data steps
// (trained or not: step n trains the batches of Batch::data_step n - 1); [training] steps counts
// updates. The data is not read again after a rollback: a data step's rows are fixed by the data
// order alone (either order), so going on reads what a run that skipped those steps reads, and
// the next checkpoint's cursors (lane cursors too) are that run's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "base/nvtx.h"

#include "base/json.h"
#include "base/short_number.h"
#include "graph/stage.h"
#include "model/net/autocast.h"
#include "model/device/captured_step.h"
#include "model/hf/hf_gpt2.h"
#include "model/net/optim.h"
#include "model/device/reuse_pool.h"
#include "model/device/run_ahead.h"
#include "model/net/schedule.h"
#include "model/checkpoint/snapshot.h"
#include "stages/ranks.h"
#include "stages/pinned_pool.h"
#include "stages/dry_run.h"
#include "stages/types.h"

#ifdef PIPELINE_HAVE_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace pipeline::stages {
namespace {

// Eager steps before the step is captured as CUDA graphs: cuBLAS handles, workspaces and the
// autocast and optimizer state come to exist outside capture (DESIGN.md: about 3).
constexpr int64_t kGraphWarmupSteps = 3;

// Times the phases of one step into a StepTiming: timing events on the device's current stream
// (CUDA), or the host clock. Each phase is an NVTX range too (Nsight Systems shows it on train's
// thread, above the kernels it launched).
class PhaseClock {
 public:
  PhaseClock(torch::Device device, StepTiming& timing, model::ReusePool<model::DeviceEvent>& events)
      : device_(device), timing_(timing), events_(events) {}
  void begin(const char* phase, const char* range_name) {
    range_.emplace(range_name);
    StepTiming::Span s{phase, nullptr, nullptr, 0};
    if (device_.is_cuda()) {
      s.start = events_.take();  // reused once log has read an earlier step's
      s.end = events_.take();
      s.start->record_current(device_);
    }
    timing_.spans.push_back(std::move(s));
    t0_ = std::chrono::steady_clock::now();
  }
  void end() {
    auto& s = timing_.spans.back();
    if (s.end)
      s.end->record_current(device_);
    else
      s.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    range_.reset();
  }

 private:
  std::optional<NvtxRange> range_;
  torch::Device device_;
  StepTiming& timing_;
  model::ReusePool<model::DeviceEvent>& events_;
  std::chrono::steady_clock::time_point t0_;
};

class Train : public graph::Stage {
 public:
  explicit Train(const graph::StageContext& ctx)
      : rc_(run_context(ctx)), name_(ctx.name), watch_(rc_.cfg.training.guard, rc_.start_guard) {
    check_training(rc_.cfg, rc_.model, rc_.device.is_cuda(), rc_.ranks != nullptr);  // stages/dry_run.h
  }

  void initialize() override {
    const auto& cfg = rc_.cfg;
#ifdef PIPELINE_HAVE_CUDA
    if (rc_.device.is_cuda()) {
      model::use_device(rc_.device);
      stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, rc_.device.index());
      c10::cuda::setCurrentCUDAStream(*stream_);  // this thread's current stream from now on
    }
#endif
    // Construction draws nothing from the global generators (GPTImpl): dropout's masks come from
    // the state the run layer seeded (or restored, on resume) before the engine started.
    model_ = model::GPT(rc_.model, static_cast<uint64_t>(cfg.run.seed));
    model_->set_recompute(model::parse_recompute(cfg.training.recompute));
    if (rc_.resume_from.empty() && !cfg.model.init_from.empty()) model::load_hf_weights(model_, cfg.model.init_from);
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
      model::restore(state, model_, opt_.get(), /*restore_rng=*/false);  // the run layer restored them
    }
    for (auto& p : model_->parameters()) params_.push_back(p);
    // Data parallel: every rank starts from rank 0's weights; gradients are averaged in backward.
    if (rc_.ranks) {
      sync_ = rc_.ranks->join_steps(cfg, params_);
      rc_.log->print(sync_->describe_buckets());
    }
    sched_ = model::LrSchedule{cfg.optimizer.lr, cfg.optimizer.min_lr, cfg.optimizer.warmup_steps, cfg.training.steps};
    step_ = rc_.start_step;
    cursor_ = rc_.start;
    step_cursor_ = rc_.start;
    next_data_step_ = step_data_step_ = rc_.start_data_step;
    autocast_ = cfg.training.dtype == "bf16";
    // Checkpoint snapshots go into buffers allocated now, once (model/checkpoint/snapshot.h).
    if (cfg.checkpoint.every > 0 || cfg.checkpoint.at_end) snapshots_ = std::make_unique<model::SnapshotPool>(model_, opt_.get());
    const auto& g = cfg.training.guard;
    if (g.enabled) {
      guard_ = std::make_unique<model::SpikeGuard>(model::SpikeGuardOptions{g.window, g.z, g.min_steps}, sched_,
                                                   cfg.training.steps, rc_.device);
      guard_->load(watch_.record().detector);
      rc_.log->print(name_ + ": spike guard on: a step whose loss or grad norm is not finite or lies more than " +
                     short_number(g.z) + " deviations above its mean over the last " + std::to_string(g.window) +
                     " steps is skipped; " + std::to_string(g.max_skips) + " in a row roll back to the newest checkpoint (at most " +
                     std::to_string(g.max_rollbacks) + " times)" +
                     (watch_.updates_known() != step_ ? "; " + std::to_string(watch_.updates_known()) + " updates in " +
                                                            std::to_string(step_) + " steps so far"
                                                      : ""));
    }
    rc_.updates.store(watch_.updates_known());
    describe_kernels();
    if (watch_.updates_known() >= cfg.training.steps) finish();
  }

  void process(graph::Item in, graph::Emitter& out) override {
    if (done_) {  // the run has its steps: the input side is not needed
      out.wind_down();
      return;
    }
    if (micro_ == 0) {
      begin_step(out);
      if (done_) return;  // the guard stopped the run
      // Data is skipped by the data step the batch carries (the data order's own count, the same
      // in both orders and across resumes), numbered from 1 as steps are.
      const int64_t data_step = in.get<Batch>().data_step + 1;
      if (data_step != step_ + 1)
        throw std::logic_error("train: a batch of data step " + std::to_string(data_step) + " arrived for step " +
                               std::to_string(step_ + 1) + " (steps count the data read)");
      const bool was_dropping = dropping_;
      dropping_ = watch_.skips_data(data_step);
      if (dropping_ && !was_dropping) announce_dropped(data_step);
    }
    if (dropping_) return drop(in.take<Batch>());
    const auto accum = rc_.cfg.training.grad_accum;
    const bool last_micro_batch = micro_ + 1 == accum;
    if (sync_ && !sync_->before_forward(last_micro_batch, rc_.checkpoint_requests.load())) return stop_with_the_others(out);
    auto b = in.take<Batch>();
    if (!timing_) {
      timing_ = std::make_shared<StepTiming>();
      timing_->stage = name_;
    }
    PhaseClock clock(rc_.device, *timing_, timing_events_);
    torch::Tensor rows = on_device(b);  // (B, T+1) uint16, readable on this thread's stream
    if (graphs_) {
      clock.begin("fwd_bwd", "forward+backward (CUDA graph)");
      graphs_->micro_batch(rows, micro_);
      clock.end();
    } else {
      forward_backward(rows, b, clock, last_micro_batch);
    }
    cursor_ = b.after;
    windows_ += b.windows;  // mod 2^64
    next_data_step_ = b.data_step + 1;
    if (++micro_ < rc_.cfg.training.grad_accum) return;
    micro_ = 0;
    step(out, clock);
  }

  void finalize(graph::Emitter& out) override {
    // Stopped before the last step (Ctrl-C, or the data ran out with loop = false): record where
    // we are so `--resume` continues from here. A partial accumulation is dropped; its batches
    // are read again on resume because the cursor is that of the last completed step.
    out.add_device_wait(callbacks_.wait_all());  // buffers it copied itself (no h2d) are back in the pool
    if (done_) return;
    if (sync_) sync_->end_of_input();  // data parallel: the other ranks stop after this step too
    emit_final_checkpoint(out);
  }

 private:
  void emit_final_checkpoint(graph::Emitter& out) {
    if (!rc_.cfg.checkpoint.at_end || step_ == rc_.start_step) return;
    if (guard_) {  // the snapshot records every verdict, and a streak is acted upon first
      out.add_device_wait(watch_.read(0));
      if (watch_.trip() && !guard_stopped_) act_on_trip(out);
      rc_.updates.store(watch_.updates_known());
    }
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
    finish(&out);
  }

  // Before a step's first micro-batch: at most two steps in flight (this one waits, asleep, for
  // the one before the last); then the verdicts of the steps known to be done: on CUDA every one
  // but the newest (the wait just made sure of the others), on the CPU all. A streak among them
  // rolls back or stops the run here, before this step uses its data.
  void begin_step(graph::Emitter& out) {
    {
      std::optional<NvtxRange> range;
      if (ahead_.pending() >= 2) range.emplace("wait for the step before the last");
      out.add_device_wait(ahead_.before_step());
    }
    if (!guard_) return;
    out.add_device_wait(watch_.read(rc_.device.is_cuda() ? 1 : 0));
    if (watch_.trip() && !act_on_trip(out)) {
      emit_final_checkpoint(out);
      finish(&out);
    }
  }

  // A micro-batch of a data step that is read but not trained on (skip_steps, a rollback's range):
  // its rows are consumed, so the data goes on where a run that trained them would be.
  void drop(Batch b) {
    b.lease.reset();
    cursor_ = b.after;
    next_data_step_ = b.data_step + 1;
    if (++micro_ < rc_.cfg.training.grad_accum) return;
    micro_ = 0;
    ++step_;
    step_cursor_ = cursor_;
    step_data_step_ = next_data_step_;
    rc_.last_step.store(step_);
  }

  // Once per range of dropped steps (and at a resume inside one), from data step `next`.
  void announce_dropped(int64_t next) {
    const StepRange r = watch_.skipped_range(next);
    rc_.log->print(name_ + ": data steps " + range_text({next, r.last}) + " are read but not trained on (" +
                   (watch_.abandoned(next) ? "a rollback's skipped data" : "[training.guard] skip_steps") + ")");
  }

  // A streak of max_skips skipped steps: back to the newest checkpoint from before it, which the
  // weights, the optimizer and the detector are restored from in place (CUDA graphs keep their
  // tensors), while the data goes on; or, when that is not possible, the guard stops the run.
  // Returns false when it stopped it (guard_stopped_). Every rank makes the same decision at the
  // same step: rank 0 picks the checkpoint and hands its state to the others.
  bool act_on_trip(graph::Emitter& out) {
    const SpikeWatch::Trip trip = *watch_.trip();
    const auto& g = rc_.cfg.training.guard;
    const std::string streak = "steps " + range_text({trip.first, trip.last}) + " were skipped in a row (" +
                               describe(trip.verdict) + ")";
    if (!watch_.can_roll_back())
      return stop_for_guard(streak + " after " + std::to_string(watch_.record().rollbacks) + " rollback" +
                            (watch_.record().rollbacks == 1 ? "" : "s") + rolled_back_text() +
                            ", the most [training.guard] max_rollbacks = " + std::to_string(g.max_rollbacks) + " allows");
    auto target = rollback_target(trip.first, out);
    if (!target)
      return stop_for_guard(streak + ", and no checkpoint from before step " + std::to_string(trip.first) +
                            " is left to roll back to (checkpoints come every [checkpoint] every steps, the newest " +
                            "[checkpoint] keep of them kept: keep x every must reach back past max_skips steps)");
    if (snapshots_) snapshots_->order_before_update();  // the last snapshot's copies read the weights
    if (target->state) model::restore(*target->state, model_, opt_.get(), /*restore_rng=*/false);
    if (sync_) {
      auto tensors = params_;
      for (auto& [name, t] : opt_->state()) tensors.push_back(t);
      sync_->broadcast(tensors);
    }
    const int64_t updates_before = watch_.updates_known();
    const StepRange range = watch_.rolled_back(target->step, std::move(target->record), step_);
    guard_->load(watch_.record().detector);
    rc_.updates.store(watch_.updates_known());
    const int64_t k = watch_.record().rollbacks;
    rc_.log->print("guard: " + streak + ": rolling back to the checkpoint of step " + std::to_string(target->step) +
                   (target->path.empty() ? "" : " (" + target->path + ")") + ", rollback " + std::to_string(k) + " of at most " +
                   std::to_string(g.max_rollbacks) + "; updates " + std::to_string(updates_before) + " -> " +
                   std::to_string(watch_.updates_known()) + "; data steps " + range_text(range) +
                   " are skipped (never trained on); training goes on at step " + std::to_string(step_ + 1));
    rc_.log->metric("{\"step\":" + std::to_string(step_) + ",\"event\":\"guard_rollback\",\"guard_rollbacks\":" +
                    std::to_string(k) + ",\"to_step\":" + std::to_string(target->step) + ",\"streak\":" +
                    json_quote(range_text({trip.first, trip.last})) + ",\"skipped_steps\":" + json_quote(range_text(range)) +
                    ",\"updates\":" + std::to_string(watch_.updates_known()) + "}");
    return true;
  }

  struct Target {
    int64_t step = 0;
    std::string path;
    GuardRecord record;
    std::optional<model::CheckpointState> state;  // on the rank that read it
  };

  // The newest checkpoint of a step before `first` that no rollback abandoned and that reads back
  // whole, after the checkpoint stage is done with every snapshot train gave it. With several
  // ranks, rank 0's choice and its guard record, handed to the others (they get the weights by
  // broadcast).
  std::optional<Target> rollback_target(int64_t first, graph::Emitter& out) {
    std::optional<Target> found;
    if (!sync_ || rc_.writer()) {
      if (snapshots_) out.add_device_wait(snapshots_->wait_idle());
      std::vector<std::pair<int64_t, std::filesystem::path>> all;
      {
        std::lock_guard<std::mutex> lock(rc_.mu);
        all = rc_.checkpoints;
      }
      // On disk past the step this run resumed from, only its own count: another run's may be there.
      auto ours = [&](int64_t step) {
        return step <= rc_.start_step || std::find(taken_.begin(), taken_.end(), step) != taken_.end();
      };
      for (auto it = all.rbegin(); it != all.rend() && !found; ++it) {
        if (it->first >= first || watch_.abandoned(it->first) || !ours(it->first)) continue;
        try {
          Target t;
          t.state = model::read_checkpoint(it->second.string());
          t.step = t.state->step;
          t.path = it->second.string();
          t.record = GuardRecord::from_metadata(json_parse(t.state->metadata), t.step, t.path);
          found = std::move(t);
        } catch (const std::exception& e) {
          rc_.log->print("guard: passing over " + it->second.string() + ": " + e.what());
        }
      }
    }
    if (!sync_) return found;
    const std::string key = "guard_rollback/" + std::to_string(watch_.record().rollbacks + 1);
    const std::string shared =
        sync_->share(key, found ? std::to_string(found->step) + "\n{\"guard\":" + found->record.to_json() + "}" : "-");
    if (rc_.writer() || shared == "-") return found;
    const auto nl = shared.find('\n');
    Target t;
    t.step = std::stoll(shared.substr(0, nl));
    t.record = GuardRecord::from_metadata(json_parse(shared.substr(nl + 1)), t.step, "rank 0's rollback");
    return t;
  }

  // The guard gives up: the run ends with a checkpoint ([checkpoint] at_end) and the reason, which
  // `pipeline run` prints last and exits non-zero with.
  bool stop_for_guard(const std::string& why) {
    const std::string msg = why + ". The run stops: its last checkpoint holds the weights from before these steps "
                                  "(a skipped step changes nothing); look at their data, and resume with --resume "
                                  "(raise [training.guard] max_rollbacks, or list the steps in skip_steps)";
    {
      std::lock_guard<std::mutex> lock(rc_.mu);
      rc_.guard_stop = msg;
    }
    rc_.log->error("guard: " + msg);
    rc_.log->metric("{\"step\":" + std::to_string(step_) + ",\"event\":\"guard_stop\",\"guard_rollbacks\":" +
                    std::to_string(watch_.record().rollbacks) + "}");
    guard_stopped_ = true;
    return false;
  }

  std::string rolled_back_text() const {
    std::string out;
    for (const auto& r : watch_.record().rolled_back) out += (out.empty() ? " (data steps skipped: " : ", ") + range_text(r);
    return out.empty() ? out : out + ")";
  }

  static std::string describe(const model::SpikeVerdict& v) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "the last: loss %.4g at z %.1f, grad norm %.4g at z %.1f", static_cast<double>(v.loss),
                  v.loss_z, static_cast<double>(v.norm), v.norm_z);
    return buf;
  }

  // The batch's rows where this thread's stream can read them.
  torch::Tensor on_device(Batch& b) {
#ifdef PIPELINE_HAVE_CUDA
    if (stream_) {
      if (b.ready) {
        // Order h2d's copy before our kernels on the device; the host does not wait.
        b.ready->block(*stream_);
        // The rows were allocated on h2d's stream: keep the allocator from reusing them while this
        // stream may still read them.
        b.rows.record_stream(*stream_);
      } else if (!b.rows.is_cuda()) {
        // No h2d stage: copy here, on this stream, and give the buffer back once the copy is done.
        auto dev = b.rows.to(rc_.device, /*non_blocking=*/true);
        if (b.lease) release_after(std::move(b.lease), *stream_, callbacks_);
        return dev;
      }
    }
#endif
    return b.rows;
  }

  void forward_backward(const torch::Tensor& rows, Batch& b, PhaseClock& clock, bool last_micro_batch) {
    const auto accum = rc_.cfg.training.grad_accum;
    clock.begin("fwd", "forward");
    auto [x, y] = batch_inputs(rows, b.B, b.T);  // (B, T) int64 each, widened on this stream
    b.lease.reset();  // on the CPU the rows have been read: their buffer goes back to pack now
    torch::Tensor loss;
    {
      model::AutocastGuard autocast(rc_.device.type(), autocast_);
      auto logits = model_->forward(x);  // (B, T, V)
      loss = model_->loss(logits, y);    // ()
    }
    if (accum > 1) loss = loss / static_cast<double>(accum);
    clock.end();
    clock.begin("bwd", "backward");
    if (sync_) sync_->before_backward(loss, last_micro_batch);  // all-reduce buckets as gradients fill
    loss.backward();  // outside autocast, as in PyTorch
    clock.end();
    loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss.detach() : loss.detach();
  }

  void step(graph::Emitter& out, PhaseClock& clock) {
    const auto& cfg = rc_.cfg;
    const int64_t total = cfg.training.steps;
    // Without the guard the host knows the updates taken; with it the device does (its table).
    const double lr = guard_ ? std::nan("") : sched_.at(watch_.updates_known());
    torch::Tensor norm;
    StepResult r;
    clock.begin("step", "optimizer step");
    if (snapshots_) snapshots_->order_before_update();  // the last snapshot's copies read the weights
    if (graphs_) {
      std::tie(loss_sum_, norm) = graphs_->update(lr);
    } else {
      norm = model::clip_grad_norm(params_, cfg.training.grad_clip > 0 ? cfg.training.grad_clip : 1e30);  // 1e30: the norm, no clipping
      if (guard_) {
        // Judged on the means over the ranks, so that every rank decides the same.
        if (sync_) {
          sync_->average(loss_sum_, norm, r);
          if (r.reduced) r.reduced->wait();  // Gloo on host tensors; NCCL orders the stream instead
          r.reduced.reset();
        }
        opt_->step(guard_->judge(loss_sum_, norm, *opt_));
      } else {
        opt_->set_lr(lr);
        opt_->step();
      }
      opt_->zero_grad();
    }
    clock.end();
    ++step_;
    step_cursor_ = cursor_;
    step_data_step_ = next_data_step_;
    if (cfg.training.cuda_graph && !graphs_ && step_ - rc_.start_step >= kGraphWarmupSteps)
      graphs_ = std::make_unique<model::CapturedStep>(
          model_, *opt_,
          model::CapturedStepOptions{cfg.training.batch_size, cfg.training.seq_len, cfg.training.grad_accum,
                                     cfg.training.grad_clip, autocast_, guard_.get()});

    r.step = step_;
    r.tokens = cfg.training.batch_size * cfg.training.seq_len * cfg.training.grad_accum * rc_.partition.world;  // all ranks
    r.lr = lr;
    r.cursor = cursor_;
    r.data_step = next_data_step_ - 1;
    r.windows = windows_;
    windows_ = 0;
    r.timing = std::move(timing_);
    if (sync_) sync_->sum_windows(r);  // the step's rows: every rank's
    const bool asked = checkpoint_asked();  // SIGUSR1: this step, whatever the schedule says
    const bool periodic = cfg.checkpoint.every > 0 && step_ % cfg.checkpoint.every == 0;
    if (guard_) {
      issue_verdict(r);
      // Every verdict, waiting, where the host must know them: on the CPU (at once, no wait), before
      // a snapshot, and when this step may take the run's last update.
      const bool may_end = watch_.updates_known() + static_cast<int64_t>(watch_.unread()) >= total;
      if (!rc_.device.is_cuda() || periodic || asked || may_end) out.add_device_wait(watch_.read(0));
      if (watch_.trip()) act_on_trip(out);
    } else {
      if (sync_) sync_->average(loss_sum_, norm, r);  // the logged loss and norm: means over the ranks
      watch_.updated();
      r.updates = watch_.updates_known();
    }
    rc_.updates.store(watch_.updates_known());
    r.rollbacks = watch_.record().rollbacks;
    r.last = guard_stopped_ || (watch_.unread() == 0 && watch_.updates_known() >= total);
    if ((cfg.eval.loss_at(step_, r.last) || cfg.eval.hellaswag_at(step_, r.last)) && rc_.writer()) {
      auto w = std::make_shared<EvalWeights>();
      w->step = step_;
      w->loss = cfg.eval.loss_at(step_, r.last);
      w->hellaswag = cfg.eval.hellaswag_at(step_, r.last);
      torch::NoGradGuard no_grad;
      for (const auto& p : model_->named_parameters()) w->weights.emplace_back(p.key(), p.value().detach().clone());
      r.eval = std::move(w);
    }
    if ((periodic || (r.last && cfg.checkpoint.at_end) || asked) && (!sync_ || sync_->checkpoint_here(step_, step_cursor_))) {
      r.checkpoint = snapshot();
      if (asked) rc_.log->print(name_ + ": checkpoint of step " + std::to_string(step_) + " as asked (SIGUSR1); training goes on");
    }
    if (rc_.device.is_cuda()) {
      // Pooled: the pinned pair and the event come back once log (and eval, checkpoint) let go.
      auto host = pinned_pairs_.take();  // (2) fp32, pinned
      r.loss = host[0];
      r.grad_norm = host[1];
      r.loss.copy_(loss_sum_, /*non_blocking=*/true);
      r.grad_norm.copy_(norm, /*non_blocking=*/true);
      r.done = done_events_.take();
      r.done->record_current(rc_.device);  // after the copies, the eval weight clones and the timing events
      ahead_.issued(r.done);
    } else {
      r.loss = loss_sum_.to(torch::kFloat32);
      r.grad_norm = norm.to(torch::kFloat32);
    }
    loss_sum_ = torch::Tensor();
    r.issued = std::chrono::steady_clock::now();
    rc_.last_step.store(step_);
    if (r.last) finish(&out);
    out.emit(std::move(r));
  }

  // This step's verdict into pinned memory (CUDA: non-blocking, with an event), for log and the watch.
  void issue_verdict(StepResult& r) {
    std::shared_ptr<model::DeviceEvent> ready;
    if (rc_.device.is_cuda()) {
      r.verdict = pinned_verdicts_.take();  // (kFields) float64, pinned
      r.verdict.copy_(guard_->verdict(), /*non_blocking=*/true);
      ready = verdict_events_.take();
      ready->record_current(rc_.device);
    } else {
      r.verdict = guard_->verdict().clone();
    }
    watch_.issued(step_, r.verdict, std::move(ready));
  }

  std::shared_ptr<const model::CheckpointState> snapshot() {
    if (guard_ && watch_.unread() != 0)
      throw std::logic_error("train: a snapshot with " + std::to_string(watch_.unread()) + " verdicts unread");
    // The data order, and in the lanes order K and the step's rows (runner/lane_setup.h reads them back).
    const std::string order = rc_.lanes ? ",\"order\":\"lanes\",\"lanes\":" + std::to_string(rc_.lanes->lanes) +
                                              ",\"rows\":" + std::to_string(rc_.lanes->step_rows)
                                        : std::string(",\"order\":\"documents\"");
    std::string meta = "{\"step\":" + std::to_string(step_) + ",\"data_step\":" + std::to_string(step_data_step_) + order +
                       ",\"cursor\":" + step_cursor_.to_json() +
                       ",\"seed\":" + std::to_string(rc_.cfg.run.seed) + ",\"grad_accum\":" +
                       std::to_string(rc_.cfg.training.grad_accum) + ",\"model\":" + rc_.model.to_json() +
                       ",\"guard\":" + watch_.record().to_json() + "}";
    if (!snapshots_) snapshots_ = std::make_unique<model::SnapshotPool>(model_, opt_.get());
    const auto waited = snapshots_->waited();
    auto state = std::make_shared<model::CheckpointState>(snapshots_->take(step_, std::move(meta)));
    taken_.push_back(step_);
    if (const auto w = snapshots_->waited() - waited; w > std::chrono::milliseconds(1))
      rc_.log->print(name_ + ": waited " + std::to_string(std::chrono::duration<double>(w).count()) +
                     " s for the previous checkpoint to be written before taking the next snapshot");
    return state;
  }

  // Once, at start-up: which attention kernel SDPA takes, and how fp32 matmuls run.
  void describe_kernels() {
    const auto dtype = autocast_ && rc_.device.is_cuda() ? torch::kBFloat16 : torch::kFloat;
    const auto backend = model_->attention_backend(rc_.cfg.training.seq_len, dtype, rc_.device);
    std::string line = name_ + ": attention " + backend + " (" + std::string(c10::toString(dtype)) + ", head_dim " +
                       std::to_string(rc_.model.head_dim()) + "), loss " + model_->loss_path(rc_.device, dtype).why;
    if (rc_.cfg.training.recompute != "none") line += ", recompute " + rc_.cfg.training.recompute;
    if (rc_.device.is_cuda())
      line += ", fp32 matmul precision " + rc_.cfg.training.matmul_precision +
              (rc_.cfg.training.cuda_graph ? ", CUDA graphs after " + std::to_string(kGraphWarmupSteps) + " eager steps" : "");
    rc_.log->print(line);
    if (rc_.device.is_cuda() && autocast_ && backend != "flash_attention" && backend != "cudnn_attention")
      rc_.log->print("warning: " + name_ + ": scaled_dot_product_attention takes the " + backend +
                     " kernel, not flash or cuDNN attention: expect a slower step and more memory");
  }

  // A checkpoint was asked for since the last one we took for such a request: with several
  // ranks, on any rank (they agreed on it before this step, so all checkpoint the same step).
  bool checkpoint_asked() {
    if (sync_) return sync_->take_checkpoint_request();
    const int64_t requests = rc_.checkpoint_requests.load();
    if (requests <= checkpoint_requests_served_) return false;
    checkpoint_requests_served_ = requests;
    return true;
  }

  // The run has its steps. With an emitter, train winds down (the input side stops, and what is
  // in flight towards train is dropped, not drained); built with its steps already done (a
  // resume at the last step), at its first input.
  void finish(graph::Emitter* out = nullptr) {
    if (out) out->wind_down();
    if (sync_) sync_->finish();
    done_ = true;
  }

  RunContext& rc_;
  std::string name_;
  SpikeWatch watch_;                          // the updates taken, skipped data, and the guard's verdicts
  std::unique_ptr<model::SpikeGuard> guard_;  // [training.guard] enabled
  bool dropping_ = false;                     // this data step is read but not trained on
  bool guard_stopped_ = false;
  std::vector<int64_t> taken_;                // steps of the snapshots taken (what a rollback may go back to)
  model::GPT model_{nullptr};
  std::unique_ptr<model::AdamW> opt_;
  std::unique_ptr<model::SnapshotPool> snapshots_;
  std::unique_ptr<model::CapturedStep> graphs_;  // [training] cuda_graph, after the warm-up steps
  std::vector<torch::Tensor> params_;
  model::LrSchedule sched_;
  int64_t step_ = 0, micro_ = 0;
  int64_t checkpoint_requests_served_ = 0;  // RunContext::checkpoint_requests already answered
  bool autocast_ = true, done_ = false;
  torch::Tensor loss_sum_;
  std::shared_ptr<StepTiming> timing_;  // the step being issued
  DataCursor cursor_, step_cursor_;
  // The data step after the last batch taken, and after the last step completed (a checkpoint's).
  int64_t next_data_step_ = 0, step_data_step_ = 0;
  uint64_t windows_ = 0;  // the row hashes of the step's micro-batches so far, summed mod 2^64
  std::unique_ptr<StepSync> sync_;  // data parallel only
  model::HostCallbacks callbacks_;   // pinned buffers given back after train's own copies (no h2d)
  // Per-step objects, reused rather than made and destroyed every step (model/device/reuse_pool.h).
  model::ReusePool<model::DeviceEvent> timing_events_{
      [] { return std::make_shared<model::DeviceEvent>(model::DeviceEvent::Kind::timing); }};
  model::ReusePool<model::DeviceEvent> done_events_{[] { return std::make_shared<model::DeviceEvent>(); }};
  model::TensorReusePool pinned_pairs_{
      [] { return torch::empty({2}, torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(true)); }};
  model::TensorReusePool pinned_verdicts_{[] {
    return torch::empty({model::SpikeVerdict::kFields}, torch::TensorOptions().dtype(torch::kDouble).pinned_memory(true));
  }};
  model::ReusePool<model::DeviceEvent> verdict_events_{[] { return std::make_shared<model::DeviceEvent>(); }};
  model::RunAhead<model::DeviceEvent> ahead_;  // the done events of the steps in flight (CUDA)
#ifdef PIPELINE_HAVE_CUDA
  std::optional<c10::cuda::CUDAStream> stream_;
#endif
};

// Declared, with its options, in stages/catalog.cpp.
PIPELINE_STAGE_IMPL(train, {.name = "train",
                            .input = typeid(Batch),
                            .output = typeid(StepResult),
                            .factory = graph::make_factory<Train>()});

}  // namespace
}  // namespace pipeline::stages
