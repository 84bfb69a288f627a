// Byte-pair merging and the vocabulary's hash tables (see tokenizer_bpe.h).
#include "datasets/tokenizer_bpe.h"

#include <bit>
#include <functional>
#include <memory>
#include <queue>
#include <stdexcept>
#include <tuple>

namespace pipeline::datasets::bpe {

void PieceTable::build(const std::string& pool, const std::vector<uint32_t>& offsets, const std::vector<bool>& skip) {
  const size_t n = offsets.size() - 1;
  // Load factor at most 1/4: probes stay short and misses (most multi-token words) end fast.
  const size_t cap = std::bit_ceil(std::max<size_t>(n * 4, 16));
  slots_.assign(cap, no_id);
  mask_ = cap - 1;
  pool_ = pool.data();
  offsets_ = offsets.data();
  for (uint32_t id = 0; id < n; ++id) {
    if (skip[id]) continue;
    const auto* p = reinterpret_cast<const unsigned char*>(pool.data() + offsets[id]);
    size_t i = hash_bytes(p, offsets[id + 1] - offsets[id]) & mask_;
    while (slots_[i] != no_id) i = (i + 1) & mask_;
    slots_[i] = id;
  }
}

void PairTable::reserve(size_t n) {
  const size_t cap = std::bit_ceil(std::max<size_t>(n * 2, 16));
  entries_.assign(cap, Entry{no_id, no_id, no_id});
  mask_ = cap - 1;
  shift_ = 64 - static_cast<unsigned>(std::countr_zero(cap));
  size_ = 0;
}

void PairTable::insert(uint32_t a, uint32_t b, uint32_t merged) {
  if ((size_ + 1) * 2 > entries_.size()) throw std::logic_error("PairTable: insert beyond reserved size");
  if (merged == no_id) throw std::logic_error("PairTable: merged id must not be no_id");
  size_t i = slot_of(a, b);
  while (entries_[i].merged != no_id) {
    if (entries_[i].a == a && entries_[i].b == b) {
      // A pair's concatenation is one byte string, hence one token: this cannot disagree.
      entries_[i].merged = std::min(entries_[i].merged, merged);
      return;
    }
    i = (i + 1) & mask_;
  }
  entries_[i] = Entry{a, b, merged};
  ++size_;
}

PieceCache& thread_piece_cache() {
  // Per thread, so readers never contend; freed when the thread exits.
  thread_local std::unique_ptr<PieceCache> cache;
  if (!cache) cache = std::make_unique<PieceCache>();  // value-initialised: every tag 0
  return *cache;
}

void merge_small(const Vocab& v, const unsigned char* p, size_t n, std::vector<uint32_t>& out) {
  uint32_t tok[small_piece_max];
  uint32_t rank[small_piece_max];  // rank[i]: merge of tok[i] and tok[i + 1]; no_id past the end
  size_t m = n;
  for (size_t i = 0; i < m; ++i) tok[i] = v.byte_id[p[i]];
  for (size_t i = 0; i + 1 < m; ++i) rank[i] = v.byte_pairs[size_t{p[i]} * 256 + p[i + 1]];
  rank[m - 1] = no_id;
  while (m > 1) {
    uint32_t best = no_id;
    size_t bi = 0;
    for (size_t i = 0; i + 1 < m; ++i) {
      if (rank[i] < best) {  // strict: leftmost wins ties
        best = rank[i];
        bi = i;
      }
    }
    if (best == no_id) break;
    tok[bi] = best;
    const size_t tail = m - bi - 2;  // tokens after the absorbed one
    std::memmove(&tok[bi + 1], &tok[bi + 2], tail * sizeof(uint32_t));
    std::memmove(&rank[bi + 1], &rank[bi + 2], tail * sizeof(uint32_t));
    --m;
    rank[bi] = bi + 1 < m ? v.pairs.find(tok[bi], tok[bi + 1]) : no_id;
    if (bi > 0) rank[bi - 1] = v.pairs.find(tok[bi - 1], tok[bi]);
  }
  out.insert(out.end(), tok, tok + m);
}

void merge_large(const Vocab& v, const unsigned char* p, size_t n, std::vector<uint32_t>& out) {
  // A doubly linked list of parts indexed by their first byte, and a min-heap of candidate
  // merges ordered by (rank, position) so that ties go to the leftmost pair, as in the scan.
  // A heap entry is stale once its left part changed; `version` detects that lazily.
  constexpr uint32_t none = no_id;
  std::vector<uint32_t> tok(n), next(n), prev(n), version(n, 0);
  for (size_t i = 0; i < n; ++i) {
    tok[i] = v.byte_id[p[i]];
    next[i] = i + 1 < n ? static_cast<uint32_t>(i + 1) : none;
    prev[i] = i > 0 ? static_cast<uint32_t>(i - 1) : none;
  }
  using Candidate = std::tuple<uint32_t, uint32_t, uint32_t>;  // (rank, left part, its version)
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](uint32_t i) {
    if (i == none || next[i] == none) return;
    const uint32_t r = v.pairs.find(tok[i], tok[next[i]]);
    if (r != no_id) heap.emplace(r, i, version[i]);
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const auto [r, i, ver] = heap.top();
    heap.pop();
    if (version[i] != ver) continue;
    const uint32_t j = next[i];
    tok[i] = r;
    next[i] = next[j];
    if (next[j] != none) prev[next[j]] = i;
    ++version[i];
    ++version[j];  // j is gone; any entry that starts at j is stale
    if (prev[i] != none) ++version[prev[i]];
    push(i);
    push(prev[i]);
  }
  for (uint32_t i = 0; i != none; i = next[i]) out.push_back(tok[i]);
}

}  // namespace pipeline::datasets::bpe
