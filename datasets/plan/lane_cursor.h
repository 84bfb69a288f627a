// Where a lane is, and where a piece of its stream comes from (docs/data_order.md).
//
// A lane reads the units the plan deals it (data_plan.h), one after another, from each of its
// sources (one, or the sources of a weighted mix). Its cursor says where it goes on:
//   - per source, which of the lane's units it is in (n: the lane's n-th unit of that source)
//     and the items of that unit consumed (documents or Parquet rows for text, tokens for tokens);
//   - text: the documents drawn so far (a mix's draws; for one source, its documents), and the
//     tokens of the document in progress already delivered (text cannot be cut at a token, so a
//     resumed lane tokenizes that document again and drops them).
// Resuming a lane from its cursor reopens one unit per source and skips to the item: at most one
// unit read again.
//
// Text form (checkpoints store it as a JSON string), one line, every key required:
//   "lane=3 draws=17 tokens=5 units=12,0 items=40,0"   (units and items: one per source)
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"

namespace pipeline::datasets {

/// A lane's place in one source: its n-th unit, and the items of that unit consumed.
struct SourceCursor {
  uint64_t unit = 0;
  uint64_t item = 0;
  bool operator==(const SourceCursor&) const = default;
};

struct LaneCursor {
  uint32_t lane = 0;
  uint64_t draws = 0;                 // text: documents drawn before the one in progress
  uint64_t tokens = 0;                // text: tokens of the document in progress already delivered
  std::vector<SourceCursor> sources;  // one per source

  /// The cursor of a lane that has read nothing.
  static LaneCursor start(uint32_t lane, size_t sources);
  /// "lane=L draws=D tokens=T units=N0,N1 items=I0,I1"
  std::string str() const;
  /// Throws DatasetError naming the key (and what it found) for text that is not a cursor.
  static LaneCursor parse(std::string_view text);
  bool operator==(const LaneCursor&) const = default;
};

/// Where a piece of a lane's stream starts (a document, or a run of a unit's tokens): what a
/// consumer needs to say where the lane goes on after any of its tokens (lane_rows.h).
struct LanePlace {
  uint64_t draw = 0;    // text: the document's draw (documents the lane drew before it)
  uint32_t source = 0;  // the source it comes from (a mix's index; 0 otherwise)
  uint64_t unit = 0;    // the lane's n-th unit of that source
  uint64_t item = 0;    // text: the document's item in the unit (Parquet: its row, nulls counted);
                        // tokens: the offset in the unit of the piece's first token
  uint64_t token = 0;   // text: the tokens of the document to drop (delivered before a resume)
  bool operator==(const LanePlace&) const = default;
};

/// Every lane's cursor, as a checkpoint holds them: {"lanes": K, "cursors": ["lane=0 ...", ...]}.
std::string lane_cursors_to_json(std::span<const LaneCursor> cursors, uint32_t lanes);
/// Reads what lane_cursors_to_json wrote: K, and exactly one cursor per lane 0..K-1 (in any
/// order; the result is ordered by lane, so cursor l is lane l's), each with `sources` sources.
/// Throws DatasetError naming the field.
std::vector<LaneCursor> lane_cursors_from_json(const JsonValue& v, size_t sources);

}  // namespace pipeline::datasets
