// llm.c / modded-nanogpt token shards (datasets/llmc/llmc_shard.h, llmc_reader.h): the exact header
// layout, the directory naming, reading a directory as a dataset with resumable positions, the
// errors (file and byte offset) for every way a shard can be bad, and `prepare --format llmc`.
// Shards written by a Python script that follows llm.c's writer are tested in test_interop.
#include <doctest/doctest.h>

#include "test_util.h"

#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "datasets/sources/dataset_manifest.h"
#include "datasets/sources/dataset_reader.h"
#include "datasets/llmc/llmc_reader.h"
#include "datasets/llmc/llmc_shard.h"
#include "datasets/shards/manifest.h"
#include "datasets/prepare/prepare.h"
#include "base/json.h"
#include "datasets/shards/shard.h"

namespace fs = std::filesystem;
using namespace pipeline::datasets;
using test_util::contains;
using test_util::error_of;
using test_util::read_file;
using test_util::TempDir;
using test_util::write_file;

namespace {

// A shard's bytes as llm.c writes them: 256 int32 (magic, version, count, zeros), then uint16 ids.
std::string shard_bytes(const std::vector<uint16_t>& tokens, int32_t magic = kLlmcMagic, int32_t version = kLlmcVersion,
                        std::optional<int32_t> count = std::nullopt) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count ? *count : static_cast<int32_t>(tokens.size());
  std::string out(reinterpret_cast<const char*>(header.data()), 1024);
  out.append(reinterpret_cast<const char*>(tokens.data()), 2 * tokens.size());
  return out;
}

std::vector<uint16_t> iota_tokens(size_t n, uint16_t start) {
  std::vector<uint16_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::vector<uint16_t> read_split(const fs::path& dir, const std::string& split, DatasetPosition start = {},
                                 size_t chunk = 7) {
  TokenDatasetReader r;
  r.open(dir, split, start);
  std::vector<uint16_t> all, buf(chunk);
  for (size_t n; (n = r.read(buf)) > 0;) all.insert(all.end(), buf.begin(), buf.begin() + static_cast<long>(n));
  return all;
}

}  // namespace

TEST_CASE("the writer writes llm.c's layout byte for byte, and the reader reads it back") {
  TempDir dir("llmc");
  const fs::path path = dir / "x_train_000000.bin";
  {
    LlmcShardWriter w(path);
    const std::vector<uint32_t> doc1 = {10, 11, 12}, doc2 = {65535};
    w.add_document(doc1);
    w.add_document(doc2);
    CHECK(w.tokens() == 6);
    CHECK(w.documents() == 2);
    CHECK(w.finish() == 1024 + 12);
  }
  CHECK_FALSE(fs::exists(dir / "x_train_000000.bin.tmp"));
  CHECK(read_file(path) == shard_bytes({50256, 10, 11, 12, 50256, 65535}));

  LlmcShardReader r(path);
  CHECK(r.tokens() == 6);
  std::vector<uint16_t> buf(4);
  CHECK(r.read(2, buf) == 4);
  CHECK(buf == std::vector<uint16_t>{11, 12, 50256, 65535});
  CHECK(r.read(6, buf) == 0);

  LlmcShardWriter big(dir / "y_train_000000.bin");
  const std::vector<uint32_t> wide = {70000};
  CHECK(contains(error_of([&] { big.add_document(wide); }), "does not fit the shard's uint16 ids"));
}

TEST_CASE("bad shards are errors naming the file and the byte offset") {
  TempDir dir("llmc");
  auto error_for = [&](const std::string& bytes) {
    write_file(dir / "d_train_000000.bin", bytes);
    return error_of([&] { LlmcShardReader r(dir / "d_train_000000.bin"); });
  };
  const auto tokens = iota_tokens(10, 1);
  CHECK(error_for(shard_bytes(tokens)).empty());

  auto magic = error_for(shard_bytes(tokens, 12345));
  CHECK(contains(magic, "d_train_000000.bin"));
  CHECK(contains(magic, "byte offset 0: bad magic 12345, expected 20240520"));

  auto version = error_for(shard_bytes(tokens, kLlmcMagic, 2));
  CHECK(contains(version, "byte offset 4: unsupported version 2"));

  auto llama = error_for(shard_bytes(tokens, kLlmcLlama3Magic, 7));
  CHECK(contains(llama, "Llama 3"));

  auto header_cut = error_for(shard_bytes(tokens).substr(0, 1000));
  CHECK(contains(header_cut, "shorter than the 1024-byte llm.c shard header (truncated at byte offset 1000)"));

  auto short_file = error_for(shard_bytes(tokens).substr(0, 1024 + 15));
  CHECK(contains(short_file, "byte offset 8: the header counts 10 tokens"));
  CHECK(contains(short_file, "should be 1044 bytes, but it is 1039 (truncated at byte offset 1039)"));

  auto trailing = error_for(shard_bytes(tokens) + "zz");
  CHECK(contains(trailing, "trailing bytes from byte offset 1044"));

  auto negative = error_for(shard_bytes(tokens, kLlmcMagic, 1, -5));
  CHECK(contains(negative, "negative token count -5"));

  CHECK(contains(error_of([&] { LlmcShardReader r(dir / "absent_train_000000.bin"); }), "cannot open"));
  // The header check alone, as a fuzzer calls it.
  CHECK(contains(error_of([] { parse_llmc_header("", 0, "empty.bin"); }), "empty.bin: file is 0 bytes"));
}

TEST_CASE("llm.c naming: splits, shard order, and what is not a shard") {
  TempDir dir("llmc");
  for (const char* name : {"fineweb_train_000002.bin", "fineweb_train_000001.bin", "fineweb_val_000000.bin",
                           "edu_fineweb_train_10.bin", "tiny_shakespeare_test.bin"})
    write_file(dir / name, shard_bytes({1}));
  for (const char* name : {"notes.txt", "train.bin", "_val_000000.bin", "model.safetensors"}) write_file(dir / name, "x");
  auto splits = llmc_splits(dir.path);
  REQUIRE(splits.size() == 3);
  REQUIRE(splits["train"].size() == 3);
  CHECK(splits["train"][0].filename() == "fineweb_train_000001.bin");
  CHECK(splits["train"][1].filename() == "fineweb_train_000002.bin");
  CHECK(splits["train"][2].filename() == "edu_fineweb_train_10.bin");  // index order, unpadded included
  CHECK(splits["val"].size() == 1);
  CHECK(splits["test"].front().filename() == "tiny_shakespeare_test.bin");
  CHECK(is_llmc_dataset(dir.path));
  write_file(dir / "manifest.json", "{}");
  CHECK_FALSE(is_llmc_dataset(dir.path));  // a manifest makes it one of ours
  CHECK(llmc_shard_name("fineweb", "val", 3) == "fineweb_val_000003.bin");
}

TEST_CASE("a directory of shards reads as a dataset: all tokens, any start position, epochs") {
  TempDir dir("llmc");
  const auto a = iota_tokens(30, 100), b = iota_tokens(5, 200), v = iota_tokens(9, 300);
  write_file(dir / "data_train_000000.bin", shard_bytes(a));
  write_file(dir / "data_train_000001.bin", shard_bytes(b));
  write_file(dir / "data_val_000000.bin", shard_bytes(v));

  auto m = load_dataset_manifest(dir.path);
  CHECK(m.format == DatasetFormat::llmc);
  CHECK(m.kind == ShardKind::tokens);
  CHECK(m.items("train") == 35);
  CHECK(m.splits.at("train")[1].bytes == 1024 + 10);

  std::vector<uint16_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  CHECK(read_split(dir.path, "train") == all);
  CHECK(read_split(dir.path, "val") == v);

  // Every position a reader reports resumes the rest of the stream exactly.
  TokenDatasetReader r;
  r.open(dir.path, "train");
  std::vector<uint16_t> buf(4), seen;
  while (true) {
    const DatasetPosition p = r.position();
    auto rest = read_split(dir.path, "train", p, 3);
    CHECK(rest == std::vector<uint16_t>(all.begin() + static_cast<long>(seen.size()), all.end()));
    size_t n = r.read(buf);
    if (n == 0) break;
    seen.insert(seen.end(), buf.begin(), buf.begin() + static_cast<long>(n));
  }
  CHECK(seen == all);
  CHECK(r.position() == DatasetPosition{2, 0, 0});

  // Looping continues with the next epoch.
  TokenDatasetReader loop;
  loop.open(dir.path, "train", {1, 3, 0}, /*loop=*/true);
  std::vector<uint16_t> wrap(5);
  CHECK(loop.read(wrap) == 5);
  CHECK(wrap == std::vector<uint16_t>{203, 204, 100, 101, 102});
  CHECK(loop.position() == DatasetPosition{0, 3, 1});

  auto past = error_of([&] { read_split(dir.path, "train", {1, 6, 0}); });
  CHECK(contains(past, "past the end of shard \"data_train_000001.bin\", which holds 5 tokens"));
  auto no_split = error_of([&] { read_split(dir.path, "dev"); });
  CHECK(contains(no_split, "no llm.c shards for split \"dev\""));
  CHECK(contains(no_split, "train, val"));

  // A bad shard anywhere in the directory is reported when the dataset is opened.
  write_file(dir / "data_train_000002.bin", shard_bytes(b, 999));
  auto bad = error_of([&] { read_split(dir.path, "train"); });
  CHECK(contains(bad, "data_train_000002.bin: byte offset 0: bad magic 999"));
}

TEST_CASE("prepare --format llmc writes the token stream of prepare --tokens as llm.c shards") {
  TempDir dir("llmc");
  const fs::path text = fs::path(PIPELINE_SOURCE_DIR) / "datasets/data/tinyshakespeare/text";
  // The bundled text dataset's documents, as a JSON Lines input both runs share.
  std::string jsonl;
  {
    TextDatasetReader r;
    for (const char* split : {"train", "val"}) {
      r.open(text, split);
      for (std::string d; r.next(d);) jsonl += "{\"text\":" + pipeline::json_quote(d) + "}\n";
    }
  }
  write_file(dir / "in.jsonl", jsonl);

  PrepareOptions ours;
  ours.out_dir = dir / "tokens";
  ours.tokens = true;
  ours.shard_size = 200'000;
  prepare_dataset({dir / "in.jsonl"}, ours);

  PrepareOptions llmc = ours;
  llmc.out_dir = dir / "shakespeare";
  llmc.tokens = false;
  llmc.llmc = true;
  auto result = prepare_dataset({dir / "in.jsonl"}, llmc);
  CHECK_FALSE(fs::exists(dir / "shakespeare" / "manifest.json"));
  CHECK(fs::exists(dir / "shakespeare" / "shakespeare_train_000000.bin"));
  CHECK(fs::exists(dir / "shakespeare" / "shakespeare_train_000001.bin"));  // 200 KB shards: several
  CHECK(fs::exists(dir / "shakespeare" / "shakespeare_val_000000.bin"));
  CHECK(result.manifest.format == DatasetFormat::llmc);

  for (const char* split : {"train", "val"}) {
    auto expected = read_split(dir / "tokens", split, {}, 4096);
    auto got = read_split(dir / "shakespeare", split, {}, 4096);
    CHECK(got.size() == expected.size());
    CHECK(got == expected);
    CHECK(load_dataset_manifest(dir / "shakespeare").items(split) == expected.size());
  }

  // --force replaces llm.c output; other files keep the directory from being reused.
  llmc.overwrite = true;
  CHECK(error_of([&] { prepare_dataset({dir / "in.jsonl"}, llmc); }).empty());
  write_file(dir / "shakespeare" / "notes.txt", "mine");
  CHECK(contains(error_of([&] { prepare_dataset({dir / "in.jsonl"}, llmc); }), "is not empty"));
}
