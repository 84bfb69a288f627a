// The live server of a training run (graph/observe/http_server.h): started from [logging] http or
// `pipeline run --serve`, on rank 0 only, and fed every stats report of the engine; under
// torchrun, with every rank's rows merged in (runner/rank_stats.h) and the verdict that can
// name a straggler rank.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "graph/engine.h"
#include "graph/observe/http_server.h"
#include "runner/rank_session.h"
#include "stages/types.h"

namespace pipeline::stages {

/// Starts the server where `serve` (from --serve; else [logging] http) says, printing its address
/// (and a warning when it is reachable from other machines); null when neither asks for one or
/// this is not rank 0. Throws std::runtime_error when it cannot listen (a port in use).
std::unique_ptr<graph::LiveServer> start_live_server(const RunContext& ctx, const std::string& serve);

/// Publishes the engine's current state now, and each of its reports from now on. `rank` is read
/// at each report: once it holds a session, the other ranks' rows are merged in.
void feed_live_server(graph::LiveServer& server, graph::Engine& engine, std::optional<RankSession>& rank);

}  // namespace pipeline::stages
