// The page that draws a run's stage graph (graph/observe/live_page.html, embedded at build
// time): the stages left to right with their busy share and idle split, the edges with their
// occupancy and a sparkline, the bottleneck outlined with the verdict, the training figures,
// other ranks and the timeline of verdict changes and autotune decisions. One file, with its
// script and style inline and no request to anywhere but the server that sent it.
#pragma once

#include <string>
#include <vector>

#include "graph/observe/stats.h"

namespace pipeline::graph {

/// The live page, as the server sends it: it polls api/snapshot, api/events and api/history.
const std::string& live_page_html();

/// The same page for a finished (or running) run, standing alone: every report of `series`
/// and every event are written into it, and a time slider picks the report shown.
std::string run_page_html(const std::vector<Snapshot>& series, const std::vector<Event>& events,
                          const std::string& title);

}  // namespace pipeline::graph
