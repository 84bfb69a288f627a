// Data-parallel partition of a dataset split: which documents one rank of a torchrun job reads,
// and, after a resume, which of them (and which of their tokens) are left to read.
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
// Resuming, on any number of ranks: a checkpoint records where each rank's stream goes on, as a
// place in the documents every rank numbers alike (a Frontier: document and token). The ranks of
// one run together form a ProgressLayer: rank r consumed its documents before its frontier. What
// every earlier run consumed is a DataProgress (its layers, intersected), and a resumed run deals
// out the rest by the same rule, on its own world size: rank r keeps document d when d % world ==
// r and d is not consumed whole, and drops the tokens of d consumed before (a document a rank was
// in the middle of). So the ranks of the runs before and after read each token of an epoch once,
// whatever the world sizes were.
//
// The readers in dataset_reader.h, llmc_reader.h, parquet_reader.h and document_mix.h apply a
// partition given in their options; a weighted mix partitions its draws instead (draw k belongs to
// rank k % world), and Parquet with at least as many row groups as ranks deals row groups.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace pipeline::datasets {

/// A document's place in its source's order, the same on every rank. Documents are ordered by
/// (epoch, shard, item).
struct DocKey {
  uint64_t epoch = 0;
  uint32_t shard = 0;    // the split's shard; Parquet: the row group's place in the epoch's order; mix: 0
  uint64_t item = 0;     // text: document index in the shard; tokens: offset of its first token in
                         // the shard; Parquet: row in the row group; mix: the draw
  uint64_t ordinal = 0;  // the number partitions deal by: document number in the split (llm.c: in
                         // its shard), Parquet: row number in the epoch's order; mix: the draw
  bool operator<(const DocKey& o) const { return std::tie(epoch, shard, item) < std::tie(o.epoch, o.shard, o.item); }
  bool operator==(const DocKey& o) const { return !(*this < o) && !(o < *this); }
  /// "epoch=E shard=S item=I"
  std::string str() const;
};

/// Where a rank's stream goes on: token `token` of document `doc`, counted from the document's
/// start (its <|endoftext|> included).
struct Frontier {
  DocKey doc;
  uint64_t token = 0;
  bool operator==(const Frontier& o) const { return doc == o.doc && token == o.token; }
};

/// The ranks of one run, at a checkpoint: rank r was dealt the documents whose ordinal (by_shard:
/// whose shard) is r modulo `world`, and had consumed every one of them before next[r], and the
/// first next[r].token tokens of next[r]'s document.
struct ProgressLayer {
  uint32_t world = 1;
  bool by_shard = false;
  std::vector<Frontier> next;  // one per rank
};

/// What the runs a training resumes consumed of the data: a document's tokens are consumed if
/// any layer says so.
struct DataProgress {
  static constexpr uint64_t kAll = UINT64_MAX;
  std::vector<ProgressLayer> layers;  // oldest first

  /// Tokens of the document consumed already, from its start: 0, a count, or kAll (all of it).
  uint64_t consumed(const DocKey& doc) const;
  /// The first document that may hold tokens not consumed yet: where readers start.
  DocKey start() const;
  /// Adds the newest run's layer and drops the older ones it implies (every frontier of theirs
  /// lies before all of the new one's). Throws DatasetError unless it has `world` frontiers.
  void add(ProgressLayer layer);
};

/// A document in a stream of chunks: it starts at `at` (text: its index in the chunk; tokens: the
/// index of its first token delivered) with token `first` of the document, and the consumer drops
/// `skip` tokens from there (text documents that an earlier run began: the reader cannot cut text
/// at a token).
struct DocMark {
  uint32_t at = 0;
  DocKey key;
  uint64_t first = 0;
  uint64_t skip = 0;
  bool by_shard = false;  // the partition dealt whole shards (Parquet row groups)
};

struct Partition {
  Partition() = default;
  Partition(uint32_t r, uint32_t w, std::shared_ptr<const DataProgress> d = nullptr)
      : rank(r), world(w), done(std::move(d)) {}

  uint32_t rank = 0;   // this reader's rank, in [0, world)
  uint32_t world = 1;  // ranks reading the split together (1: the whole split)
  /// What earlier runs consumed (resume); null: nothing.
  std::shared_ptr<const DataProgress> done;

  bool whole() const { return world <= 1; }
  /// Neither shared with other ranks nor resumed: every document, whole.
  bool everything() const { return world <= 1 && !done; }
  bool owns(uint64_t index) const { return world <= 1 || index % world == rank; }
  /// A document dealt by `deal` (its ordinal, or its shard): DataProgress::kAll when this rank does
  /// not read it (another rank's, or consumed whole), else the tokens to drop from its start.
  uint64_t take(const DocKey& doc, uint64_t deal) const {
    if (!owns(deal)) return DataProgress::kAll;
    return done ? done->consumed(doc) : 0;
  }
  /// "rank 1 of 4"
  std::string str() const;
  /// Throws DatasetError unless world >= 1 and rank < world.
  void check() const;
};

/// Keeps the tokens of a partition's documents from a token stream in which a document starts at
/// each end-of-text id (the token shard layout, and llm.c's) and at the stream's first token. Feed
/// consecutive pieces of one shard's stream; the filter remembers which document the next token
/// belongs to, and drops the tokens that earlier runs consumed.
///
/// Example (tokens of shard s from its start, whose first document is number first_doc[s]):
///   TokenDocumentFilter f(partition, {.epoch = e, .shard = s, .item = 0, .ordinal = first_doc[s]});
///   size_t kept = f.filter(piece, out, &marks);  // out has room for piece.size() ids
class TokenDocumentFilter {
 public:
  TokenDocumentFilter() = default;
  /// `first`: the document the stream's first token starts (item: that token's offset in the shard).
  TokenDocumentFilter(Partition p, DocKey first, uint16_t eot = 50256)
      : p_(std::move(p)), next_(first), raw_(first.item), eot_(eot) {}
  /// Copies the kept tokens of `in` to `out` (room for in.size() ids; may alias in's storage from
  /// its start) in order, and appends to `marks` (when given) one mark per kept document that
  /// starts in `in` (`at`: the index in `out` of its first kept token); returns how many were kept.
  size_t filter(std::span<const uint16_t> in, uint16_t* out, std::vector<DocMark>* marks = nullptr);
  /// The document the next token belongs to, as a mark at 0 when it is kept: for a stream that
  /// continues after tokens were filtered without being delivered (skipped to a position).
  std::optional<DocMark> continuation() const;

 private:
  Partition p_;
  DocKey next_;            // the next document to start (its item is set when it starts)
  uint64_t raw_ = 0;       // offset in the shard of the next token
  DocKey doc_;             // the current document
  uint64_t token_ = 0;     // its token that the next token is
  uint64_t drop_ = 0;      // its tokens still to drop (consumed by an earlier run)
  bool started_ = false;   // a document has started (the first token starts one, whatever it is)
  bool owned_ = false;     // the current document is kept
  uint16_t eot_ = 50256;
};

}  // namespace pipeline::datasets
