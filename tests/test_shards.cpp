// Shard formats, manifest, dataset readers and `prepare`: round trips, determinism, resume
// positions, bounded memory, the bundled tiny-shakespeare dataset, and one distinct error
// message (naming the file and the byte offset or line) for every way a dataset can be bad.
#include <doctest/doctest.h>

#include "test_util.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "datasets/sources/document_mix.h"
#include "datasets/sources/dataset_reader.h"
#include "datasets/shards/manifest.h"
#include "datasets/prepare/prepare.h"
#include "datasets/shards/block_shard.h"
#include "datasets/shards/sha256.h"
#include "datasets/shards/shard.h"
#include "datasets/shards/text_check.h"
#include "base/json.h"
#include "datasets/tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using namespace pipeline;
using namespace pipeline::datasets;

namespace {

using test_util::error_of;

struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path = fs::temp_directory_path() / ("pipeline_test_shards_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(counter++) + "_" + std::to_string(stamp));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path operator/(const std::string& name) const { return path / name; }
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& p, std::string_view data) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

std::vector<std::string> read_all_text(const fs::path& dir, const std::string& split, DatasetReaderOptions o = {}) {
  TextDatasetReader r;
  r.open(dir, split, {}, false, o);
  std::vector<std::string> docs;
  for (std::string d; r.next(d);) docs.push_back(d);
  return docs;
}

std::vector<uint16_t> read_all_tokens(const fs::path& dir, const std::string& split) {
  TokenDatasetReader r;
  r.open(dir, split);
  std::vector<uint16_t> all, buf(1000);
  for (size_t n; (n = r.read(buf)) > 0;) all.insert(all.end(), buf.begin(), buf.begin() + n);
  return all;
}

// Pseudo-English documents; `i` is embedded so each is unique and findable.
std::string make_doc(size_t i, std::mt19937& rng, size_t words = 60) {
  static const char* vocab[] = {"the", "king", "shall", "never", "speak", "of", "love", "and", "war", "my",
                                "lord", "hath", "done", "thee", "wrong", "café", "naïve", "—", "\t", "x"};
  std::string s = "doc " + std::to_string(i) + ":";
  size_t n = 1 + rng() % words;
  for (size_t w = 0; w < n; ++w) {
    s += ' ';
    s += vocab[rng() % std::size(vocab)];
    if (rng() % 9 == 0) s += '\n';
  }
  return s;
}

// Plain text corpus for the blank-lines rule: documents with no blank lines inside, each
// ending in "\n", separated by one blank line. Returns the expected documents.
std::vector<std::string> write_blank_line_corpus(const fs::path& file, size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> docs;
  std::string text;
  for (size_t i = 0; i < count; ++i) {
    std::string d = make_doc(i, rng);
    std::string clean;  // keep only non-blank lines, each ending in "\n"
    std::istringstream lines(d);
    for (std::string line; std::getline(lines, line);)
      if (line.find_first_not_of(" \t\r") != std::string::npos) clean += line + "\n";
    docs.push_back(clean);
    text += clean;
    if (i + 1 < count) text += "\n";
  }
  write_file(file, text);
  return docs;
}

uint64_t doc_index_of(const std::string& d) {  // "doc N:" prefix
  return std::stoull(d.substr(4, d.find(':') - 4));
}

PrepareOptions quiet_options(const fs::path& out) {
  PrepareOptions o;
  o.out_dir = out;
  return o;
}

// A small text shard of known content, for the error tests: format 2 (blocks of `block_bytes`)
// unless block_bytes is 0.
fs::path write_text_shard(const fs::path& path, size_t docs, uint32_t seed = 7, int level = 3,
                          uint64_t block_bytes = kDefaultBlockBytes) {
  std::mt19937 rng(seed);
  ShardWriter w(path, ShardKind::text, {.level = level, .block_bytes = block_bytes});
  for (size_t i = 0; i < docs; ++i) w.add_document(make_doc(i, rng, 200));
  w.finish();
  return path;
}

void drain_shard(const fs::path& path, ShardKind kind = ShardKind::text) {
  ShardReader r(path, kind);
  std::string doc;
  std::vector<uint16_t> toks(4096);
  if (kind == ShardKind::text)
    while (r.next_document(doc)) {
    }
  else
    while (r.read_tokens(toks) > 0) {
    }
}

void patch(const fs::path& p, size_t offset, std::string_view bytes) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

const fs::path kBundled = fs::path(PIPELINE_SOURCE_DIR) / "datasets" / "data" / "tinyshakespeare";

}  // namespace

TEST_CASE("sha256 matches the FIPS 180-4 test vectors") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 h;  // one million 'a', fed in uneven pieces
  std::string chunk(997, 'a');
  size_t left = 1000000;
  while (left) {
    size_t n = std::min(left, chunk.size());
    h.update(chunk.data(), n);
    left -= n;
  }
  CHECK(h.hex_digest() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("text shard round trip keeps every byte and document boundary") {
  TempDir tmp;
  std::vector<std::string> docs = {"hello", "", std::string("\0bin\xff\xfe", 6), std::string(300000, 'z'), "last\n"};
  ShardWriter w(tmp / "a.text.zst", ShardKind::text);
  for (const auto& d : docs) w.add_document(d);
  auto s = w.finish();
  CHECK(s.documents == 5);
  CHECK(s.bytes == fs::file_size(tmp / "a.text.zst"));
  CHECK(s.sha256 == sha256_file_hex(tmp / "a.text.zst"));
  ShardReader r(tmp / "a.text.zst", ShardKind::text, /*hash=*/true);
  CHECK(r.header().documents == 5);
  std::vector<std::string> got;
  for (std::string d; r.next_document(d);) got.push_back(d);
  CHECK(got == docs);
  CHECK(r.sha256_hex() == s.sha256);
}

TEST_CASE("token shard stores an EOT before every document") {
  TempDir tmp;
  ShardWriter w(tmp / "t.tokens.zst", ShardKind::tokens);
  std::vector<uint32_t> a = {1, 2, 3}, b = {}, c = {65535, 0};
  w.add_document(a);
  w.add_document(b);
  w.add_document(c);
  auto s = w.finish();
  CHECK(s.items == 8);
  ShardReader r(tmp / "t.tokens.zst", ShardKind::tokens);
  std::vector<uint16_t> out(100);
  size_t n = r.read_tokens(out);
  out.resize(n);
  CHECK(out == std::vector<uint16_t>{50256, 1, 2, 3, 50256, 50256, 65535, 0});
  CHECK(r.finished());
  CHECK(r.documents_read() == 3);
  ShardWriter bad(tmp / "bad.tokens.zst", ShardKind::tokens);
  std::vector<uint32_t> big = {70000};
  CHECK(error_of([&] { bad.add_document(big); }).find("does not fit") != std::string::npos);
}

TEST_CASE("shard errors each have their own message naming the file and offset") {
  TempDir tmp;
  SUBCASE("corrupt byte") {
    auto p = write_text_shard(tmp / "corrupt.text.zst", 200);
    auto size = fs::file_size(p);
    std::string data = read_file(p);
    data[size / 2] = static_cast<char>(data[size / 2] ^ 0x55);
    write_file(p, data);
    std::string e = error_of([&] { drain_shard(p); });
    INFO(e);
    CHECK(e.find("corrupt.text.zst") != std::string::npos);
    CHECK(e.find("corrupt compressed data") != std::string::npos);
    CHECK(e.find("byte offset") != std::string::npos);
  }
  SUBCASE("truncation inside the frame") {
    auto p = write_text_shard(tmp / "cut.text.zst", 200);
    auto size = fs::file_size(p);
    fs::resize_file(p, size * 2 / 3);
    std::string e = error_of([&] { drain_shard(p); });
    INFO(e);
    CHECK(e.find("cut.text.zst") != std::string::npos);
    CHECK(e.find("truncated: file ends at byte offset " + std::to_string(size * 2 / 3)) != std::string::npos);
  }
  SUBCASE("truncation inside the header") {
    auto p = write_text_shard(tmp / "short.text.zst", 3);
    fs::resize_file(p, 20);
    std::string e = error_of([&] { drain_shard(p); });
    CHECK(e.find("short.text.zst") != std::string::npos);
    CHECK(e.find("truncated: file is 20 bytes, shorter than the 40-byte shard header") != std::string::npos);
  }
  SUBCASE("wrong magic") {
    auto p = write_text_shard(tmp / "magic.text.zst", 3);
    patch(p, 10, "XY");
    std::string e = error_of([&] { drain_shard(p); });
    INFO(e);
    CHECK(e.find("magic.text.zst") != std::string::npos);
    CHECK(e.find("wrong magic at byte offset 10") != std::string::npos);
    write_file(tmp / "plain.txt", "just some text that is long enough to have a header's worth of bytes");
    e = error_of([&] { drain_shard(tmp / "plain.txt"); });
    CHECK(e.find("wrong magic at byte offset 0") != std::string::npos);
  }
  SUBCASE("wrong version") {
    auto p = write_text_shard(tmp / "version.text.zst", 3);
    patch(p, 16, std::string("\x09\x00\x00\x00", 4));
    std::string e = error_of([&] { drain_shard(p); });
    CHECK(e.find("version.text.zst") != std::string::npos);
    CHECK(e.find("wrong format version at byte offset 16: found version 9, this build reads versions 1 and 2") !=
          std::string::npos);
  }
  SUBCASE("wrong kind") {
    auto p = write_text_shard(tmp / "kind.text.zst", 3);
    std::string e = error_of([&] { drain_shard(p, ShardKind::tokens); });
    CHECK(e.find("kind.text.zst") != std::string::npos);
    CHECK(e.find("wrong shard kind at byte offset 8: found a text shard") != std::string::npos);
  }
  SUBCASE("trailing bytes after the frame") {
    auto p = write_text_shard(tmp / "trail.text.zst", 3, 7, 3, /*block_bytes=*/0);
    auto size = fs::file_size(p);
    std::ofstream(p, std::ios::binary | std::ios::app) << "junk";
    std::string e = error_of([&] { drain_shard(p); });
    CHECK(e.find("trail.text.zst") != std::string::npos);
    CHECK(e.find("unexpected 4 bytes after the end of the zstd frame at byte offset " + std::to_string(size)) !=
          std::string::npos);
  }
  SUBCASE("header counts that disagree with the stream") {
    auto p = write_text_shard(tmp / "count.text.zst", 3, 7, 3, /*block_bytes=*/0);
    patch(p, 24, std::string("\x04", 1));
    std::string e = error_of([&] { drain_shard(p); });
    CHECK(e.find("count.text.zst") != std::string::npos);
    CHECK(e.find("declares 4 documents") != std::string::npos);
  }
  SUBCASE("block shards: header counts that disagree with the block index") {
    auto p = write_text_shard(tmp / "count2.text.zst", 3);
    patch(p, 24, std::string("\x04", 1));
    std::string e = error_of([&] { drain_shard(p); });
    INFO(e);
    CHECK(e.find("count2.text.zst") != std::string::npos);
    CHECK(e.find("counts 3 documents") != std::string::npos);
    CHECK(e.find("the header (byte offset 24) 4") != std::string::npos);
  }
  SUBCASE("block shards: bytes after the block index") {
    auto p = write_text_shard(tmp / "trail2.text.zst", 30, 7, 3, /*block_bytes=*/1024);
    const auto size = fs::file_size(p);
    std::ofstream(p, std::ios::binary | std::ios::app) << "junk";
    std::string e = error_of([&] { drain_shard(p); });
    INFO(e);
    CHECK(e.find("trail2.text.zst") != std::string::npos);
    CHECK(e.find("bytes to the end of the file") != std::string::npos);
    // Random access finds no index at the end at all.
    auto file = io::open_local_file(p);
    e = error_of([&] { read_block_index(*file, ShardKind::text); });
    CHECK(e.find("no block index: the file does not end with \"PLSHBLKS\" (byte offset " + std::to_string(size - 4)) !=
          std::string::npos);
  }
  SUBCASE("block shards: a block index entry that disagrees with the blocks") {
    auto p = write_text_shard(tmp / "index.text.zst", 30, 7, 3, /*block_bytes=*/1024);
    auto file = io::open_local_file(p);
    const BlockIndex index = read_block_index(*file, ShardKind::text);
    REQUIRE(index.blocks.size() >= 3);
    // The second entry's offset, one byte later.
    const uint64_t entry = fs::file_size(p) - 16 - 32 * index.blocks.size() + 32;
    std::string off(8, '\0');
    for (int i = 0; i < 8; ++i) off[i] = static_cast<char>((index.blocks[1].offset + 1) >> (8 * i));
    patch(p, entry, off);
    std::string e = error_of([&] { drain_shard(p); });
    INFO(e);
    CHECK(e.find("index.text.zst: block index entry 1 (byte offset " + std::to_string(entry) + ")") != std::string::npos);
    auto again = io::open_local_file(p);
    e = error_of([&] { read_block_index(*again, ShardKind::text); });
    INFO(e);
    CHECK(e.find("corrupt block index entry 1 (byte offset " + std::to_string(entry) + ")") != std::string::npos);
  }
}

TEST_CASE("manifest errors each have their own message") {
  TempDir tmp;
  std::vector<std::string> docs = write_blank_line_corpus(tmp / "in" / "corpus.txt", 60, 1);
  PrepareOptions o = quiet_options(tmp / "ds");
  o.val_fraction = 0.2;
  prepare_dataset({tmp / "in"}, o);
  const fs::path manifest = tmp / "ds" / "manifest.json";
  const fs::path shard = tmp / "ds" / "train_00000.text.zst";
  REQUIRE(fs::exists(shard));
  CHECK(read_all_text(tmp / "ds", "train").size() + read_all_text(tmp / "ds", "val").size() == docs.size());

  SUBCASE("sha256 mismatch on open") {
    std::string data = read_file(shard);
    data[data.size() / 2] = static_cast<char>(data[data.size() / 2] ^ 1);
    write_file(shard, data);
    std::string e = error_of([&] { read_all_text(tmp / "ds", "train"); });
    INFO(e);
    CHECK(e.find("train_00000.text.zst: sha256 mismatch") != std::string::npos);
    CHECK(e.find("manifest.json records") != std::string::npos);
    // With verification off the damage still surfaces, as zstd corruption, never silently.
    e = error_of([&] { read_all_text(tmp / "ds", "train", {.verify = VerifyMode::off}); });
    CHECK(e.find("corrupt compressed data") != std::string::npos);
  }
  SUBCASE("sha256 mismatch while reading") {
    std::string m = read_file(manifest);
    auto at = m.find("\"sha256\": \"") + 11;
    m[at] = m[at] == '0' ? '1' : '0';
    write_file(manifest, m);
    std::string e = error_of([&] { read_all_text(tmp / "ds", "train", {.verify = VerifyMode::while_reading}); });
    CHECK(e.find("train_00000.text.zst: sha256 mismatch") != std::string::npos);
    CHECK(error_of([&] { read_all_text(tmp / "ds", "train", {.verify = VerifyMode::off}); }).empty());
  }
  SUBCASE("missing shard") {
    fs::remove(shard);
    std::string e = error_of([&] { read_all_text(tmp / "ds", "train"); });
    CHECK(e.find("manifest.json: shard train[0] \"train_00000.text.zst\" is missing") != std::string::npos);
  }
  SUBCASE("shard size differs from the manifest") {
    fs::resize_file(shard, fs::file_size(shard) - 5);
    std::string e = error_of([&] { read_all_text(tmp / "ds", "train"); });
    CHECK(e.find("train_00000.text.zst: size mismatch") != std::string::npos);
    CHECK(e.find("truncated at byte offset") != std::string::npos);
  }
  SUBCASE("malformed JSON") {
    std::string m = read_file(manifest);
    m.insert(m.find("\"kind\""), "oops ");
    write_file(manifest, m);
    std::string e = error_of([&] { read_all_text(tmp / "ds", "train"); });
    INFO(e);
    CHECK(e.find("manifest.json: malformed manifest: not valid JSON at line 4, column 3 (byte offset") !=
          std::string::npos);
  }
  SUBCASE("missing key and wrong type") {
    std::string m = read_file(manifest);
    auto at = m.find(", \"sha256\"");
    write_file(manifest, m.substr(0, at) + m.substr(m.find('}', at)));
    std::string e = error_of([&] { read_all_text(tmp / "ds", "train"); });
    CHECK(e.find("manifest.json: malformed manifest: splits.train[0] (byte offset") != std::string::npos);
    CHECK(e.find("missing key \"sha256\"") != std::string::npos);
    std::string wrong = m;
    wrong.replace(wrong.find("\"version\": 2"), 12, "\"version\": \"2\"");
    write_file(manifest, wrong);
    e = error_of([&] { read_all_text(tmp / "ds", "train"); });
    CHECK(e.find("top level.version") != std::string::npos);
    CHECK(e.find("expected a number, found a string") != std::string::npos);
  }
  SUBCASE("unknown split, wrong kind, bad positions") {
    CHECK(error_of([&] { read_all_text(tmp / "ds", "test"); }).find("no split \"test\"") != std::string::npos);
    CHECK(error_of([&] { read_all_tokens(tmp / "ds", "train"); }).find("dataset kind is \"text\"") !=
          std::string::npos);
    TextDatasetReader r;
    CHECK(error_of([&] { r.open(tmp / "ds", "train", {.shard = 5}); }).find("is past the split") != std::string::npos);
    CHECK(error_of([&] { r.open(tmp / "ds", "train", {.shard = 0, .item = 1000}); }).find("past the end of shard") !=
          std::string::npos);
  }
  SUBCASE("no manifest at all") {
    std::string e = error_of([&] { read_all_text(tmp / "nowhere", "train"); });
    CHECK(e.find("nowhere") != std::string::npos);
    CHECK(e.find("cannot open the dataset manifest") != std::string::npos);
  }
}

TEST_CASE("prepare -> read returns the same documents and tokens") {
  TempDir tmp;
  // A plain text file (blank-line documents), a nested directory, and JSON Lines.
  std::vector<std::string> expected = write_blank_line_corpus(tmp / "in" / "a" / "one.txt", 150, 2);
  std::mt19937 rng(3);
  std::string jsonl;
  for (size_t i = 150; i < 230; ++i) {
    std::string d = make_doc(i, rng) + "\n\n  with \"quotes\" and \\ and \x01";
    expected.push_back(d);
    jsonl += "{\"id\": " + std::to_string(i) + ", \"text\": " + json_quote(d) + "}\n";
  }
  write_file(tmp / "in" / "b" / "two.jsonl", jsonl);
  write_file(tmp / "in" / ".hidden", "never read");
  // Directory order is sorted: a/one.txt, then b/two.jsonl.
  PrepareOptions o = quiet_options(tmp / "text");
  o.shard_size = 4096;  // many shards
  o.val_fraction = 0.25;
  auto result = prepare_dataset({tmp / "in"}, o);
  CHECK(result.documents == expected.size());
  CHECK(result.hidden_files_skipped == 1);
  CHECK(result.manifest.splits.at("train").size() > 3);

  auto train = read_all_text(tmp / "text", "train");
  auto val = read_all_text(tmp / "text", "val");
  CHECK(train.size() + val.size() == expected.size());
  CHECK(val.size() > 20);
  CHECK(val.size() < 100);
  std::vector<std::string> merged(expected.size());
  for (const auto* split : {&train, &val}) {
    uint64_t last = 0;
    bool first = true;
    for (const auto& d : *split) {
      uint64_t i = doc_index_of(d);
      REQUIRE(i < expected.size());
      CHECK((first || i > last));  // input order within a split
      first = false;
      last = i;
      merged[i] = d;
    }
  }
  CHECK(merged == expected);

  // Tokens: the same split (same seed), EOT before every document, ids decode to the text.
  o.out_dir = tmp / "tokens";
  o.tokens = true;
  o.shard_size = 3000;
  prepare_dataset({tmp / "in"}, o);
  const Tokenizer& tok = Tokenizer::gpt2();
  for (const auto& [split, docs] : {std::pair{"train", &train}, std::pair{"val", &val}}) {
    auto ids = read_all_tokens(tmp / "tokens", split);
    REQUIRE(!ids.empty());
    CHECK(ids.front() == 50256);
    std::vector<std::string> decoded;
    std::vector<uint32_t> cur;
    for (size_t i = 1; i <= ids.size(); ++i) {
      if (i == ids.size() || ids[i] == 50256) {
        decoded.push_back(tok.decode(cur));
        cur.clear();
      } else {
        cur.push_back(ids[i]);
      }
    }
    CHECK(decoded == *docs);
  }
}

TEST_CASE("prepare splits plain text by the chosen rule") {
  TempDir tmp;
  write_file(tmp / "in.txt", "a b\r\nc\n\n \t\nd\n\n\ne");
  auto docs_for = [&](DocumentRule rule, const std::string& name) {
    PrepareOptions o = quiet_options(tmp / name);
    o.rule = rule;
    o.val_fraction = 0.0;
    prepare_dataset({tmp / "in.txt"}, o);
    return read_all_text(tmp / name, "train");
  };
  CHECK(docs_for(DocumentRule::blank_lines, "b") == std::vector<std::string>{"a b\r\nc\n", "d\n", "e"});
  CHECK(docs_for(DocumentRule::lines, "l") == std::vector<std::string>{"a b", "c", "d", "e"});
  CHECK(docs_for(DocumentRule::file, "f") == std::vector<std::string>{"a b\r\nc\n\n \t\nd\n\n\ne"});
  CHECK(parse_document_rule("lines") == DocumentRule::lines);
  CHECK(error_of([] { parse_document_rule("words"); }).find("blank-lines, lines or file") != std::string::npos);
}

TEST_CASE("prepare reports bad JSON Lines with file:line") {
  TempDir tmp;
  auto run = [&](const std::string& content) {
    write_file(tmp / "d.jsonl", content);
    PrepareOptions o = quiet_options(tmp / "out");
    o.overwrite = true;
    return error_of([&] { prepare_dataset({tmp / "d.jsonl"}, o); });
  };
  std::string e = run("{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"text\": oops}\n");
  CHECK(e.find("d.jsonl:3:10: not valid JSON") != std::string::npos);
  e = run("{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n");
  CHECK(e.find("d.jsonl:2: the object has no \"text\" field") != std::string::npos);
  e = run("{\"text\": 5}\n");
  CHECK(e.find("d.jsonl:1: \"text\" is a number, expected a string") != std::string::npos);
  e = run("{\"text\": \"a\"}\n\n{\"text\": \"b\"}\n");
  CHECK(e.find("d.jsonl:2: empty line") != std::string::npos);
  e = run("[1]\n");
  CHECK(e.find("d.jsonl:1: expected a JSON object") != std::string::npos);
  CHECK(run("{\"text\": \"a\"}\r\n{\"text\": \"b\"}").empty());
}

TEST_CASE("prepare refuses binary input given as text, naming the file and offset, and counts invalid UTF-8") {
  TempDir tmp;
  auto run = [&](const std::string& name, const std::string& content, DocumentRule rule = DocumentRule::blank_lines) {
    write_file(tmp / name, content);
    PrepareOptions o = quiet_options(tmp / "out");
    o.overwrite = true;
    o.rule = rule;
    o.val_fraction = 0.0;
    return error_of([&] { prepare_dataset({tmp / name}, o); });
  };
  const std::string tail = std::string("\x01\x02 some payload\n", 16);
  struct Case {
    const char* name;
    std::string head;
    const char* says;
  };
  for (const Case& c : {Case{"docs.pq", "PAR1", "Parquet data (it starts with 50 41 52 31), not text"},
                        Case{"docs.txt.gz", "\x1f\x8b\x08", "gzip data"},
                        Case{"docs.zst", "\x28\xb5\x2f\xfd", "zstd data"},
                        Case{"docs.arrow", "ARROW1\0\0", "Arrow IPC data"},
                        Case{"docs.arrows", "\xff\xff\xff\xff", "Arrow IPC stream data"},
                        Case{"docs.jsonl", "PAR1", "Parquet data"}}) {
    CAPTURE(c.name);
    const std::string e = run(c.name, c.head + tail);
    CHECK(e.find((tmp / c.name).string() + ": byte 0: " + c.says) != std::string::npos);
  }
  // A NUL byte, by every reader, at its byte offset.
  CHECK(run("nul.txt", std::string("line one\nline\0two\n", 18)).find("nul.txt: byte 13: a NUL byte") != std::string::npos);
  CHECK(run("nul.txt", std::string("abc\n\0", 5), DocumentRule::lines).find("nul.txt: byte 4: a NUL byte") !=
        std::string::npos);
  CHECK(run("nul.txt", std::string(70000, 'a') + std::string(1, '\0'), DocumentRule::file)
            .find("nul.txt: byte 70000: a NUL byte") != std::string::npos);
  CHECK(run("nul.jsonl", std::string("{\"text\": \"a\"}\n{\"text\"\0}\n", 24)).find("nul.jsonl: byte 21: a NUL byte") !=
        std::string::npos);
  // Invalid UTF-8 is tokenized as bytes and counted.
  CHECK(invalid_utf8_bytes("plain ascii, caf\xc3\xa9, \xe6\x97\xa5, \xf0\x9f\x98\x80") == 0);
  CHECK(invalid_utf8_bytes("\xff") == 1);
  CHECK(invalid_utf8_bytes("a\xc3(b") == 1);             // a lead byte without its continuation
  CHECK(invalid_utf8_bytes("\xed\xa0\x80") == 3);         // a UTF-16 surrogate
  CHECK(invalid_utf8_bytes("\xc0\xaf") == 2);              // overlong
  CHECK(invalid_utf8_bytes("\xf4\x90\x80\x80") == 4);     // above U+10FFFF
  write_file(tmp / "latin1.txt", "caf\xe9 au lait\n\nna\xefve \xff\xfe\n\nfine\n");
  PrepareOptions o = quiet_options(tmp / "utf8");
  o.val_fraction = 0.0;
  o.tokens = true;
  PrepareResult r = prepare_dataset({tmp / "latin1.txt"}, o);
  CHECK(r.documents == 3);
  CHECK(r.invalid_utf8_documents == 2);
  CHECK(r.invalid_utf8_bytes == 4);
  CHECK(r.manifest.documents("train") == 3);
}

TEST_CASE("prepare is deterministic for a seed") {
  TempDir tmp;
  write_blank_line_corpus(tmp / "in" / "x.txt", 300, 4);
  auto files_of = [](const fs::path& dir) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& e : fs::directory_iterator(dir)) out.emplace_back(e.path().filename().string(), read_file(e.path()));
    std::sort(out.begin(), out.end());
    return out;
  };
  for (bool tokens : {false, true}) {
    CAPTURE(tokens);
    PrepareOptions o = quiet_options(tmp / "a");
    o.tokens = tokens;
    o.shard_size = 5000;
    o.overwrite = true;
    o.threads = 1;
    prepare_dataset({tmp / "in"}, o);
    o.out_dir = tmp / "b";
    o.threads = 3;  // thread count must not change the bytes
    prepare_dataset({tmp / "in"}, o);
    auto a = files_of(tmp / "a"), b = files_of(tmp / "b");
    CHECK(a.size() > 3);
    CHECK(a == b);
    o.out_dir = tmp / "c";
    o.seed = 99;
    prepare_dataset({tmp / "in"}, o);
    CHECK(files_of(tmp / "c") != a);
  }
  // A second run into a dataset directory needs --force.
  PrepareOptions o = quiet_options(tmp / "a");
  CHECK(error_of([&] { prepare_dataset({tmp / "in"}, o); }).find("already holds a dataset") != std::string::npos);
}

TEST_CASE("a reader resumed at position() continues exactly where the first stopped") {
  TempDir tmp;
  write_blank_line_corpus(tmp / "in.txt", 120, 5);
  PrepareOptions o = quiet_options(tmp / "text");
  o.shard_size = 2000;
  o.val_fraction = 0.0;
  prepare_dataset({tmp / "in.txt"}, o);
  o.out_dir = tmp / "tokens";
  o.tokens = true;
  o.shard_size = 1000;
  prepare_dataset({tmp / "in.txt"}, o);

  SUBCASE("text, including shard boundaries and epochs") {
    // Uninterrupted: two epochs of documents.
    TextDatasetReader all;
    all.open(tmp / "text", "train", {}, /*loop=*/true);
    std::vector<std::string> reference;
    std::string d;
    for (int i = 0; i < 250; ++i) {
      REQUIRE(all.next(d));
      reference.push_back(d);
    }
    CHECK(all.position().epoch == 2);
    CHECK(std::equal(reference.begin(), reference.begin() + 120, reference.begin() + 120));
    for (size_t k : {0, 1, 7, 33, 60, 119, 120, 121, 200}) {
      CAPTURE(k);
      TextDatasetReader first;
      first.open(tmp / "text", "train", {}, true);
      for (size_t i = 0; i < k; ++i) first.next(d);
      DatasetPosition pos = DatasetPosition::parse(first.position().str());
      CHECK(pos == first.position());
      TextDatasetReader resumed;
      resumed.open(tmp / "text", "train", pos, true);
      for (size_t i = k; i < reference.size(); ++i) {
        REQUIRE(resumed.next(d));
        REQUIRE(d == reference[i]);
      }
    }
    // Without looping, the end is final, and its position resumes to the end.
    TextDatasetReader once;
    once.open(tmp / "text", "train");
    size_t n = 0;
    while (once.next(d)) ++n;
    CHECK(n == 120);
    TextDatasetReader after;
    after.open(tmp / "text", "train", once.position());
    CHECK(!after.next(d));
  }
  SUBCASE("tokens, with reads that straddle shards") {
    TokenDatasetReader all;
    all.open(tmp / "tokens", "train", {}, true);
    std::vector<uint16_t> reference(80000);
    REQUIRE(all.read(reference) == reference.size());
    for (size_t chunk : {1, 37, 500, 4096}) {
      for (size_t reads : {0, 1, 3, 10}) {
        CAPTURE(chunk);
        CAPTURE(reads);
        TokenDatasetReader first;
        first.open(tmp / "tokens", "train", {}, true);
        std::vector<uint16_t> buf(chunk);
        size_t done = 0;
        for (size_t i = 0; i < reads; ++i) done += first.read(buf);
        TokenDatasetReader resumed;
        resumed.open(tmp / "tokens", "train", first.position(), true);
        std::vector<uint16_t> rest(reference.size() - done);
        REQUIRE(resumed.read(rest) == rest.size());
        CHECK(std::equal(rest.begin(), rest.end(), reference.begin() + static_cast<long>(done)));
      }
    }
  }
  CHECK(error_of([] { DatasetPosition::parse("epoch=1 shard=x item=2"); }).find("not a non-negative integer") !=
        std::string::npos);
}

TEST_CASE("reading a 64 MB shard keeps the reader's memory small") {
  TempDir tmp;
  const fs::path p = tmp / "big.text.zst";
  std::mt19937 rng(11);
  std::string doc;
  uint64_t total = 0, docs = 0;
  {
    ShardWriter w(p, ShardKind::text, {.level = 1});
    while (total < (uint64_t(64) << 20)) {
      doc = make_doc(docs, rng, 1500);
      w.add_document(doc);
      total += doc.size();
      ++docs;
    }
    w.finish();
  }
  MESSAGE("64 MB shard: " << docs << " documents, " << fs::file_size(p) / 1000 << " KB compressed");
  ShardReader r(p, ShardKind::text);
  uint64_t seen = 0, bytes = 0;
  size_t largest_doc = 0;
  while (r.next_document(doc)) {
    ++seen;
    bytes += doc.size();
    largest_doc = std::max(largest_doc, doc.size());
  }
  CHECK(seen == docs);
  CHECK(bytes == total);
  MESSAGE("reader high-water: " << r.memory_high_water() << " bytes (buffers + zstd context)");
  CHECK(r.memory_high_water() < size_t(4) << 20);   // vs 64 MB of data
  CHECK(r.memory_high_water() > 0);
  CHECK(largest_doc < size_t(16) << 10);
}

TEST_CASE("the bundled tiny-shakespeare dataset opens and verifies") {
  for (const char* kind : {"text", "tokens"}) {
    CAPTURE(kind);
    const fs::path dir = kBundled / kind;
    Manifest m = Manifest::load(dir);
    CHECK(m.splits.at("train").size() >= 1);
    CHECK(m.splits.at("val").size() >= 1);
    for (const auto& split : {"train", "val"}) verify_split(dir, m, split, VerifyMode::on_open);
  }
  auto train = read_all_text(kBundled / "text", "train");
  auto val = read_all_text(kBundled / "text", "val");
  uint64_t bytes = 0;
  for (const auto* s : {&train, &val})
    for (const auto& d : *s) bytes += d.size();
  // Blank lines separate the documents and are dropped; every other byte is kept.
  std::string original = read_file(fs::path(PIPELINE_REFERENCE_DATA_DIR) / "tinyshakespeare.txt");
  std::istringstream lines(original);
  uint64_t blank_bytes = 0;
  for (std::string line; std::getline(lines, line);)
    if (line.find_first_not_of(" \t\r") == std::string::npos) blank_bytes += line.size() + 1;
  CHECK(bytes + blank_bytes == original.size());
  CHECK(train.size() + val.size() == 7222);
  CHECK((train.front().starts_with("First Citizen:\n") || val.front().starts_with("First Citizen:\n")));

  auto val_ids = read_all_tokens(kBundled / "tokens", "val");
  CHECK(val_ids.size() > 4 * 8 * 65);  // a few eval batches of 8 x 64 (+1) tokens
  auto train_ids = read_all_tokens(kBundled / "tokens", "train");
  // The token shards hold the same documents as the text shards, EOT before each.
  std::vector<uint32_t> ids32(val_ids.begin(), val_ids.end());
  std::string joined;
  for (const auto& d : val) joined += "<|endoftext|>" + d;
  CHECK(Tokenizer::gpt2().decode(ids32) == joined);
  CHECK(std::count(train_ids.begin(), train_ids.end(), 50256) == static_cast<long>(train.size()));
}

TEST_CASE("weighted mix is deterministic, follows the weights and resumes exactly") {
  TempDir tmp;
  write_blank_line_corpus(tmp / "a.txt", 50, 8);
  write_blank_line_corpus(tmp / "b.txt", 30, 9);
  for (const char* name : {"a", "b"}) {
    PrepareOptions o = quiet_options(tmp / (std::string(name) + "_ds"));
    o.val_fraction = 0.0;
    o.shard_size = 1500;
    prepare_dataset({tmp / (std::string(name) + ".txt")}, o);
  }
  std::vector<MixSource> sources = {{tmp / "a_ds", 3.0}, {tmp / "b_ds", 1.0}};
  MixedDocumentReader all;
  all.open(sources, "train", 42);
  std::vector<std::pair<size_t, std::string>> reference;
  size_t from_a = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string d;
    size_t s = 0;
    all.next(d, &s);
    from_a += s == 0;
    reference.emplace_back(s, d);
  }
  CHECK(from_a > 1350);  // expected 1500 of 2000
  CHECK(from_a < 1650);
  for (size_t k : {0, 1, 77, 999}) {
    MixedDocumentReader first;
    first.open(sources, "train", 42);
    std::string d;
    for (size_t i = 0; i < k; ++i) first.next(d);
    MixedDocumentReader resumed;
    resumed.open(sources, "train", 42, first.position());
    for (size_t i = k; i < k + 300; ++i) {
      size_t s = 0;
      resumed.next(d, &s);
      REQUIRE(s == reference[i].first);
      REQUIRE(d == reference[i].second);
    }
  }
  CHECK(error_of([&] { MixedDocumentReader m; m.open({{tmp / "a_ds", 0.0}}, "train", 1); }).find("must be a positive") !=
        std::string::npos);
}

TEST_CASE("a shard truncated while it is being read: an error naming it and the byte offset") {
  TempDir tmp;
  // Incompressible documents, so the file is many times the reader's 128 KiB input buffer.
  std::mt19937 rng(3);
  std::vector<std::string> docs;
  {
    ShardWriter w(tmp / "big.text.zst", ShardKind::text);
    for (int i = 0; i < 64; ++i) {
      std::string d(16 << 10, '\0');
      for (auto& c : d) c = static_cast<char>('a' + rng() % 26);
      docs.push_back(d);
      w.add_document(d);
    }
    w.finish();
  }
  const auto size = fs::file_size(tmp / "big.text.zst");
  REQUIRE(size > 600'000);
  ShardReader r(tmp / "big.text.zst", ShardKind::text);
  std::string doc;
  REQUIRE(r.next_document(doc));
  CHECK(doc == docs[0]);
  fs::resize_file(tmp / "big.text.zst", 400'000);  // under the reader's feet
  std::string e = error_of([&] {
    while (r.next_document(doc)) {
    }
  });
  INFO(e);
  CHECK(e.find("big.text.zst") != std::string::npos);
  CHECK(e.find("byte 400000: the file ends before its " + std::to_string(size) + " bytes") != std::string::npos);
}

TEST_CASE("a shard that vanishes before the reader reaches it: an error naming it") {
  TempDir tmp;
  std::mt19937 rng(5);
  {
    std::string text;
    for (int i = 0; i < 400; ++i) text += make_doc(static_cast<size_t>(i), rng) + "\n\n";
    write_file(tmp / "in.txt", text);
  }
  PrepareOptions o = quiet_options(tmp / "ds");
  o.shard_size = 8 << 10;  // several train shards
  o.val_fraction = 0;
  auto result = prepare_dataset({tmp / "in.txt"}, o);
  const auto& shards = result.manifest.splits.at("train");
  REQUIRE(shards.size() >= 3);
  TextDatasetReader r;
  r.open(tmp / "ds", "train");
  std::string doc;
  REQUIRE(r.next(doc));
  fs::remove(tmp / "ds" / shards[1].name);
  std::string e = error_of([&] {
    while (r.next(doc)) {
    }
  });
  INFO(e);
  CHECK(e.find(shards[1].name) != std::string::npos);
  CHECK(e.find("cannot open: No such file or directory") != std::string::npos);
}

TEST_CASE("a corrupt length prefix cannot make the reader allocate what the shard does not hold") {
  TempDir tmp;
  // A token shard holding EOT (0xc450, bytes 50 c4), ffff, ffff, relabelled as a text shard whose
  // header declares 2^40 text bytes: its first document then claims 0xffffc450 bytes (4 GiB),
  // and the stream holds 2 more. The reader must report the short stream, not try to allocate.
  auto p = tmp / "liar.text.zst";
  {
    ShardWriter w(p, ShardKind::tokens, {.block_bytes = 0});
    const uint32_t ids[] = {0xffff, 0xffff};
    w.add_document(std::span<const uint32_t>(ids));
    w.finish();
  }
  patch(p, 8, "PLSHTEXT");
  patch(p, 32, std::string("\x00\x00\x00\x00\x00\x01\x00\x00", 8));
  std::string e = error_of([&] { drain_shard(p); });
  INFO(e);
  CHECK(e.find("liar.text.zst") != std::string::npos);
  CHECK(e.find("stream ends inside document 0 (2 of 4294952016 bytes)") != std::string::npos);
}

TEST_CASE("a shard writer that fails or is abandoned leaves no file behind") {
  TempDir tmp;
  {
    ShardWriter w(tmp / "abandoned.text.zst", ShardKind::text);
    w.add_document("never finished");
  }
  CHECK(!fs::exists(tmp / "abandoned.text.zst"));
  CHECK(!fs::exists(tmp / "abandoned.text.zst.tmp"));
  std::string e = error_of([&] { ShardWriter w(tmp / "no_dir" / "x.text.zst", ShardKind::text); });
  CHECK(e.find("x.text.zst") != std::string::npos);
  CHECK(e.find("No such file or directory") != std::string::npos);
}

TEST_CASE("the fuzz targets' block-shard seeds read to their end, streamed and block by block") {
  const fs::path corpus = fs::path(PIPELINE_SOURCE_DIR) / "tests" / "fuzz" / "corpus";
  for (const auto& [dir, kind] : {std::pair{"fuzz_shard_text", ShardKind::text}, std::pair{"fuzz_shard_tokens", ShardKind::tokens}})
    for (const char* name : {"blocks", "no_blocks"}) {
      const fs::path p = corpus / dir / name;
      if (!fs::exists(p)) continue;
      CAPTURE(p);
      drain_shard(p, kind);
      auto file = io::open_local_file(p);
      const BlockIndex index = read_block_index(*file, kind);
      BlockDecoder decoder;
      std::vector<char> payload;
      uint64_t documents = 0;
      for (size_t b = 0; b < index.blocks.size(); ++b) {
        decoder.decode(*file, kind, index.blocks[b], b, payload);
        documents += index.blocks[b].documents;
      }
      CHECK(documents == index.header.documents);
    }
}
