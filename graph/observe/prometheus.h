// The Prometheus text exposition format (version 0.0.4) of a stats snapshot, for `/metrics` of
// the live server (graph/observe/http_server.h). Names follow Prometheus' conventions: a
// `pipeline_` prefix, base units (seconds), counters ending in `_total`, ratios in `_ratio`.
// Every series carries `rank` (0 for a single process); per-stage series carry `stage`, per-edge
// series `edge` ("producer->consumer"). For example:
//   pipeline_stage_busy_seconds_total{stage="tokenize",rank="0"} 12.5
//   pipeline_edge_occupancy{edge="tokenize->pack",rank="0"} 7
#pragma once

#include <string>

#include "graph/observe/stats.h"

namespace pipeline::graph {

/// The snapshot as Prometheus text: counters of worker seconds (busy: host work; device wait;
/// starved, blocked, order wait, ready), CPU and device seconds and items in/out/discarded per stage; gauges of workers,
/// each edge's occupancy, capacity and high-water mark, the run's elapsed time, the training
/// figures (Snapshot::train) and the bottleneck the verdict names.
std::string prometheus_text(const Snapshot& s);

/// A label value escaped as the format wants it (backslash, double quote and newline).
std::string prometheus_label(const std::string& value);

}  // namespace pipeline::graph
