// See prometheus.h.
#include "graph/observe/prometheus.h"

#include <cmath>
#include <cstdio>
#include <functional>

namespace pipeline::graph {

std::string prometheus_label(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

namespace {

std::string number(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "+Inf" : "-Inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.10g", x);
  return buf;
}

// One metric family: its HELP and TYPE lines, then one sample per row.
class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  void family(const char* name, const char* type, const char* help) {
    name_ = name;
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  void sample(const std::string& labels, double value) {
    out_ += name_;
    if (!labels.empty()) out_ += "{" + labels + "}";
    out_ += ' ';
    out_ += number(value);
    out_ += '\n';
  }

 private:
  std::string& out_;
  const char* name_ = "";
};

std::string rank_of(int rank) { return std::to_string(rank < 0 ? 0 : rank); }

std::string stage_labels(const StageStats& st) {
  return "stage=\"" + prometheus_label(st.name) + "\",rank=\"" + rank_of(st.rank) + "\"";
}

std::string edge_labels(const QueueStats& q) {
  const std::string producer = q.producers.empty() ? "" : q.producers.front();
  return "edge=\"" + prometheus_label(producer + "->" + q.consumer) + "\",rank=\"0\"";
}

}  // namespace

std::string prometheus_text(const Snapshot& s) {
  std::string out;
  out.reserve(4096 + 1500 * s.stages.size());
  Writer w(out);
  using StageValue = std::function<double(const StageStats&)>;
  auto per_stage = [&](const char* name, const char* type, const char* help, const StageValue& value) {
    w.family(name, type, help);
    for (const auto& st : s.stages) w.sample(stage_labels(st), value(st));
  };
  // A side stage's own figures (the fetch stage's bytes/s, requests in flight, retries, cache
  // bytes, hit rate), one gauge family with the figure as a label.
  bool any_figures = false;
  for (const auto& st : s.stages) any_figures |= !st.figures.empty();
  if (any_figures) {
    w.family("pipeline_stage_figure", "gauge",
             "A side stage's own figures now (fetch: bytes_per_s, in_flight, retries, cache_bytes, hit_rate, ...).");
    for (const auto& st : s.stages)
      for (const auto& [figure, value] : st.figures)
        w.sample(stage_labels(st) + ",figure=\"" + prometheus_label(figure) + "\"", value);
  }
  per_stage("pipeline_stage_busy_seconds_total", "counter",
            "Worker seconds the stage spent on host work for items (device waits apart), summed over its workers.",
            [](const StageStats& st) { return st.busy_s; });
  per_stage("pipeline_stage_device_wait_seconds_total", "counter",
            "Worker seconds the stage slept waiting for the device (a CUDA event), summed over its workers.",
            [](const StageStats& st) { return st.device_wait_s; });
  per_stage("pipeline_stage_starved_seconds_total", "counter",
            "Idle worker seconds with nothing waiting on the stage's input edges.",
            [](const StageStats& st) { return st.starved_s; });
  per_stage("pipeline_stage_blocked_seconds_total", "counter",
            "Idle worker seconds with input waiting but an output edge full.",
            [](const StageStats& st) { return st.blocked_s; });
  per_stage("pipeline_stage_order_wait_seconds_total", "counter",
            "Idle worker seconds with an output edge full of items waiting for their turn in order.",
            [](const StageStats& st) { return st.order_wait_s; });
  per_stage("pipeline_stage_ready_seconds_total", "counter",
            "Idle worker seconds with input waiting and room downstream, but no CPU core free.",
            [](const StageStats& st) { return st.ready_s; });
  per_stage("pipeline_stage_cpu_seconds_total", "counter", "CPU time of the stage's own code.",
            [](const StageStats& st) { return st.cpu_s; });
  per_stage("pipeline_stage_device_busy_seconds_total", "counter",
            "Device (GPU) time spent for the stage; host time of its phases on a CPU run.",
            [](const StageStats& st) { return st.device_busy_s; });
  per_stage("pipeline_stage_items_in_total", "counter", "Items the stage took from its input edges.",
            [](const StageStats& st) { return static_cast<double>(st.items_in); });
  per_stage("pipeline_stage_items_out_total", "counter", "Items the stage emitted.",
            [](const StageStats& st) { return static_cast<double>(st.items_out); });
  per_stage("pipeline_stage_items_discarded_total", "counter", "Items the stage dropped while stopping.",
            [](const StageStats& st) { return static_cast<double>(st.discarded); });
  per_stage("pipeline_stage_workers", "gauge", "Workers (concurrency) of the stage now.",
            [](const StageStats& st) { return static_cast<double>(st.workers); });
  per_stage("pipeline_stage_busy_ratio", "gauge", "Busy share (host work) of the stage's worker time over the last report.",
            [](const StageStats& st) { return st.window_busy; });
  per_stage("pipeline_stage_device_wait_ratio", "gauge",
            "Share of the stage's worker time asleep on the device over the last report.",
            [](const StageStats& st) { return st.window_device_wait; });
  per_stage("pipeline_stage_items_per_second", "gauge", "Items per second through the stage over the last report.",
            [](const StageStats& st) { return st.window_items_per_s; });

  auto per_edge = [&](const char* name, const char* help, const std::function<double(const QueueStats&)>& value) {
    w.family(name, "gauge", help);
    for (const auto& q : s.queues) w.sample(edge_labels(q), value(q));
  };
  per_edge("pipeline_edge_occupancy", "Items in the edge now (between producer and consumer).",
           [](const QueueStats& q) { return static_cast<double>(q.current); });
  per_edge("pipeline_edge_occupancy_mean", "Mean items in the edge over the last report.",
           [](const QueueStats& q) { return q.window_mean; });
  per_edge("pipeline_edge_capacity", "Items the edge may hold.",
           [](const QueueStats& q) { return static_cast<double>(q.capacity); });
  per_edge("pipeline_edge_high_water", "Most items the edge ever held.",
           [](const QueueStats& q) { return static_cast<double>(q.high_water); });

  w.family("pipeline_run_elapsed_seconds", "gauge", "Seconds since the graph started.");
  w.sample("rank=\"0\"", s.t_s);
  w.family("pipeline_run_finished", "gauge", "1 once the graph has ended.");
  w.sample("rank=\"0\"", s.finished ? 1 : 0);

  // The training figures, when the runner adds them (Snapshot::train).
  struct Figure {
    const char* key;
    const char* name;
    const char* help;
    double scale;
    const char* type = "gauge";
  };
  static const Figure figures[] = {
      {"step", "pipeline_train_step", "Optimizer steps completed.", 1},
      {"loss", "pipeline_train_loss", "Training loss of the last logged step.", 1},
      {"val_loss", "pipeline_train_val_loss", "Validation loss of the last evaluation.", 1},
      {"hellaswag_acc_norm", "pipeline_train_hellaswag_acc_norm_ratio",
       "HellaSwag accuracy of the last evaluation that scored it (acc_norm: lowest mean loss).", 1},
      {"hellaswag_acc", "pipeline_train_hellaswag_acc_ratio",
       "HellaSwag accuracy of the last evaluation that scored it (acc: lowest summed loss).", 1},
      {"tokens_per_s", "pipeline_train_tokens_per_second", "Tokens trained per second since the first step.", 1},
      {"ms_per_step", "pipeline_train_step_seconds", "Seconds per optimizer step since the first step.", 1e-3},
      {"mfu", "pipeline_train_mfu_ratio", "Model FLOPs utilization (share of the device's peak).", 1},
      {"device_busy", "pipeline_train_device_busy_ratio",
       "Busy share of the device over the last report (GPU time; host compute time on a CPU run).", 1},
      {"guard_skips", "pipeline_train_guard_skips_total", "Steps the spike guard skipped ([training.guard]).", 1,
       "counter"},
      {"guard_rollbacks", "pipeline_train_guard_rollbacks_total",
       "Rollbacks of the spike guard to an earlier checkpoint ([training.guard]).", 1, "counter"},
  };
  for (const Figure& f : figures) {
    bool have = false;
    double value = 0;
    for (const auto& [key, x] : s.train)
      if (key == f.key) have = true, value = x;
    if (!have) continue;
    w.family(f.name, f.type, f.help);
    w.sample("rank=\"0\"", value * f.scale);
  }

  if (!s.verdict.kind.empty()) {
    w.family("pipeline_bottleneck_info", "gauge",
             "The bottleneck the verdict names (value 1; stage empty when none is named).");
    w.sample("stage=\"" + prometheus_label(s.verdict.stage) + "\",kind=\"" + prometheus_label(s.verdict.kind) +
                 "\",rank=\"0\"",
             1);
  }
  return out;
}

}  // namespace pipeline::graph
