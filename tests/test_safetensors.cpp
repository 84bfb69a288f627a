// safetensors (datasets/weights/safetensors.h): the writer's bytes (alignment, order, determinism), the
// reader's round trip, and one error naming the file and the tensor for each way a file can be
// bad, plus random corruptions of a valid file that must give an error, never a crash.
#include <doctest/doctest.h>

#include "test_util.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "datasets/weights/safetensors.h"
#include "datasets/shards/shard.h"

namespace fs = std::filesystem;
using namespace pipeline::datasets;
using test_util::contains;
using test_util::error_of;
using test_util::read_file;
using test_util::TempDir;
using test_util::write_file;

namespace {

// A file with the given header JSON (padded to 8) and `data_bytes` bytes of data.
std::string make_file(const std::string& json, size_t data_bytes) {
  std::string header = json;
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data_bytes, '\x01');
}

std::string parse_error(const std::string& file_bytes) {
  return error_of([&] { parse_safetensors_header(file_bytes, file_bytes.size(), "m.safetensors"); });
}

struct Written {
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};  // (2, 3)
  std::vector<uint16_t> b = {1, 2, 3};                            // (3) as BF16 bits
  std::vector<int64_t> c = {-1, 1LL << 40};                       // (2)
};

void write_sample(const fs::path& path, const Written& w) {
  SafetensorsWriter out(path,
                        {{"zeta.weight", SafetensorsDtype::F32, {2, 3}},
                         {"alpha", SafetensorsDtype::BF16, {3}},
                         {"mid", SafetensorsDtype::I64, {2}},
                         {"empty", SafetensorsDtype::F32, {0, 4}}},
                        {{"format", "pt"}, {"note", "a \"quoted\" value"}});
  for (const auto& t : out.order()) {
    if (t.name == "zeta.weight") out.write(t.name, w.a.data(), w.a.size() * 4);
    if (t.name == "alpha") out.write(t.name, w.b.data(), w.b.size() * 2);
    if (t.name == "mid") out.write(t.name, w.c.data(), w.c.size() * 8);
    if (t.name == "empty") out.write(t.name, nullptr, 0);
  }
  out.finish();
}

}  // namespace

TEST_CASE("the writer's file reads back: names, dtypes, shapes, data and metadata") {
  TempDir dir("safetensors");
  const Written w;
  write_sample(dir / "m.safetensors", w);
  CHECK_FALSE(fs::exists(dir / "m.safetensors.tmp"));

  SafetensorsReader r(dir / "m.safetensors");
  const auto& h = r.header();
  CHECK(h.data_start % 8 == 0);  // the data buffer is 8-byte aligned
  CHECK(h.metadata.at("format") == "pt");
  CHECK(h.metadata.at("note") == "a \"quoted\" value");
  REQUIRE(h.tensors.size() == 4);
  // The reference implementation's order: larger dtypes first, then by name.
  CHECK(h.tensors[0].name == "mid");
  CHECK(h.tensors[1].name == "empty");
  CHECK(h.tensors[2].name == "zeta.weight");
  CHECK(h.tensors[3].name == "alpha");

  const auto* a = h.find("zeta.weight");
  REQUIRE(a != nullptr);
  CHECK(a->dtype == SafetensorsDtype::F32);
  CHECK(a->shape == std::vector<uint64_t>{2, 3});
  std::vector<float> back(6);
  r.read(*a, back.data());
  CHECK(back == w.a);
  std::vector<int64_t> c(2);
  r.read(*h.find("mid"), c.data());
  CHECK(c == w.c);
  std::vector<uint16_t> b(3);
  r.read(*h.find("alpha"), b.data());
  CHECK(b == w.b);
  CHECK(h.find("empty")->bytes() == 0);
  CHECK(h.find("missing") == nullptr);

  // The same tensors give the same bytes.
  write_sample(dir / "again.safetensors", w);
  CHECK(read_file(dir / "m.safetensors") == read_file(dir / "again.safetensors"));
}

TEST_CASE("the writer refuses out-of-order or wrong-sized data and leaves no file behind") {
  TempDir dir("safetensors");
  const fs::path path = dir / "m.safetensors";
  {
    SafetensorsWriter out(path, {{"a", SafetensorsDtype::F32, {2}}, {"b", SafetensorsDtype::F32, {1}}});
    const float x[2] = {1, 2};
    CHECK(contains(error_of([&] { out.write("b", x, 4); }), "expected 'a'"));
    CHECK(contains(error_of([&] { out.write("a", x, 4); }), "expected 'a' (8 bytes)"));
    out.write("a", x, 8);
    CHECK(contains(error_of([&] { out.finish(); }), "before tensor 'b'"));
  }
  CHECK_FALSE(fs::exists(path));
  CHECK_FALSE(fs::exists(dir / "m.safetensors.tmp"));
  CHECK(contains(error_of([&] {
          SafetensorsWriter bad(path, {{"a", SafetensorsDtype::F32, {1}}, {"a", SafetensorsDtype::F32, {1}}});
        }),
        "given twice"));
}

TEST_CASE("a bad file is an error naming the file and, where there is one, the tensor") {
  const std::string ok = make_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  CHECK(parse_error(ok).empty());

  SUBCASE("shorter than the length field") {
    auto e = parse_error(ok.substr(0, 5));
    CHECK(contains(e, "m.safetensors"));
    CHECK(contains(e, "shorter than the 8-byte header length"));
  }
  SUBCASE("header length past the end of the file") {
    auto e = parse_error(ok.substr(0, 20));
    CHECK(contains(e, "runs past the end"));
    CHECK(contains(e, "truncated"));
  }
  SUBCASE("header too big") {
    std::string big(16, '\0');
    const uint64_t n = kSafetensorsMaxHeaderBytes + 1;
    std::memcpy(big.data(), &n, 8);
    CHECK(contains(parse_error(big), "exceeds the format's cap of 100000000 bytes"));
  }
  SUBCASE("data truncated") {
    auto e = parse_error(ok.substr(0, ok.size() - 3));
    CHECK(contains(e, "tensor 'w'"));
    CHECK(contains(e, "run past the end"));
  }
  SUBCASE("trailing bytes") {
    CHECK(contains(parse_error(ok + "xyz"), "3 more bytes"));
  }
  SUBCASE("not JSON, or not an object") {
    CHECK(contains(parse_error(make_file("[1,2]", 0)), "does not start with '{'"));
    CHECK(contains(parse_error(make_file(R"({"w":)", 0)), "not valid JSON"));
  }
  SUBCASE("unknown dtype") {
    auto e = parse_error(make_file(R"({"w":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", 8));
    CHECK(contains(e, "tensor 'w' dtype"));
    CHECK(contains(e, "\"F31\" is not a safetensors dtype"));
  }
  SUBCASE("shape and byte range disagree") {
    auto e = parse_error(make_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
    CHECK(contains(e, "tensor 'w'"));
    CHECK(contains(e, "need 12 bytes"));
  }
  SUBCASE("a shape whose size overflows") {
    auto e = parse_error(make_file(
        R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8));
    CHECK(contains(e, "overflows"));
  }
  SUBCASE("overlapping offsets") {
    auto e = parse_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                   8));
    CHECK(contains(e, "tensor 'b'"));
    CHECK(contains(e, "overlap tensor 'a'"));
  }
  SUBCASE("a gap between tensors") {
    auto e = parse_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                   12));
    CHECK(contains(e, "tensor 'b'"));
    CHECK(contains(e, "leaving bytes [4, 8)"));
  }
  SUBCASE("offsets out of range, end before begin, negative or fractional numbers") {
    CHECK(contains(parse_error(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8)),
                   "is before begin"));
    CHECK(contains(parse_error(make_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4)),
                   "non-negative integer"));
    CHECK(contains(parse_error(make_file(R"({"w":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", 4)),
                   "non-negative integer"));
    CHECK(contains(parse_error(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4)),
                   "expected [begin, end]"));
  }
  SUBCASE("duplicate names, bad metadata, missing fields") {
    CHECK(contains(parse_error(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                         R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                         8)),
                   "appears twice"));
    CHECK(contains(parse_error(make_file(R"({"__metadata__":{"format":1}})", 0)), "__metadata__.format"));
    CHECK(contains(parse_error(make_file(R"({"w":{"dtype":"F32","shape":[1]}})", 0)), "missing \"data_offsets\""));
  }
}

TEST_CASE("the reader names the file it could not use") {
  TempDir dir("safetensors");
  write_file(dir / "short.safetensors", "abc");
  auto e = error_of([&] { SafetensorsReader r(dir / "short.safetensors"); });
  CHECK(contains(e, (dir / "short.safetensors").string()));
  CHECK(contains(error_of([&] { SafetensorsReader r(dir / "absent.safetensors"); }), "cannot open"));
}

TEST_CASE("random corruption of a valid file is an error, never a crash") {
  TempDir dir("safetensors");
  write_sample(dir / "m.safetensors", Written{});
  const std::string good = read_file(dir / "m.safetensors");
  std::mt19937_64 rng(11);
  int errors = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string bad = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      const size_t at = rng() % bad.size();
      switch (rng() % 3) {
        case 0: bad[at] = static_cast<char>(rng()); break;
        case 1: bad.resize(at); break;
        default: bad.insert(at, 1, static_cast<char>(rng()));
      }
      if (bad.empty()) break;
    }
    try {
      auto h = parse_safetensors_header(bad, bad.size(), "fuzz");
      // Accepted: then every tensor lies inside the file.
      for (const auto& t : h.tensors) CHECK(h.data_start + t.end <= bad.size());
    } catch (const DatasetError& e) {
      ++errors;
      CHECK(contains(e.what(), "fuzz"));
    }
  }
  CHECK(errors > 2000);
}
