// The TensorBoard event writer (graph/observe/tensorboard.h): CRC-32C against its check values and a
// bit-by-bit reference, TFRecord framing, and an event file's records, a resumed run's session
// start included. That TensorBoard itself reads the files back (tags, steps, values) is tested in
// test_interop with the tensorboard package, and that it drops what a resume trains again, in
// test_distributed_e2e.
#include <doctest/doctest.h>

#include "test_util.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "graph/observe/tensorboard.h"

namespace fs = std::filesystem;
using namespace pipeline::graph;
using test_util::read_file;
using test_util::TempDir;

namespace {

// CRC-32C one bit at a time: the reflected Castagnoli polynomial 0x82f63b78.
uint32_t crc32c_bitwise(const std::string& s) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : s) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t u32_at(const std::string& s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}

uint64_t u64_at(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}

// The records of a TFRecord file, each checked against both of its CRCs.
std::vector<std::string> records(const std::string& file) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < file.size()) {
    REQUIRE(at + 12 <= file.size());
    const uint64_t n = u64_at(file, at);
    CHECK(u32_at(file, at + 8) == masked_crc32c(file.data() + at, 8));
    REQUIRE(at + 12 + n + 4 <= file.size());
    std::string data = file.substr(at + 12, n);
    CHECK(u32_at(file, at + 12 + n) == masked_crc32c(data.data(), data.size()));
    out.push_back(std::move(data));
    at += 12 + n + 4;
  }
  return out;
}

}  // namespace

TEST_CASE("CRC-32C: the check value, RFC 3720's vectors, and a bitwise reference") {
  CHECK(crc32c("123456789", 9) == 0xe3069283u);
  std::string zeros(32, '\0'), ones(32, '\xff'), up(32, '\0');
  for (int i = 0; i < 32; ++i) up[i] = static_cast<char>(i);
  CHECK(crc32c(zeros.data(), 32) == 0x8a9136aau);
  CHECK(crc32c(ones.data(), 32) == 0x62a8ab43u);
  CHECK(crc32c(up.data(), 32) == 0x46dd794eu);
  CHECK(crc32c("", 0) == 0u);
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    std::string s(rng() % 300, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    CHECK(crc32c(s.data(), s.size()) == crc32c_bitwise(s));
  }
  // TFRecord's mask: rotate right by 15, add a constant.
  const uint32_t c = crc32c("abc", 3);
  CHECK(masked_crc32c("abc", 3) == ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST_CASE("a record is the length, its masked CRC, the data and the data's masked CRC") {
  const std::string r = tfrecord("hello");
  REQUIRE(r.size() == 8 + 4 + 5 + 4);
  CHECK(u64_at(r, 0) == 5);
  CHECK(records(r) == std::vector<std::string>{"hello"});
}

TEST_CASE("an event file starts with the file version, then one record per event") {
  TempDir dir("tensorboard");
  fs::path path;
  {
    TensorBoardWriter tb(dir.path);
    path = tb.path();
    tb.add_scalars(3, {{"train/loss", 2.5}, {"train/lr", 0.0}}, 1700000000.25);
    tb.add_scalar("val/loss", 4, 2.75, 1700000001.0);
    tb.add_scalars(5, {});  // nothing to write
  }
  CHECK(path.filename().string().starts_with("events.out.tfevents."));
  const auto recs = records(read_file(path));
  REQUIRE(recs.size() == 3);
  CHECK(recs[0].find("brain.Event:2") != std::string::npos);
  CHECK(recs[1] == tensorboard_scalars_event(3, 1700000000.25, {{"train/loss", 2.5}, {"train/lr", 0.0}}));
  CHECK(recs[2] == tensorboard_scalars_event(4, 1700000001.0, {{"val/loss", 2.75}}));
  // A zero must be on the wire (in a oneof), or TensorBoard would see a value without data:
  // the lr value is tag 2, wire type 5 (fixed32) = 0x15, then four zero bytes.
  CHECK(recs[1].find(std::string("\x15\0\0\0\0", 5)) != std::string::npos);
}

TEST_CASE("a resumed run's file starts with a session start at its first step (TensorBoard's purge)") {
  TempDir dir("tensorboard_purge");
  fs::path path;
  {
    TensorBoardWriter tb(dir.path, 9);
    path = tb.path();
    tb.add_scalar("train/loss", 9, 3.0, 1700000002.0);
  }
  const auto recs = records(read_file(path));
  REQUIRE(recs.size() == 3);
  CHECK(recs[0].find("brain.Event:2") != std::string::npos);
  // wall_time (field 1, fixed64), step 9 (field 2: 0x10 0x09), session_log (field 7,
  // length-delimited: 0x3a, 2 bytes) holding status START (field 1: 0x08 0x01), as
  // tensorboard/compat/proto/event.proto numbers them.
  CHECK(recs[1].size() == 9 + 2 + 4);
  CHECK(recs[1].ends_with(std::string("\x10\x09\x3a\x02\x08\x01", 6)));
  CHECK(recs[2] == tensorboard_scalars_event(9, 1700000002.0, {{"train/loss", 3.0}}));
  // A fresh run's file has none.
  TempDir fresh("tensorboard_fresh");
  TensorBoardWriter tb(fresh.path);
  CHECK(records(read_file(tb.path())).size() == 1);
}

TEST_CASE("a stats snapshot becomes busy shares, item rates and queue occupancy") {
  Snapshot s;
  StageStats a;
  a.name = "tokenize";
  a.window_busy = 0.75;
  a.window_items_per_s = 120;
  s.stages.push_back(a);
  QueueStats q;
  q.consumer = "pack";
  q.capacity = 8;
  q.window_mean = 2;
  s.queues.push_back(q);
  auto sc = snapshot_scalars(s);
  REQUIRE(sc.size() == 3);
  CHECK(sc[0] == std::pair<std::string, double>{"stage_busy/tokenize", 0.75});
  CHECK(sc[1] == std::pair<std::string, double>{"stage_items_per_s/tokenize", 120});
  CHECK(sc[2] == std::pair<std::string, double>{"queue_occupancy/pack", 0.25});

  // A stage that sleeps on the device (log on a GPU) gets its device-wait share beside its busy one.
  StageStats log;
  log.name = "log";
  log.window_busy = 0.02;
  log.device_wait_s = 4;
  log.window_device_wait = 0.95;
  s.stages.push_back(log);
  sc = snapshot_scalars(s);
  REQUIRE(sc.size() == 6);
  CHECK(sc[2] == std::pair<std::string, double>{"stage_busy/log", 0.02});
  CHECK(sc[3] == std::pair<std::string, double>{"stage_device_wait/log", 0.95});
  CHECK(sc[4].first == "stage_items_per_s/log");
}
