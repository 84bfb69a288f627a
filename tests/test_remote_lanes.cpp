// A run's lanes read through remote stores (issue 37 on issue 38's data order): the same datasets
// served by rclone's S3 and nginx's HTTPS, read by the lanes with the fetch threads ahead of them,
// give every lane the same documents and tokens as the local copy; the units come from the cache;
// two ranks each fetch only their own lanes' units; a lane resumed in the middle of a unit reads
// on as the uninterrupted one, fetching again at most that unit; faults on the way change no
// token. Servers that are not installed skip their cases, saying why.
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

#include "datasets/dataset_error.h"
#include "datasets/io/store.h"
#include "datasets/lanes/data_order.h"
#include "datasets/lanes/document_lanes.h"
#include "datasets/lanes/fetch_plan.h"
#include "datasets/lanes/token_lanes.h"
#include "datasets/plan/data_plan.h"
#include "datasets/prepare/prepare.h"
#include "remote_servers.h"
#include "test_util.h"

using namespace pipeline::datasets;
using test_util::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr uint32_t kLanes = 4;

void write_corpus(const fs::path& file, size_t count) {
  std::string text;
  for (size_t i = 0; i < count; ++i) {
    text += "document " + std::to_string(i) + ":";
    for (size_t w = 0; w < 5 + (i * 7919) % 90; ++w) text += " word" + std::to_string((i * w) % 97);
    text += "\n\n";
  }
  test_util::write_file(file, text);
}

// Block shards of text (small blocks: many units) and llm.c shards, prepared into the served tree.
struct Served {
  TempDir dir{"remote_lanes"};
  fs::path root = dir.path / "srv";
  Served() {
    fs::create_directories(root / "lanes");
    write_corpus(dir.path / "corpus.txt", 600);
    PrepareOptions text;
    text.out_dir = root / "lanes" / "blocks";
    text.block_bytes = 2048;
    text.val_fraction = 0;
    prepare_dataset({dir.path / "corpus.txt"}, text);
    PrepareOptions llmc;
    llmc.out_dir = root / "lanes" / "llmc";
    llmc.llmc = true;
    llmc.llmc_prefix = "data";
    llmc.shard_size = 16 << 10;
    llmc.val_fraction = 0;
    prepare_dataset({dir.path / "corpus.txt"}, llmc);
    // Parquet, as the Hub lays it out (data/*.parquet), in row groups of 25 rows, with pyarrow.
    const std::string python = PIPELINE_ARROW_PYTHON;
    if (!python.empty()) {
      const auto r = test_util::shell(
          python + " -c \"import pyarrow as pa, pyarrow.parquet as pq, os, sys\n"
                   "d = sys.argv[1]; os.makedirs(d, exist_ok=True)\n"
                   "for f in range(3):\n"
                   "    docs = ['parquet document %d.%d: ' % (f, i) + 'word ' * (i % 37) for i in range(120)]\n"
                   "    pq.write_table(pa.table({'text': docs}), os.path.join(d, 'part_%d.parquet' % f), row_group_size=25)\n\" " +
          (root / "lanes" / "pq" / "data").string() + " 2>&1");
      parquet = r.code == 0 ? "" : "pyarrow could not write the Parquet files: " + r.out;
    } else {
      parquet = "a build without Parquet (PIPELINE_WITH_PARQUET=OFF)";
    }
  }
  std::string parquet;  // why the Parquet case cannot run ("" : it runs)
  std::string local(const std::string& name) const { return (root / "lanes" / name).string(); }
};

Served& served() {
  static Served s;
  return s;
}

const std::string kKey = "AKIDLANES", kSecret = "LANESsecret123456";

remote_test::RcloneS3& rclone() {
  static remote_test::RcloneS3 s(served().root, served().dir.path / "rclone.log", kKey, kSecret);
  return s;
}

remote_test::NginxHttps& nginx() {
  static remote_test::NginxHttps s(served().root, served().dir.path / "nginx");
  return s;
}

io::StoreOptions s3_store(const std::string& endpoint, const fs::path& cache) {
  io::StoreOptions o;
  o.endpoint = endpoint;
  o.allow_http = true;
  o.cache_dir = cache;
  o.cache_bytes = 64 << 10;
  o.prefetch = 6;
  o.connections = 3;
  o.retry_for_s = 60;
  o.env = test_util::env_of({{"HOME", served().dir.path.string()}, {"AWS_ACCESS_KEY_ID", kKey},
                             {"AWS_SECRET_ACCESS_KEY", kSecret}});
  return o;
}

io::StoreOptions https_store(const fs::path& cache) {
  io::StoreOptions o;
  o.cache_dir = cache;
  o.env = test_util::env_of({{"HOME", served().dir.path.string()}, {"SSL_CERT_FILE", nginx().ca_file.string()}});
  return o;
}

// Bytes of lane `lane`'s units from its n-th on, to its last (the orders here do not loop).
uint64_t lane_bytes(const OrderSource& s, uint32_t lane, uint64_t from = 0) {
  uint64_t bytes = 0;
  for (uint64_t n = from;; ++n) {
    const auto p = s.plan.lane_unit(lane, n);
    if (!p) return bytes;
    bytes += s.catalog->units[p->unit].bytes;
  }
}

// Every lane's documents, in order, as the lanes of one rank read them (all lanes: one rank).
std::map<uint32_t, std::vector<std::string>> documents(DataOrder& order, const std::vector<LaneCursor>& cursors,
                                                       size_t per_lane) {
  fetch_ahead(order, cursors);
  DocumentLanes lanes(order, cursors);
  std::map<uint32_t, std::vector<std::string>> out;
  for (size_t round = 0; round < per_lane; ++round)
    for (size_t i = 0; i < lanes.size(); ++i) {
      std::string_view doc;
      LanePlace place;
      if (lanes.next(i, doc, place)) out[lanes.lane(i)].emplace_back(doc);
    }
  return out;
}

std::map<uint32_t, std::vector<uint16_t>> tokens(DataOrder& order, const std::vector<LaneCursor>& cursors, size_t per_lane) {
  fetch_ahead(order, cursors);
  TokenLanes lanes(order, cursors);
  std::map<uint32_t, std::vector<uint16_t>> out;
  std::vector<uint16_t> buf(97);
  for (size_t i = 0; i < lanes.size(); ++i)
    while (out[lanes.lane(i)].size() < per_lane) {
      LanePlace place;
      const size_t n = lanes.read(i, buf, place);
      if (n == 0) break;
      out[lanes.lane(i)].insert(out[lanes.lane(i)].end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n));
    }
  return out;
}

DataOrderOptions order_options(const io::StoreOptions& store = {}) {
  DataOrderOptions o;
  o.lanes = kLanes;
  o.seed = 5;
  o.loop = false;
  o.store = store;
  o.llmc_unit_tokens = 512;
  return o;
}

}  // namespace

TEST_CASE("block shards through S3 and HTTPS: every lane reads the local copy's documents, from the cache") {
  SKIP_UNLESS(rclone());
  TempDir cache("cache");
  DataOrder local = open_data_order({{served().local("blocks")}}, order_options());
  const auto all = lanes_of(0, 1, kLanes);
  const auto want = documents(local, start_cursors(local, all), 1000);
  REQUIRE(want.size() == kLanes);
  DataOrder s3 = open_data_order({{"s3://lanes/blocks"}}, order_options(s3_store(rclone().endpoint(), cache.path)));
  CHECK(s3.sources[0].catalog->units.size() == local.sources[0].catalog->units.size());
  CHECK(documents(s3, start_cursors(s3, all), 1000) == want);
  const io::FetchStats f = s3.sources[0].store->fetch_stats();
  MESSAGE("S3: " << f.units << " units ahead, hits " << f.hit_bytes << " B, misses " << f.miss_bytes << " B, cache high water "
                 << f.cache_high_water << " B of " << f.cache_cap);
  uint64_t unit_bytes = 0;
  for (const Unit& u : s3.sources[0].catalog->units) unit_bytes += u.bytes;
  CHECK(f.units > 0);
  // Every block was read, from the cache where the fetch threads were ahead of the lanes and on
  // demand where not (how many of each depends on the machine's speed: under TSan, fewer hits).
  CHECK(f.hit_bytes > 0);
  CHECK(f.hit_bytes + f.miss_bytes >= unit_bytes);
  CHECK(f.cache_high_water <= f.cache_cap + 4096);  // the cap, and never more than a unit over
  SKIP_UNLESS(nginx());
  DataOrder https = open_data_order({{nginx().base() + "/lanes/blocks/"}}, order_options(https_store(cache.path)));
  CHECK(documents(https, start_cursors(https, all), 1000) == want);
}

TEST_CASE("llm.c shards through S3: every lane reads the local copy's tokens") {
  SKIP_UNLESS(rclone());
  TempDir cache("cache");
  DataOrder local = open_data_order({{served().local("llmc")}}, order_options());
  const auto all = lanes_of(0, 1, kLanes);
  const auto want = tokens(local, start_cursors(local, all), 5000);
  DataOrder s3 = open_data_order({{"s3://lanes/llmc"}}, order_options(s3_store(rclone().endpoint(), cache.path)));
  CHECK(tokens(s3, start_cursors(s3, all), 5000) == want);
  CHECK(s3.sources[0].store->fetch_stats().hit_bytes > 0);
}

TEST_CASE("Parquet through S3 and HTTPS (a brace pattern of the Hub's kind): every lane reads the local copy's rows") {
  if (!served().parquet.empty()) {
    MESSAGE("skipped: " << served().parquet);
    return;
  }
  SKIP_UNLESS(rclone());
  TempDir cache("cache");
  DataOrder local = open_data_order({{served().local("pq")}}, order_options());
  CHECK(local.sources[0].catalog->format == SourceFormat::parquet);
  const auto all = lanes_of(0, 1, kLanes);
  const auto want = documents(local, start_cursors(local, all), 1000);
  DataOrder s3 = open_data_order({{"s3://lanes/pq"}}, order_options(s3_store(rclone().endpoint(), cache.path)));
  CHECK(documents(s3, start_cursors(s3, all), 1000) == want);
  CHECK(s3.sources[0].store->fetch_stats().hit_bytes > 0);
  SKIP_UNLESS(nginx());
  DataOrder https = open_data_order({{nginx().base() + "/redirect/lanes/pq/data/part_{0..2}.parquet"}},
                                    order_options(https_store(cache.path)));
  CHECK(documents(https, start_cursors(https, all), 1000) == want);
}

TEST_CASE("two ranks fetch only their own lanes' units") {
  SKIP_UNLESS(rclone());
  TempDir cache0("cache0"), cache1("cache1");
  DataOrder local = open_data_order({{served().local("blocks")}}, order_options());
  uint64_t total = 0;
  for (const Unit& u : local.sources[0].catalog->units) total += u.bytes;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    DataOrder s3 = open_data_order({{"s3://lanes/blocks"}},
                                   order_options(s3_store(rclone().endpoint(), rank == 0 ? cache0.path : cache1.path)));
    const auto mine = lanes_of(rank, 2, kLanes);
    const auto got = documents(s3, start_cursors(s3, mine), 1000);
    const auto want = documents(local, start_cursors(local, mine), 1000);
    CHECK(got == want);
    // The bytes of this rank's units, each lane's whole share of the epoch.
    uint64_t own = 0;
    for (uint32_t lane : mine) own += lane_bytes(s3.sources[0], lane);
    const io::FetchStats f = s3.sources[0].store->fetch_stats();
    const uint64_t units_bytes = f.hit_bytes;  // what the lanes read of the units, from the cache
    MESSAGE("rank " << rank << ": own units " << own << " B of " << total << " B; hits " << f.hit_bytes << " B, downloaded "
                    << f.bytes << " B");
    CHECK(units_bytes <= own);
    CHECK(f.bytes < own + (total - own) / 2);  // the other rank's units were not fetched
  }
}

TEST_CASE("a lane resumed in the middle of a unit reads on as before, fetching again at most that unit") {
  SKIP_UNLESS(rclone());
  TempDir cache("cache");
  DataOrder local = open_data_order({{served().local("blocks")}}, order_options());
  const auto all = lanes_of(0, 1, kLanes);
  const auto whole = documents(local, start_cursors(local, all), 1000);
  // Lane 1's cursor: its third unit, two documents in.
  const uint64_t n = 2, skip = 2;
  uint64_t before = 0;
  for (uint64_t k = 0; k < n; ++k)
    before += local.sources[0].catalog->units[local.sources[0].plan.lane_unit(1, k)->unit].documents;
  LaneCursor c = LaneCursor::start(1, 1);
  c.draws = before + skip;
  c.sources[0] = {n, skip};
  DataOrder s3 = open_data_order({{"s3://lanes/blocks"}}, order_options(s3_store(rclone().endpoint(), cache.path)));
  const auto resumed = documents(s3, {c}, 1000);
  REQUIRE(resumed.count(1));
  const std::vector<std::string> rest(whole.at(1).begin() + static_cast<std::ptrdiff_t>(before + skip), whole.at(1).end());
  CHECK(resumed.at(1) == rest);
  // What was fetched: lane 1's units from its cursor's on, nothing before it.
  const uint64_t from_cursor = lane_bytes(s3.sources[0], 1, n);
  const io::FetchStats f = s3.sources[0].store->fetch_stats();
  CHECK(f.hit_bytes <= from_cursor);
  CHECK(f.units <= s3.sources[0].plan.lane_units_per_epoch(1) - n);
}

TEST_CASE("faults between the lanes and S3 (resets mid-body, 503 bursts) change no document") {
  SKIP_UNLESS(rclone());
  TempDir cache("cache");
  DataOrder local = open_data_order({{served().local("blocks")}}, order_options());
  const auto all = lanes_of(0, 1, kLanes);
  const auto want = documents(local, start_cursors(local, all), 1000);
  remote_test::FaultProxy proxy(rclone().port);
  DataOrder s3 = open_data_order({{"s3://lanes/blocks"}},
                                 order_options(s3_store("http://127.0.0.1:" + std::to_string(proxy.port()), cache.path)));
  proxy.cut_all();
  proxy.reset_after_bytes = 1500;
  proxy.reset_next = 6;
  proxy.fail_next_503 = 6;
  CHECK(documents(s3, start_cursors(s3, all), 1000) == want);
  CHECK(s3.sources[0].store->fetch_stats().retries > 0);
  CHECK(proxy.faulted.load() >= 6);
}
