// Every rank's stage statistics at rank 0. Ranks other than 0 publish their engine's snapshot in
// the rendezvous store (about once a second, and a final one when their graph ends; the store
// side is runner/rank_store.h); rank 0 reads them and merges them with its own into one Snapshot.
// This half is torch-free (`pipeline stats` shows a data-parallel run's summary with it):
//   - merged: rank 0's stages and queues, then every other rank's stages, each row tagged with its
//     rank (StageStats::rank). This is what stats_summary.json holds for a data-parallel run.
//   - rank_rows(merged): what the summary table shows: rank 0's rows, plus one row per other rank
//     for each device stage (those that own a thread and feed another: pin, h2d, train), named
//     "train@1".
//   - analyze_ranks(merged): the bottleneck verdict of rank 0, unless one rank holds the others
//     back: in a data-parallel step every rank waits for the slowest at the all-reduce, so a rank
//     whose train stage waits for input clearly more than the others' is named, with its own
//     bottleneck ("rank 1: tokenize: busy 100% with 1 worker; ...").
#pragma once

#include <vector>

#include "graph/observe/stats.h"

namespace pipeline::stages {

/// by_rank[r] is rank r's snapshot (an empty one when it never arrived).
graph::Snapshot merge_rank_snapshots(const std::vector<graph::Snapshot>& by_rank);
/// The rows for the summary table and live view (see the file comment).
graph::Snapshot rank_rows(const graph::Snapshot& merged);
/// The verdict for a merged snapshot; a single process's snapshot gets graph::analyze's.
graph::Verdict analyze_ranks(const graph::Snapshot& merged);

}  // namespace pipeline::stages
