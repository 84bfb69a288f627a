// The Parquet document reader (datasets/parquet/parquet_reader.h) on files written by pyarrow
// (tests/parquet/make_files.py, run with set-up's venv): every codec, row groups empty and not,
// nulls, both string types; the errors for a missing or non-string column, a corrupt footer, a
// truncated file and a corrupt row group; exact resume; ranks disjoint and complete; shuffling;
// a weighted mix with text shards; the source forms (file, directory, glob, hub snapshot); resumed
// on another number of ranks (datasets/plan/partition.h), every document once; Arrow's module
// (datasets/parquet/parquet_module.h): its errors caught by type, and one that does not load.
// Exits 77 (CTest: skipped) when no Python with pyarrow is configured (PIPELINE_ARROW_PYTHON).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "datasets/sources/document_mix.h"
#include "datasets/sources/dataset_reader.h"
#include "datasets/parquet/parquet_module.h"
#include "datasets/parquet/parquet_reader.h"
#include "datasets/prepare/prepare.h"
#include "parquet_files.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace pipeline::datasets;
using test_util::contains;
using test_util::error_of;

namespace {

const fs::path& files() { return parquet_files::dir("test_parquet"); }

std::string doc(int i) { return parquet_files::doc(i); }

std::vector<std::string> read_all(const fs::path& source, ParquetReaderOptions o = {}, ParquetDocumentReader* keep = nullptr) {
  ParquetDocumentReader local;
  ParquetDocumentReader& r = keep ? *keep : local;
  r.open(source, {}, false, o);
  std::vector<std::string> out;
  for (std::string d; r.next(d);) out.push_back(d);
  return out;
}

ParquetReaderOptions in_order() {
  ParquetReaderOptions o;
  o.shuffle = false;
  return o;
}

std::vector<std::string> docs(int first, int count) {
  std::vector<std::string> v;
  for (int i = first; i < first + count; ++i) v.push_back(doc(i));
  return v;
}

}  // namespace

TEST_CASE("every codec reads back every document in order") {
  for (const char* codec : {"snappy", "zstd", "none"}) {
    CAPTURE(codec);
    ParquetDocumentReader r;
    CHECK(read_all(files() / (std::string(codec) + ".parquet"), in_order(), &r) == docs(0, 1000));
    CHECK(r.row_groups() == 10);
    CHECK(r.rows() == 1000);
    CHECK(r.nulls_skipped() == 0);
    CHECK(r.documents_read() == 1000);
  }
}

TEST_CASE("an empty row group, nulls, large_string, dictionaries and string_view") {
  ParquetDocumentReader r;
  std::vector<std::string> want;
  for (int i = 0; i < 105; ++i)
    if (i % 7 != 3) want.push_back(doc(i));
  CHECK(read_all(files() / "layout.parquet", in_order(), &r) == want);
  CHECK(r.row_groups() == 3);  // 40, 0, 40, 25 rows: the empty one takes no place in the order
  CHECK(r.rows() == 105);
  CHECK(r.nulls_skipped() == 15);
  // Shuffled, the empty row group is somewhere in the order: the same documents come out.
  auto shuffled = read_all(files() / "layout.parquet", {.seed = 5});
  CHECK(std::multiset<std::string>(shuffled.begin(), shuffled.end()) == std::multiset<std::string>(want.begin(), want.end()));

  ParquetDocumentReader large;
  CHECK(read_all(files() / "large.parquet", in_order(), &large) == docs(0, 100));
  CHECK(large.row_groups() == 4);
  // The other ways Arrow writes text: a dictionary of strings, string_view.
  CHECK(read_all(files() / "dict.parquet", in_order()) == docs(0, 100));
  CHECK(read_all(files() / "view.parquet", in_order()) == docs(0, 100));
  // Small decode batches and a read-ahead bound below one batch change nothing but memory.
  auto o = in_order();
  o.batch_rows = 7;
  o.read_ahead_bytes = 1;
  CHECK(read_all(files() / "zstd.parquet", o) == docs(0, 1000));
}

TEST_CASE("errors name the file, the column and the row group") {
  const fs::path content = files() / "content.parquet";
  std::string e = error_of([&] { read_all(content); });
  CHECK(contains(e, content.string()));
  CHECK(contains(e, "no column \"text\""));
  CHECK(contains(e, "content, id"));
  CHECK(read_all(content, {.column = "content"}) == docs(0, 10));
  e = error_of([&] { read_all(content, {.column = "id"}); });
  CHECK(contains(e, "column \"id\" holds int64, expected text (string, large_string, string_view, or a dictionary"));
  e = error_of([&] { read_all(files() / "int_text.parquet"); });
  CHECK(contains(e, (files() / "int_text.parquet").string()));
  CHECK(contains(e, "holds int64"));

  test_util::TempDir tmp("parquet_bad");
  const std::string good = test_util::read_file(files() / "zstd.parquet");
  // Corrupt footer: the metadata before the closing length and magic.
  std::string bad = good;
  for (size_t i = bad.size() - 60; i < bad.size() - 8; ++i) bad[i] = static_cast<char>(0xA5);
  test_util::write_file(tmp / "footer.parquet", bad);
  e = error_of([&] { read_all(tmp / "footer.parquet"); });
  CHECK(contains(e, (tmp / "footer.parquet").string()));
  CHECK(contains(e, "not a readable Parquet file"));
  // Truncated: the footer is gone.
  test_util::write_file(tmp / "truncated.parquet", good.substr(0, good.size() / 2));
  e = error_of([&] { read_all(tmp / "truncated.parquet"); });
  CHECK(contains(e, (tmp / "truncated.parquet").string()));
  CHECK(contains(e, "not a readable Parquet file"));
  // Not Parquet at all, and empty.
  test_util::write_file(tmp / "text.parquet", "just some text, no magic here\n");
  CHECK(contains(error_of([&] { read_all(tmp / "text.parquet"); }), "not a readable Parquet file"));
  test_util::write_file(tmp / "empty.parquet", "");
  CHECK(contains(error_of([&] { read_all(tmp / "empty.parquet"); }), (tmp / "empty.parquet").string()));

  // A corrupt column chunk in row group 1 of a file with page checksums: the documents of row
  // group 0 come out, then an error naming the file and row group 1.
  std::ifstream where(files() / "checksums.parquet.rg1");
  size_t offset = 0, bytes = 0;
  where >> offset >> bytes;
  REQUIRE(bytes > 64);
  bad = test_util::read_file(files() / "checksums.parquet");
  for (size_t i = offset + bytes / 2; i < offset + bytes / 2 + 16; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5A);
  test_util::write_file(tmp / "rg1.parquet", bad);
  ParquetDocumentReader r;
  r.open(tmp / "rg1.parquet", {}, false, in_order());
  std::vector<std::string> got;
  e = error_of([&] {
    for (std::string d; r.next(d);) got.push_back(d);
  });
  CHECK(got == docs(0, 100));
  CHECK(contains(e, (tmp / "rg1.parquet").string() + ": row group 1"));

  // Nothing there.
  CHECK(contains(error_of([&] { read_all(tmp / "missing.parquet"); }), "no such file"));
  CHECK(contains(error_of([&] { read_all(tmp / "*.nothing.parquet"); }), "matches no Parquet file"));
}

TEST_CASE("Arrow's module: its errors arrive as DatasetError, and one that does not load says why") {
  // Thrown inside libpipeline_parquet.so, caught here by type (not only as std::exception).
  test_util::TempDir tmp("parquet_module");
  const std::string good = test_util::read_file(files() / "zstd.parquet");
  test_util::write_file(tmp / "truncated.parquet", good.substr(0, good.size() / 2));
  std::string caught;
  try {
    read_all(tmp / "truncated.parquet");
  } catch (const DatasetError& e) {
    caught = e.what();
  }
  CHECK(contains(caught, (tmp / "truncated.parquet").string() + ": not a readable Parquet file"));
  caught.clear();
  try {
    read_parquet_buffer(std::string_view(good).substr(0, good.size() / 2), "buffer.parquet");
  } catch (const DatasetError& e) {
    caught = e.what();
  }
  CHECK(contains(caught, "buffer.parquet: not a readable Parquet file"));

  // Each path tried, with the loader's reason; never a crash.
  test_util::write_file(tmp / "not_a_library.so", "not ELF\n");
  const std::vector<fs::path> candidates = {tmp / "missing.so", tmp / "not_a_library.so"};
  CHECK_THROWS_AS(load_parquet_module(candidates, "some.parquet"), DatasetError);
  const std::string e = error_of([&] { load_parquet_module(candidates, "some.parquet"); });
  CHECK(contains(e, "some.parquet: reading Parquet needs Arrow C++ through libpipeline_parquet.so"));
  CHECK(contains(e, (tmp / "missing.so").string() + ": "));
  CHECK(contains(e, "No such file"));
  CHECK(contains(e, (tmp / "not_a_library.so").string() + ": "));
}

TEST_CASE("sources: a file, a directory, a glob, a hub snapshot") {
  test_util::TempDir tmp("parquet_src");
  fs::create_directories(tmp / "dir/sub");
  fs::create_directories(tmp / "dir/.cache");
  fs::copy_file(files() / "single.parquet", tmp / "dir/b.parquet");
  fs::copy_file(files() / "large.parquet", tmp / "dir/sub/a.parquet");
  fs::copy_file(files() / "zstd.parquet", tmp / "dir/.cache/hidden.parquet");
  test_util::write_file(tmp / "dir/notes.txt", "not parquet");
  CHECK(is_parquet_source(tmp / "dir"));
  CHECK(is_parquet_source(files() / "single.parquet"));
  CHECK(is_parquet_source(tmp / "dir/*.parquet"));
  CHECK_FALSE(is_parquet_source(tmp / "dir/notes.txt"));
  CHECK_FALSE(is_parquet_source(tmp / "nowhere"));
  auto listed = list_parquet_files(tmp / "dir");
  REQUIRE(listed.size() == 2);  // sorted by path; hidden directories skipped
  CHECK(listed[0] == tmp / "dir/b.parquet");
  CHECK(listed[1] == tmp / "dir/sub/a.parquet");
  auto all = docs(0, 10);
  auto more = docs(0, 100);
  all.insert(all.end(), more.begin(), more.end());
  CHECK(read_all(tmp / "dir", in_order()) == all);
  CHECK(read_all(tmp / "dir/*.parquet", in_order()) == docs(0, 10));
  // The hub's layout: data/<config>/*.parquet beside a README.
  ParquetDocumentReader hub;
  CHECK(read_all(files() / "hub", in_order(), &hub) == docs(0, 100));
  CHECK(hub.files().size() == 2);
  CHECK(hub.row_groups() == 6);
  // A prepared dataset is not Parquet.
  fs::create_directories(tmp / "prepared");
  test_util::write_file(tmp / "prepared/manifest.json", "{}");
  fs::copy_file(files() / "single.parquet", tmp / "prepared/x.parquet");
  CHECK_FALSE(is_parquet_source(tmp / "prepared"));
}

TEST_CASE("shuffled row groups: a new order each epoch, the same for a seed, every document once") {
  const fs::path src = files() / "zstd.parquet";
  auto first_rows = [](const std::vector<std::string>& v) {  // document index at each row group's start
    std::vector<std::string> heads;
    for (size_t i = 0; i < v.size(); i += 100) heads.push_back(v[i]);
    return heads;
  };
  ParquetDocumentReader r;
  r.open(src, {}, /*loop=*/true, {.seed = 7});
  std::vector<std::string> e0, e1;
  std::string d;
  for (auto* epoch : {&e0, &e1})
    for (int i = 0; i < 1000; ++i) {
      REQUIRE(r.next(d));
      epoch->push_back(d);
    }
  CHECK(r.position().epoch == 1);
  auto sorted = [](std::vector<std::string> v) { return std::multiset<std::string>(v.begin(), v.end()); };
  CHECK(sorted(e0) == sorted(docs(0, 1000)));
  CHECK(sorted(e1) == sorted(docs(0, 1000)));
  CHECK(first_rows(e0) != first_rows(docs(0, 1000)));
  CHECK(first_rows(e0) != first_rows(e1));
  // Rows keep their order inside a row group.
  for (size_t g = 0; g < 10; ++g) {
    const int head = std::stoi(e0[g * 100].substr(9));
    CHECK(head % 100 == 0);
    for (int i = 1; i < 100; ++i) REQUIRE(e0[g * 100 + static_cast<size_t>(i)] == doc(head + i));
  }
  CHECK(read_all(src, {.seed = 7}) == e0);
  CHECK(read_all(src, {.seed = 8}) != e0);
}

TEST_CASE("a reader resumed at position() continues exactly, across row groups and epochs") {
  const fs::path src = files() / "layout.parquet";  // nulls and an empty row group
  std::vector<std::string> reference;
  std::vector<DatasetPosition> before;  // the position before each document
  {
    ParquetDocumentReader r;
    r.open(src, {}, /*loop=*/true, {.seed = 3, .batch_rows = 16});
    std::string d;
    for (int i = 0; i < 400; ++i) {
      before.push_back(r.position());
      REQUIRE(r.next(d));
      reference.push_back(d);
    }
  }
  for (size_t k : {0, 1, 15, 16, 17, 39, 40, 89, 90, 91, 200, 271, 399}) {
    CAPTURE(k);
    ParquetDocumentReader first;
    first.open(src, {}, true, {.seed = 3, .batch_rows = 16});
    std::string d;
    for (size_t i = 0; i < k; ++i) REQUIRE(first.next(d));
    const DatasetPosition p = first.position();
    CAPTURE(p.str());
    CHECK(first.describe(p).find("layout.parquet row group ") != std::string::npos);
    ParquetDocumentReader resumed;
    resumed.open(src, p, true, {.seed = 3, .batch_rows = 16});
    for (size_t i = k; i < std::min<size_t>(k + 120, reference.size()); ++i) {
      REQUIRE(resumed.next(d));
      REQUIRE(d == reference[i]);
    }
    // A position taken before a document resumes at that document.
    ParquetDocumentReader again;
    again.open(src, before[k], true, {.seed = 3});
    REQUIRE(again.next(d));
    CHECK(d == reference[k]);
  }
  ParquetDocumentReader r;
  CHECK(contains(error_of([&] { r.open(src, DatasetPosition{9, 0, 0}); }), "past the end of the epoch"));
  CHECK(contains(error_of([&] { r.open(src, DatasetPosition{0, 1000, 0}, false, in_order()); }),
                 "past the end of " + src.string() + " row group 0, which has 40 rows"));
}

TEST_CASE("data-parallel ranks are disjoint and together read every document once per epoch") {
  // 10 row groups: split by row group (3 ranks: 4, 3 and 3 of them). One row group, or three
  // non-empty ones for four ranks: by row.
  for (const auto& [file, world] : std::vector<std::pair<std::string, uint32_t>>{
           {"zstd.parquet", 2}, {"zstd.parquet", 3}, {"single.parquet", 2}, {"single.parquet", 3}, {"layout.parquet", 4}}) {
    CAPTURE(file);
    CAPTURE(world);
    std::multiset<std::string> together;
    std::vector<size_t> shares;
    for (uint32_t rank = 0; rank < world; ++rank) {
      auto mine = read_all(files() / file, {.seed = 11, .partition = {rank, world}});
      shares.push_back(mine.size());
      together.insert(mine.begin(), mine.end());
    }
    auto whole = read_all(files() / file, {.seed = 11});
    CHECK(together == std::multiset<std::string>(whole.begin(), whole.end()));
    for (size_t s : shares) CHECK(s > 0);
  }
  // Deterministic: the same rank reads the same documents again.
  CHECK(read_all(files() / "zstd.parquet", {.seed = 11, .partition = {1, 2}}) ==
        read_all(files() / "zstd.parquet", {.seed = 11, .partition = {1, 2}}));
  // A looping rank resumes exactly too.
  ParquetDocumentReader a;
  a.open(files() / "single.parquet", {}, true, {.partition = {1, 3}});
  std::string d;
  for (int i = 0; i < 5; ++i) REQUIRE(a.next(d));
  ParquetDocumentReader b;
  b.open(files() / "single.parquet", a.position(), true, {.partition = {1, 3}});
  for (int i = 0; i < 7; ++i) {
    std::string x, y;
    REQUIRE(a.next(x));
    REQUIRE(b.next(y));
    CHECK(x == y);
  }
  ParquetDocumentReader r;
  CHECK(contains(error_of([&] { r.open(files() / "single.parquet", {}, false, {.partition = {10, 11}}); }),
                 "too few rows"));
}

TEST_CASE("Parquet mixes with text shards by weight and resumes exactly") {
  test_util::TempDir tmp("parquet_mix");
  std::string text;
  for (int i = 0; i < 200; ++i) text += "text shard document " + std::to_string(i) + "\n\n";
  test_util::write_file(tmp / "a.txt", text);
  PrepareOptions po;
  po.out_dir = tmp / "text_ds";
  po.val_fraction = 0.0;
  po.shard_size = 1000;
  prepare_dataset({tmp / "a.txt"}, po);
  const std::vector<MixSource> sources = {{tmp / "text_ds", 1.0}, {files() / "zstd.parquet", 3.0}};
  MixedDocumentReader all;
  all.open(sources, "train", 9);
  std::vector<std::pair<size_t, std::string>> reference;
  size_t from_parquet = 0;
  for (int i = 0; i < 1500; ++i) {
    std::string d;
    size_t s = 0;
    all.next(d, &s);
    from_parquet += s == 1;
    CHECK(contains(d, s == 1 ? "document " : "text shard document "));
    reference.emplace_back(s, d);
  }
  CHECK(from_parquet > 1000);  // 1125 expected
  CHECK(from_parquet < 1250);
  for (size_t k : {0, 3, 400, 1111}) {
    MixedDocumentReader first;
    first.open(sources, "train", 9);
    std::string d;
    for (size_t i = 0; i < k; ++i) first.next(d);
    MixedDocumentReader resumed;
    resumed.open(sources, "train", 9, first.position());
    for (size_t i = k; i < k + 200 && i < reference.size(); ++i) {
      size_t s = 0;
      resumed.next(d, &s);
      REQUIRE(s == reference[i].first);
      REQUIRE(d == reference[i].second);
    }
  }
}

TEST_CASE("the in-memory open-and-first-read path matches the file reader") {
  const std::string bytes = test_util::read_file(files() / "layout.parquet");
  auto got = read_parquet_buffer(bytes, "layout.parquet", "text", 10);
  std::vector<std::string> want;
  for (int i = 0; want.size() < 10; ++i)
    if (i % 7 != 3) want.push_back(doc(i));
  CHECK(got == want);
  CHECK(contains(error_of([&] { read_parquet_buffer(bytes.substr(0, 100), "cut.parquet"); }),
                 "cut.parquet: not a readable Parquet file"));
  CHECK(contains(error_of([&] { read_parquet_buffer(bytes, "layout.parquet", "body"); }), "no column \"body\""));
}

TEST_CASE("prepare turns Parquet into text shards, token shards and llm.c shards") {
  test_util::TempDir tmp("parquet_prepare");
  std::vector<std::string> want = docs(0, 1000);
  for (int i = 0; i < 105; ++i)
    if (i % 7 != 3) want.push_back(doc(i));
  PrepareOptions o;
  o.out_dir = tmp / "text";
  o.val_fraction = 0.0;
  PrepareResult r = prepare_dataset({files() / "zstd.parquet", files() / "layout.parquet"}, o);
  CHECK(r.documents == want.size());
  CHECK(r.parquet_nulls == 15);
  CHECK(r.invalid_utf8_documents == 0);
  TextDatasetReader text;
  text.open(tmp / "text", "train");
  std::vector<std::string> got;
  for (std::string d; text.next(d);) got.push_back(d);
  CHECK(got == want);
  // A hub snapshot: its data/ only (README.md is not a document).
  o.out_dir = tmp / "hub_llmc";
  o.llmc = true;
  o.val_fraction = 0.1;
  r = prepare_dataset({files() / "hub"}, o);
  CHECK(r.input_files == 2);
  CHECK(r.documents == 100);
  long eots = 0;  // one before every document, in train and val together
  for (const char* split : {"train", "val"}) {
    TokenDatasetReader tokens;
    tokens.open(tmp / "hub_llmc", split);
    std::vector<uint16_t> ids(1 << 16);
    const size_t n = tokens.read(ids);
    CHECK(n > 0);
    eots += std::count(ids.begin(), ids.begin() + static_cast<long>(n), 50256);
  }
  CHECK(eots == 100);
  // A missing column names the file.
  o.out_dir = tmp / "bad";
  o.llmc = false;
  o.column = "body";
  CHECK(contains(error_of([&] { prepare_dataset({files() / "single.parquet"}, o); }), "no column \"body\""));
}

TEST_CASE("resumed on another number of ranks, every document once (row groups or rows dealt)") {
  // zstd.parquet: 10 row groups (dealt by row group to 2 and 3 ranks); single.parquet: one (dealt
  // by row); layout.parquet: 3 non-empty ones (by row group for 2 ranks, by row for 4).
  struct Case {
    std::string file;
    uint32_t from, to;
  };
  for (const auto& c : std::vector<Case>{{"zstd.parquet", 2, 3}, {"zstd.parquet", 3, 1}, {"single.parquet", 2, 3},
                                         {"layout.parquet", 2, 4}, {"layout.parquet", 4, 1}}) {
    CAPTURE(c.file);
    CAPTURE(c.from);
    CAPTURE(c.to);
    // `from` ranks read a few documents each, and odd ranks 2 tokens of the next one.
    std::multiset<std::string> whole_before;
    std::map<std::string, uint64_t> partial;  // document -> tokens read before
    ProgressLayer layer;
    layer.world = c.from;
    for (uint32_t r = 0; r < c.from; ++r) {
      ParquetDocumentReader rd;
      rd.open(files() / c.file, {}, false, {.seed = 11, .partition = {r, c.from}});
      std::string d;
      DocMark mark;
      for (uint32_t i = 0; i < 1 + 2 * r; ++i) {
        REQUIRE(rd.next(d, &mark));
        whole_before.insert(d);
      }
      REQUIRE(rd.next(d, &mark));
      const uint64_t t = r % 2 ? 2 : 0;
      if (t > 0) partial[d] = t;
      layer.by_shard = mark.by_shard;
      layer.next.push_back({mark.key, t});
    }
    auto done = std::make_shared<DataProgress>();
    done->add(layer);
    // `to` ranks read the rest: every other document whole, the begun ones from where they stopped.
    std::multiset<std::string> whole_after;
    for (uint32_t r = 0; r < c.to; ++r) {
      ParquetDocumentReader rd;
      rd.open(files() / c.file, {}, false, {.seed = 11, .partition = {r, c.to, done}});
      std::string d;
      DocMark mark;
      while (rd.next(d, &mark)) {
        if (mark.skip == 0) {
          whole_after.insert(d);
        } else {
          CHECK_MESSAGE(partial[d] == mark.skip, d);
          partial.erase(d);
        }
      }
    }
    CHECK(partial.empty());  // each begun document went on once
    std::multiset<std::string> together = whole_before;
    together.insert(whole_after.begin(), whole_after.end());
    auto all = read_all(files() / c.file, {.seed = 11});
    std::multiset<std::string> expected(all.begin(), all.end());
    CHECK(together.size() + (c.from / 2) == expected.size());  // the begun documents are in neither
    for (const auto& d : together) CHECK_MESSAGE(expected.count(d) == 1, d);
    for (const auto& d : whole_before) CHECK_MESSAGE(whole_after.count(d) == 0, d);
  }
}
