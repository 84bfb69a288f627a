// The read stages' side of the lanes order ([data] order = "lanes", docs/data_order.md): the run's
// data order opened over its sources (one, or a weighted mix's), and this rank's lanes read from
// where they start, one chunk at a time from the neediest lane (the one whose supply, what pack
// holds of it plus what is on its way, is smallest: datasets/lanes/lane_demand.h). read_shards
// reads documents (text shards, Parquet, mixes of them) and read_tokens tokens (token shards,
// llm.c) through it; a chunk carries its lane and each piece's place in it, for pack.
//
// Opened when the stage is built, before the graph runs, through the one place a source is opened
// (stages/dry_run.h's open_stage_source, which `pipeline check` opens it with too): a missing or
// bad dataset, data of the other kind, too few units for the lanes, or a checkpoint's cursors that
// are not this data's are errors before training. A fresh run's start cursors are made here and
// handed to pack through the run's LaneSession.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "datasets/lanes/data_order.h"
#include "datasets/lanes/document_lanes.h"
#include "datasets/lanes/token_lanes.h"
#include "datasets/sources/open_source.h"
#include "stages/types.h"

namespace pipeline::stages {

class LaneReader {
 public:
  /// Reads `source` (stages/dry_run.h's source_request: text, or with source.tokens token ids) over
  /// the run's lanes. `stage` names the read stage in errors. Throws (naming the source or stage)
  /// for data that is not of the kind `source` asks for.
  LaneReader(RunContext& rc, datasets::SourceRequest source, const std::string& stage);

  /// Whole documents of the neediest lane, at least one and about `bytes` of text; false once
  /// every lane has ended (only without [data] loop).
  bool next_documents(TextChunk& chunk, size_t bytes);
  /// Up to `tokens` tokens of the neediest lane, in runs of one unit each; false once every lane
  /// has ended.
  bool next_tokens(TokenChunk& chunk, size_t tokens);

  /// Bytes held by the lanes' open units now.
  size_t memory() const;

 private:
  // The neediest lane that has not ended, or nullopt once none is left.
  std::optional<size_t> neediest() const;

  RunContext& rc_;
  LaneSession& session_;
  datasets::DataOrder order_;
  std::optional<datasets::DocumentLanes> documents_;
  std::optional<datasets::TokenLanes> tokens_;
};

/// The least a lane's chunk holds by default: 16,384 tokens (64 KiB of text), the documents order's
/// chunk at 16x1024. Each message costs the input side about the same whatever it carries (the
/// read thread's hand-over, a tokenize and a pack invocation, thread wake-ups): with chunks of a
/// row at 16x1024 (4 KiB of text) bench_input's input side spent half again the CPU a byte that
/// 64 KiB chunks did. Pack then holds up to about 32 KB a lane (16 MB for 512 lanes on a rank).
inline constexpr int64_t kLeastLaneChunkTokens = 16384;
/// What a read stage reads in the lanes order by default, per chunk: about the tokens one lane
/// gives a micro-batch (B x T / this rank's lanes), never under one row of T tokens nor under
/// kLeastLaneChunkTokens. Pack holds about this much per lane.
size_t lane_chunk_tokens(const RunContext& rc);

}  // namespace pipeline::stages
