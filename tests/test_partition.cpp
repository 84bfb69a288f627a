// Data-parallel partition of dataset splits (datasets/partition.h): every rank's readers (text,
// tokens, weighted mix) keep exactly the documents d with d % world == rank, so the ranks together
// read each document of an epoch once; positions resume exactly; bad partitions are refused.
#include <doctest/doctest.h>

#include "test_util.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "datasets/document_mix.h"
#include "datasets/dataset_reader.h"
#include "datasets/prepare.h"

namespace fs = std::filesystem;
using namespace pipeline::datasets;
using test_util::contains;
using test_util::error_of;

namespace {

fs::path temp_dir(const std::string& tag) { return test_util::fresh_dir("partition", tag); }

// `count` one-line documents of varied length, cut into several small shards.
fs::path make_dataset(const std::string& tag, int count, bool tokens) {
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
