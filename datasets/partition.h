// Data-parallel partition of a dataset split: which documents one rank of a torchrun job reads.
//
// The rule: documents are numbered in read order across the split's shards (the manifest's shard
// order, then the order inside each shard), and document d belongs to rank d % world. Every rank
// reads (decompresses) the whole split and keeps its own documents, so the assignment needs no
// index, is the same every epoch, depends only on the split and the world size, and the ranks
// together read each document of an epoch exactly once. Round-robin by document (rather than by
// shard) keeps the ranks' shares within one document of each other even when a split has a single
// shard, at the price of every rank decompressing what the others keep (zstd decompresses far
// faster than BPE tokenizes).
//
// The readers in dataset_reader.h and dataset_mix.h apply a partition given in their options; a
// weighted mix partitions its draws instead (draw k belongs to rank k % world).
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace pipeline::datasets {

struct Partition {
  uint32_t rank = 0;   // this reader's rank, in [0, world)
  uint32_t world = 1;  // ranks reading the split together (1: the whole split)

  bool whole() const { return world <= 1; }
  bool owns(uint64_t index) const { return world <= 1 || index % world == rank; }
  /// "rank 1 of 4"
  std::string str() const;
  /// Throws DatasetError unless world >= 1 and rank < world.
  void check() const;
};

/// Keeps the tokens of a partition's documents from a token stream in which every document starts
/// with the end-of-text id (the token shard layout, and llm.c's). Feed consecutive pieces of one
/// shard's stream; the filter remembers which document the next token belongs to.
///
/// Example (tokens of shard s, whose first document has global index first_doc[s]):
///   TokenDocumentFilter f(partition, first_doc[s]);
///   size_t kept = f.filter(piece, out);  // out has room for piece.size() ids
class TokenDocumentFilter {
 public:
  TokenDocumentFilter() = default;
  /// `first_document`: global index of the document the stream's first end-of-text id starts.
  TokenDocumentFilter(Partition p, uint64_t first_document, uint16_t eot = 50256)
      : p_(p), next_document_(first_document), eot_(eot) {}
  /// Copies the owned tokens of `in` to `out` (room for in.size() ids; may alias in's storage
  /// from its start) in order; returns how many were kept.
  size_t filter(std::span<const uint16_t> in, uint16_t* out);
  /// Global index of the document the next end-of-text id starts.
  uint64_t next_document() const { return next_document_; }

 private:
  Partition p_;
  uint64_t next_document_ = 0;
  bool owned_ = false;  // the current document (tokens before the first EOT belong to none)
  uint16_t eot_ = 50256;
};

}  // namespace pipeline::datasets
