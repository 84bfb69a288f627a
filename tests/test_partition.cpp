// Data-parallel partition of dataset splits (datasets/plan/partition.h): every rank's readers (text,
// tokens, weighted mix) keep exactly the documents d with d % world == rank, so the ranks together
// read each document of an epoch once; positions resume exactly; bad partitions are refused.
// Resumed on another number of ranks (DataProgress), runs of 2, 3, 1, ... ranks one after the other
// read every token of the epoch once, whatever place inside a document each rank stopped at.
#include <doctest/doctest.h>

#include "test_util.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

#include "datasets/sources/document_mix.h"
#include "datasets/sources/dataset_reader.h"
#include "datasets/prepare/prepare.h"
#include "datasets/tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using namespace pipeline::datasets;
using test_util::contains;
using test_util::error_of;

namespace {

fs::path temp_dir(const std::string& tag) { return test_util::fresh_dir("partition", tag); }

// `count` one-line documents of varied length, cut into several small shards (text, token or
// llm.c shards).
fs::path make_dataset(const std::string& tag, int count, bool tokens, bool llmc = false) {
  auto dir = temp_dir(tag);
  {
    std::ofstream in(dir / "in.txt");
    for (int i = 0; i < count; ++i) {
      in << "document " << i;
      for (int w = 0; w < i % 7; ++w) in << " word" << w;
      in << "\n";
    }
  }
  PrepareOptions o;
  o.out_dir = dir / "data";
  o.tokens = tokens;
  o.llmc = llmc;
  o.rule = DocumentRule::lines;
  o.val_fraction = 0;
  o.shard_size = 300;  // a few dozen bytes of text per document: several shards
  o.threads = 1;
  prepare_dataset({dir / "in.txt"}, o);
  return o.out_dir;
}

DatasetReaderOptions part(uint32_t rank, uint32_t world) { return {.partition = {rank, world}}; }

std::vector<std::string> read_text(const fs::path& dir, DatasetReaderOptions o, DatasetPosition start = {},
                                   size_t limit = SIZE_MAX, DatasetPosition* end = nullptr) {
  TextDatasetReader r;
  r.open(dir, "train", start, /*loop=*/false, o);
  std::vector<std::string> out;
  for (std::string d; out.size() < limit && r.next(d);) out.push_back(d);
  if (end) *end = r.position();
  return out;
}

// The token stream cut into documents at each end-of-text id.
std::vector<std::vector<uint16_t>> split_documents(const std::vector<uint16_t>& stream) {
  std::vector<std::vector<uint16_t>> docs;
  for (uint16_t t : stream) {
    if (t == kShardEotId) docs.emplace_back();
    REQUIRE(!docs.empty());  // every document starts with EOT
    docs.back().push_back(t);
  }
  return docs;
}

std::vector<uint16_t> read_tokens(TokenDatasetReader& r, size_t limit, size_t piece) {
  std::vector<uint16_t> out;
  std::vector<uint16_t> buf(piece);
  while (out.size() < limit) {
    size_t n = r.read(std::span<uint16_t>(buf.data(), std::min(piece, limit - out.size())));
    if (n == 0) break;
    out.insert(out.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n));
  }
  return out;
}

}  // namespace

TEST_CASE("text: each rank reads documents d with d % world == rank, in order; together all, once") {
  auto dir = make_dataset("text", 61, false);
  REQUIRE(Manifest::load(dir).splits.at("train").size() >= 3);  // the rule spans shard boundaries
  auto all = read_text(dir, {});
  REQUIRE(all.size() == 61);
  for (uint32_t world : {2u, 3u, 5u}) {
    size_t total = 0;
    for (uint32_t rank = 0; rank < world; ++rank) {
      std::vector<std::string> expected;
      for (size_t d = rank; d < all.size(); d += world) expected.push_back(all[d]);
      auto got = read_text(dir, part(rank, world));
      CHECK(got == expected);
      total += got.size();
    }
    CHECK(total == all.size());
  }
}

TEST_CASE("text: a partitioned reader resumes exactly from any position it reported") {
  auto dir = make_dataset("text_resume", 40, false);
  auto whole = read_text(dir, part(1, 3));
  for (size_t k : {0u, 1u, 5u, 9u, 13u}) {
    DatasetPosition at;
    auto head = read_text(dir, part(1, 3), {}, k, &at);
    auto tail = read_text(dir, part(1, 3), at);
    head.insert(head.end(), tail.begin(), tail.end());
    CHECK_MESSAGE(head == whole, "split after " << k << " documents, at " << at.str());
  }
}

TEST_CASE("text: looping, a rank sees the same documents every epoch") {
  auto dir = make_dataset("text_loop", 10, false);
  TextDatasetReader r;
  r.open(dir, "train", {}, /*loop=*/true, part(2, 4));
  std::vector<std::string> got;
  for (std::string d; got.size() < 6 && r.next(d);) got.push_back(d);
  auto all = read_text(dir, {});
  CHECK(got == std::vector<std::string>{all[2], all[6], all[2], all[6], all[2], all[6]});
  CHECK(r.position().epoch == 2);
}

TEST_CASE("tokens: each rank keeps the documents it owns, whatever the read sizes; resumes mid-document") {
  auto dir = make_dataset("tokens", 45, true);
  TokenDatasetReader w;
  w.open(dir, "train");
  auto docs = split_documents(read_tokens(w, SIZE_MAX, 4096));
  REQUIRE(docs.size() == 45);
  const uint32_t world = 4;
  size_t total = 0;
  for (uint32_t rank = 0; rank < world; ++rank) {
    std::vector<uint16_t> expected;
    for (size_t d = rank; d < docs.size(); d += world) expected.insert(expected.end(), docs[d].begin(), docs[d].end());
    for (size_t piece : {1u, 7u, 64u, 5000u}) {
      TokenDatasetReader r;
      r.open(dir, "train", {}, false, part(rank, world));
      CHECK_MESSAGE(read_tokens(r, SIZE_MAX, piece) == expected, "rank " << rank << ", pieces of " << piece);
    }
    // Resume at the positions a reader reports after various counts (mid-document included).
    for (size_t k : {1u, 3u, 17u, 40u}) {
      if (k >= expected.size()) continue;
      TokenDatasetReader a;
      a.open(dir, "train", {}, false, part(rank, world));
      auto head = read_tokens(a, k, 5);
      TokenDatasetReader b;
      b.open(dir, "train", a.position(), false, part(rank, world));
      auto tail = read_tokens(b, SIZE_MAX, 9);
      head.insert(head.end(), tail.begin(), tail.end());
      CHECK_MESSAGE(head == expected, "rank " << rank << " resumed after " << k << " tokens at " << a.position().str());
    }
    total += expected.size();
  }
  size_t all_tokens = 0;
  for (const auto& d : docs) all_tokens += d.size();
  CHECK(total == all_tokens);
}

TEST_CASE("mix: draw k goes to rank k % world; resumable from the mix position") {
  auto a = make_dataset("mix_a", 30, false);
  auto b = make_dataset("mix_b", 23, false);
  std::vector<MixSource> sources = {{a, 2.0}, {b, 1.0}};
  MixedDocumentReader whole;
  whole.open(sources, "train", 99);
  std::vector<std::string> all(120);
  for (auto& d : all) whole.next(d);
  for (uint32_t rank = 0; rank < 3; ++rank) {
    MixedDocumentReader r;
    r.open(sources, "train", 99, {}, part(rank, 3));
    std::vector<std::string> got(20);
    for (auto& d : got) r.next(d);
    MixedDocumentReader resumed;
    resumed.open(sources, "train", 99, r.position(), part(rank, 3));
    std::vector<std::string> more(20);
    for (auto& d : more) resumed.next(d);
    got.insert(got.end(), more.begin(), more.end());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == all[rank + 3 * i]);
  }
}

TEST_CASE("bad partitions are refused with the numbers") {
  auto dir = make_dataset("errors", 3, false);
  TextDatasetReader r;
  auto e = error_of([&] { r.open(dir, "train", {}, false, part(2, 2)); });
  CHECK(contains(e, "rank 2 of 2"));
  e = error_of([&] { r.open(dir, "train", {}, false, part(3, 8)); });
  CHECK(contains(e, "holds 3 documents"));
  CHECK(contains(e, "8 data-parallel ranks"));
  CHECK(error_of([&] { r.open(dir, "train", {}, false, part(2, 8)); }).empty());  // rank 2 still gets document 2
}

// ---- Resuming on any number of ranks (DataProgress) --------------------------------------------

namespace {

// One token of the data, named by its document's place and its index in the document.
struct Tok {
  DocKey doc;
  uint64_t token = 0;
  bool operator<(const Tok& o) const {
    if (doc < o.doc) return true;
    if (o.doc < doc) return false;
    return token < o.token;
  }
  bool operator==(const Tok& o) const { return doc == o.doc && token == o.token; }
};

enum class Source { text, tokens, mix };

// The first `limit` tokens of a rank's stream, as pack sees them: text documents tokenized (an
// <|endoftext|> first, as the tokenize stage does), token reads with their marks, and each mark's
// tokens to drop dropped. `mix` reads the mix of `dirs` (infinite: give a limit).
std::vector<Tok> stream(Source kind, const std::vector<fs::path>& dirs, Partition p, size_t limit = SIZE_MAX) {
  std::vector<Tok> out;
  if (kind == Source::tokens) {
    TokenDatasetReader r;
    r.open(dirs[0], "train", {}, /*loop=*/false, {.partition = p});
    std::vector<uint16_t> buf(13);  // small reads: documents span them
    std::vector<DocMark> marks;
    std::optional<Tok> at;
    while (out.size() < limit) {
      marks.clear();
      const size_t n = r.read(buf, &marks);
      if (n == 0) break;
      size_t m = 0;
      for (size_t i = 0; i < n; ++i) {
        for (; m < marks.size() && marks[m].at == i; ++m) {
          CHECK(marks[m].skip == 0);  // token readers drop what earlier runs consumed themselves
          at = Tok{marks[m].key, marks[m].first};
        }
        REQUIRE(at);  // the stream's first token is marked
        out.push_back(*at);
        ++at->token;
      }
    }
  } else {
    const auto& tok = Tokenizer::gpt2();
    TextDatasetReader text;
    MixedDocumentReader mix;
    if (kind == Source::text) {
      text.open(dirs[0], "train", {}, false, {.partition = p});
    } else {
      std::vector<MixSource> sources;
      for (const auto& d : dirs) sources.push_back({d, 1.0 + static_cast<double>(sources.size())});
      mix.open(sources, "train", 5, {}, {.partition = p});
    }
    std::string doc;
    DocMark mark;
    while (out.size() < limit) {
      if (kind == Source::text) {
        if (!text.next(doc, &mark)) break;
      } else {
        mix.next(doc, nullptr, &mark);
      }
      const uint64_t length = 1 + tok.encode_ordinary(doc).size();
      for (uint64_t t = mark.first + mark.skip; t < length && out.size() < limit; ++t) out.push_back({mark.key, t});
    }
  }
  return out;
}

// The place a rank's stream goes on after its first `consumed` tokens, as pack records it.
ProgressLayer layer_after(const std::vector<std::vector<Tok>>& streams, const std::vector<size_t>& consumed) {
  ProgressLayer layer;
  layer.world = static_cast<uint32_t>(streams.size());
  for (size_t r = 0; r < streams.size(); ++r) {
    REQUIRE(consumed[r] < streams[r].size());  // a frontier is a token still to come
    layer.next.push_back({streams[r][consumed[r]].doc, streams[r][consumed[r]].token});
  }
  return layer;
}

// Runs of `worlds[i]` ranks one after the other, each resuming the ones before: every run but the
// last consumes, on rank r, the first take(i, r) tokens of its stream; the last reads its ranks to
// the end. Returns every token read, by every run and rank.
std::vector<Tok> runs(Source kind, const std::vector<fs::path>& dirs, const std::vector<uint32_t>& worlds,
                      const std::function<size_t(size_t, uint32_t)>& take, size_t last_limit = SIZE_MAX) {
  auto done = std::make_shared<DataProgress>();
  std::vector<Tok> all;
  for (size_t i = 0; i < worlds.size(); ++i) {
    const bool last = i + 1 == worlds.size();
    std::vector<std::vector<Tok>> streams;
    std::vector<size_t> consumed;
    for (uint32_t r = 0; r < worlds[i]; ++r) {
      Partition p{r, worlds[i], done->layers.empty() ? nullptr : std::make_shared<const DataProgress>(*done)};
      const size_t k = last ? last_limit : take(i, r);
      streams.push_back(stream(kind, dirs, p, last ? last_limit : k + 1));
      consumed.push_back(std::min(k, streams.back().size()));
      all.insert(all.end(), streams.back().begin(), streams.back().begin() + static_cast<std::ptrdiff_t>(consumed.back()));
    }
    if (!last) done->add(layer_after(streams, consumed));
  }
  return all;
}

std::string describe(const std::vector<uint32_t>& worlds) {
  std::string s;
  for (auto w : worlds) s += (s.empty() ? "" : " -> ") + std::to_string(w);
  return s + " ranks";
}

}  // namespace

TEST_CASE("progress: a document is consumed when a layer's frontier is past it; readers start at the least") {
  DataProgress p;
  auto key = [](uint64_t ordinal) { return DocKey{0, 0, ordinal, ordinal}; };
  p.add({2, false, {{key(6), 3}, {key(3), 0}}});  // rank 0 (even documents) before 6, rank 1 (odd) before 3
  CHECK(p.consumed(key(4)) == DataProgress::kAll);
  CHECK(p.consumed(key(6)) == 3);   // 3 tokens of document 6
  CHECK(p.consumed(key(8)) == 0);
  CHECK(p.consumed(key(1)) == DataProgress::kAll);
  CHECK(p.consumed(key(3)) == 0);
  CHECK(p.consumed(key(5)) == 0);
  CHECK(p.start() == key(3));
  // Three ranks go on from there, each with documents d % 3 == r that the layer before left:
  // rank 0 read 6's last tokens and 9, rank 1 none yet (4 was read before), rank 2 1 token of 5.
  p.add({3, false, {{key(12), 0}, {key(4), 0}, {key(5), 1}}});
  REQUIRE(p.layers.size() == 2);  // the first still says something: document 4 was read
  CHECK(p.consumed(key(4)) == DataProgress::kAll);
  CHECK(p.consumed(key(6)) == DataProgress::kAll);
  CHECK(p.consumed(key(9)) == DataProgress::kAll);
  CHECK(p.consumed(key(5)) == 1);
  CHECK(p.consumed(key(7)) == 0);
  CHECK(p.consumed(key(8)) == 0);
  CHECK(p.start() == key(4));
  // A run past every frontier of both makes them redundant.
  p.add({1, false, {{key(13), 4}}});
  CHECK(p.layers.size() == 1);
  CHECK(p.consumed(key(12)) == DataProgress::kAll);
  CHECK(p.consumed(key(13)) == 4);
  CHECK(contains(error_of([&] { p.add({2, false, {{key(1), 0}}}); }), "a run of 2 ranks with 1 positions"));
}

TEST_CASE("resumed on any number of ranks, the ranks together read every token of the epoch once") {
  auto text = make_dataset("resplit_text", 200, false);
  auto tokens = make_dataset("resplit_tokens", 200, true);
  auto llmc = make_dataset("resplit_llmc", 200, true, /*llmc=*/true);
  // Uneven amounts per rank and run, so that the ranks stop at different places, often inside a
  // document, and a run resumes from places that several runs left behind.
  auto take = [](size_t run, uint32_t rank) { return 23 + 17 * run + 41 * rank + 7 * (run * rank % 3); };
  for (auto [kind, dir] : {std::pair{Source::text, text}, std::pair{Source::tokens, tokens}, std::pair{Source::tokens, llmc}}) {
    auto whole = stream(kind, {dir}, {});
    std::sort(whole.begin(), whole.end());
    REQUIRE(std::adjacent_find(whole.begin(), whole.end()) == whole.end());
    for (const auto& worlds : std::vector<std::vector<uint32_t>>{
             {2, 1}, {2, 3}, {1, 2}, {3, 2}, {2, 3, 1}, {2, 2, 2}, {3, 1, 4, 2}}) {
      auto got = runs(kind, {dir}, worlds, take);
      std::sort(got.begin(), got.end());
      CHECK_MESSAGE(got == whole, dir.parent_path().filename().string() << ", " << describe(worlds) << ": read "
                                                                       << got.size() << " of " << whole.size());
    }
  }
}

TEST_CASE("mix: resumed on any number of ranks, every draw's tokens once and none passed over") {
  auto a = make_dataset("resplit_mix_a", 30, false);
  auto b = make_dataset("resplit_mix_b", 23, false);
  auto take = [](size_t run, uint32_t rank) { return 31 + 19 * run + 29 * rank; };
  for (const auto& worlds : std::vector<std::vector<uint32_t>>{{2, 1}, {2, 3}, {3, 1, 2}}) {
    auto got = runs(Source::mix, {a, b}, worlds, take, /*last_limit=*/4000);
    std::sort(got.begin(), got.end());
    INFO(describe(worlds));
    CHECK(std::adjacent_find(got.begin(), got.end()) == got.end());  // no token twice
    // What one process reads of the mix, as far as the runs' reads reach everywhere: all of it.
    const uint64_t reach = 120;
    auto whole = stream(Source::mix, {a, b}, {}, 8000);
    std::vector<Tok> expected, read;
    for (const auto& t : whole)
      if (t.doc.item < reach) expected.push_back(t);
    for (const auto& t : got)
      if (t.doc.item < reach) read.push_back(t);
    REQUIRE(!expected.empty());
    CHECK(read == expected);
  }
}
