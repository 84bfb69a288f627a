// Byte-pair merging and the per-thread piece cache (see tokenizer_bpe.h).
#include "datasets/tokenizer/tokenizer_bpe.h"

#include <bit>
#include <functional>
#include <memory>
#include <queue>
#include <stdexcept>
#include <tuple>

namespace pipeline::datasets::bpe {

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
