// Where a reader is in a dataset split, in the terms every reader of this project shares (prepared
// shards, llm.c shards, Parquet row groups): an epoch, a shard (or row group) of it, and the items
// (documents or tokens) of that shard consumed. Checkpoints store it as text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace pipeline::datasets {

/// Where a reader is: `item` documents (text) or tokens (tokens) consumed within shard
/// `shard` of the split, in epoch `epoch`. (shard == shard count, item == 0) is the end of an epoch.
struct DatasetPosition {
  uint32_t shard = 0;
  uint64_t item = 0;
  uint64_t epoch = 0;
  /// "epoch=E shard=S item=I"; parse() reads it back (for checkpoints).
  std::string str() const;
  static DatasetPosition parse(std::string_view s);
  bool operator==(const DatasetPosition&) const = default;
};

}  // namespace pipeline::datasets
