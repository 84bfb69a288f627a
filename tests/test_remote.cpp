// Remote stores (datasets/io) against real servers on loopback, started here: rclone's and moto's
// S3, nginx's HTTPS (ranges, a redirect, a certificate made here), and a proxy that injects faults
// between them and the stores. What is proved: a remote file reads byte for byte as the local one
// through every server; listings, list files, brace patterns and manifests name the files; every
// bad input is a clear error naming what to set and no secret; faults (resets mid-body, 503
// bursts, an outage) cost time but never a wrong byte; the cache is shared by two processes with
// one download per unit and holds its cap; the fetch threads fill it in the plan's order.
// A server that is not installed here skips its tests, saying why.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "datasets/dataset_error.h"
#include "datasets/io/cache.h"
#include "datasets/io/credentials.h"
#include "datasets/io/store.h"
#include "datasets/io/url.h"
#include "remote_servers.h"
#include "test_util.h"

using namespace pipeline::datasets;
using test_util::contains;
using test_util::error_of;
using test_util::TempDir;
namespace fs = std::filesystem;

namespace {

// A secret recognisable anywhere it might leak to.
const std::string kKey = "AKIDPLANTED0001";
const std::string kSecret = "PLANTEDSECRETxq7Zk9Wm3";

std::string random_bytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

void put(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string read_all(io::Store& store, const io::ObjectInfo& info, size_t piece = 70001) {
  auto f = store.open(info);
  std::string out(info.size, '\0');
  for (uint64_t at = 0; at < info.size; at += piece) f->read_at(at, out.data() + at, piece);
  return out;
}

// The served tree: bucket "data" (rclone serves each folder as a bucket).
struct Tree {
  TempDir dir{"remote"};
  fs::path root = dir.path / "srv";
  std::string a = random_bytes(300000, 1), b = random_bytes(12345, 2), c = random_bytes(70000, 3);
  Tree() {
    put(root / "data" / "set" / "a.bin", a);
    put(root / "data" / "set" / "sub" / "b.bin", b);
    put(root / "data" / "set" / ".hidden", "x");
    put(root / "data" / "other" / "c.bin", c);
    put(root / "data" / "list.txt", "# the files\nset/a.bin\n\n  other/c.bin  \n");
    put(root / "data" / "folder" / "manifest.json", "{}");
    put(root / "units" / "blob.bin", blob);
    put(root / "data" / "changing" / "x.bin", random_bytes(5000, 11));
  }
  static constexpr size_t kUnit = 64 * 1024, kUnits = 24;
  std::string blob = random_bytes(kUnit * kUnits, 7);
};

Tree& tree() {
  static Tree t;
  return t;
}

remote_test::RcloneS3& rclone() {
  static remote_test::RcloneS3 s(tree().root, tree().dir.path / "rclone.log", kKey, kSecret);
  return s;
}

remote_test::NginxHttps& nginx() {
  static remote_test::NginxHttps s(tree().root, tree().dir.path / "nginx");
  return s;
}

io::EnvLookup env_with(std::map<std::string, std::string> vars) {
  vars.emplace("HOME", tree().dir.path.string());  // no ~/.aws of the machine's
  return test_util::env_of(std::move(vars));
}

io::StoreOptions s3_options(const std::string& endpoint, const fs::path& cache, std::string secret = kSecret) {
  io::StoreOptions o;
  o.endpoint = endpoint;
  o.allow_http = true;
  o.cache_dir = cache;
  o.retry_for_s = 20;
  o.env = env_with({{"AWS_ACCESS_KEY_ID", kKey}, {"AWS_SECRET_ACCESS_KEY", std::move(secret)}});
  return o;
}

// A store of bucket "data" reached through `proxy` (in front of rclone), trying again for `retry_for_s`.
std::unique_ptr<io::Store> proxied_store(const remote_test::FaultProxy& proxy, const fs::path& cache, double retry_for_s) {
  auto o = s3_options("http://127.0.0.1:" + std::to_string(proxy.port()), cache);
  o.retry_for_s = retry_for_s;
  return io::open_store("s3://data/set", o);
}

io::StoreOptions https_options(const fs::path& cache) {
  io::StoreOptions o;
  o.cache_dir = cache;
  o.retry_for_s = 20;
  o.env = env_with({{"SSL_CERT_FILE", nginx().ca_file.string()}});
  return o;
}

}  // namespace

TEST_CASE("remote URLs: forms, redaction, brace patterns and list files") {
  auto u = io::parse_remote_url("s3://my-bucket/fineweb/train");
  CHECK(u.scheme == "s3");
  CHECK(u.host == "my-bucket");
  CHECK(u.path == "fineweb/train");
  CHECK(u.text() == "s3://my-bucket/fineweb/train");
  auto h = io::parse_remote_url("hf://datasets/HuggingFaceFW/fineweb-edu/sample/10BT/000_00000.parquet",
                                {"https://mirror.example:8443/hub"});
  CHECK(h.text() == "https://mirror.example:8443/hub/datasets/HuggingFaceFW/fineweb-edu/resolve/main/sample/10BT/000_00000.parquet");
  CHECK(io::parse_remote_url("hf://datasets/o/n@v1.0/x.parquet").path == "/datasets/o/n/resolve/v1.0/x.parquet");
  auto q = io::parse_remote_url("https://cdn.example/f.parquet?X-Amz-Signature=SECRET123&x=1");
  CHECK(q.redacted() == "https://cdn.example/f.parquet?<redacted>");
  CHECK(io::redact_urls("GET https://u:pw@h.example/p?token=SECRET123 failed; see http://x/y") ==
        "GET https://h.example/p?<redacted> failed; see http://x/y");
  CHECK(contains(error_of([] { io::parse_remote_url("https://user:SECRET123@host/x"); }), "~/.netrc"));
  CHECK(!contains(error_of([] { io::parse_remote_url("https://user:SECRET123@host/x"); }), "SECRET123"));
  CHECK(contains(error_of([] { io::parse_remote_url("s3://A_B/x"); }), "not an S3 bucket name"));
  CHECK(contains(error_of([] { io::parse_remote_url("ftp://h/x"); }), "not read"));
  CHECK(contains(error_of([] { io::parse_remote_url("https://h/a b"); }), "printable ASCII"));
  CHECK(contains(error_of([] { io::parse_remote_url("https://h/a/../b"); }), "'..'"));
  // hf:// splices its parts into a path: a query or a dot segment there would not parse back.
  CHECK(contains(error_of([] { io::parse_remote_url("hf://datasets/o/.?w.x"); }), "no query string"));
  CHECK(contains(error_of([] { io::parse_remote_url("hf://datasets/o/n@../x"); }), "'..'"));
  CHECK(contains(error_of([] { io::parse_remote_url("hf://datasets/o/./x"); }), "'.'"));
  // Text after a printed query is the URL's: printing again changes nothing.
  CHECK(io::redact_urls("see https://h/a#frag?<redacted>tail and more") == "see https://h/a and more");
  CHECK(io::redact_urls("see https://h/a?<redacted>tail") == "see https://h/a?<redacted>");

  CHECK(io::expand_braces("f_{008..011}.bin") == std::vector<std::string>{"f_008.bin", "f_009.bin", "f_010.bin", "f_011.bin"});
  CHECK(io::expand_braces("{a,b}/{1..2}") == std::vector<std::string>{"a/1", "a/2", "b/1", "b/2"});
  CHECK(contains(error_of([] { io::expand_braces("x{3..1}"); }), "backwards"));
  CHECK(contains(error_of([] { io::expand_braces("x{1..9}", 5); }), "more than 5"));
  CHECK(contains(error_of([] { io::expand_braces("x{1..2"); }), "without its '}'"));

  auto list = io::parse_remote_url("https://h.example/d/list.txt");
  auto names = io::parse_list_file("# c\n a.bin \n\nsub/b.bin\r\nhttps://h.example/e/c.bin\n", list);
  REQUIRE(names.size() == 3);
  CHECK(names[0].text() == "https://h.example/d/a.bin");
  CHECK(names[1].text() == "https://h.example/d/sub/b.bin");
  CHECK(names[2].text() == "https://h.example/e/c.bin");
  CHECK(contains(error_of([&] { io::parse_list_file("a\na\n", list); }), "line 2"));
  CHECK(contains(error_of([&] { io::parse_list_file("https://other.example/x\n", list); }), "same server"));
  CHECK(contains(error_of([&] { io::parse_list_file("# only\n", list); }), "names no file"));
}

TEST_CASE("S3 settings and keys: [data], the environment and the AWS files, never a key printed") {
  TempDir home("aws");
  put(home.path / ".aws" / "credentials",
      "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = " + kSecret + "\n; a comment\n"
      "[minio]\naws_access_key_id=AKIDMINIO\naws_secret_access_key=" + kSecret + "\naws_session_token=" +
          std::string(1500, 'T') + "\n");
  put(home.path / ".aws" / "config", "[profile minio]\nregion = eu-west-3\nendpoint_url = http://127.0.0.1:9000\n");
  auto env = test_util::env_of({{"HOME", home.path.string()}});
  auto a = io::resolve_s3_access({}, env);
  CHECK(a.key_id == "AKIDDEFAULT");
  CHECK(a.endpoint == "https://s3.us-east-1.amazonaws.com");
  CHECK(!a.path_style);
  auto m = io::resolve_s3_access({.profile = "minio"}, env);
  CHECK(m.key_id == "AKIDMINIO");
  CHECK(m.session_token.reveal().size() == 1500);  // a line of any length
  CHECK(m.region == "eu-west-3");
  CHECK(m.endpoint == "http://127.0.0.1:9000");
  CHECK(m.path_style);
  CHECK(!contains(m.describe(), kSecret));
  CHECK(contains(m.describe(), "profile 'minio'"));
  // The environment's keys win over the default profile; [data] keys over the environment's.
  auto e = io::resolve_s3_access({.endpoint = "https://r2.example", .region = "auto"},
                                 test_util::env_of({{"HOME", home.path.string()}, {"AWS_ACCESS_KEY_ID", "AKIDENV"},
                                                    {"AWS_SECRET_ACCESS_KEY", kSecret}, {"AWS_REGION", "us-west-2"}}));
  CHECK(e.key_id == "AKIDENV");
  CHECK(e.region == "auto");
  CHECK(e.region_from == "[data] region");
  CHECK(e.endpoint == "https://r2.example");
  CHECK(contains(error_of([&] { io::resolve_s3_access({.profile = "nope"}, env); }), "'nope'"));
  CHECK(contains(error_of([&] {
          io::resolve_s3_access({}, test_util::env_of({{"HOME", home.path.string()}, {"AWS_ACCESS_KEY_ID", "X"}}));
        }),
        "without AWS_SECRET_ACCESS_KEY"));
  put(home.path / "bad", "[default\naws_secret_access_key = " + kSecret + "\n");
  const auto bad = error_of([&] {
    io::resolve_s3_access({}, test_util::env_of({{"HOME", home.path.string()},
                                                 {"AWS_SHARED_CREDENTIALS_FILE", (home.path / "bad").string()}}));
  });
  CHECK(contains(bad, "not an AWS credentials/config file"));
  CHECK(!contains(bad, kSecret));
  CHECK(contains(error_of([&] { io::resolve_s3_access({.endpoint = "s3.example.com"}, env); }), "[data] endpoint"));
  // The Hub's token goes to the Hub (or HF_ENDPOINT's host) only.
  auto hf = test_util::env_of({{"HF_TOKEN", "hf_SECRET"}, {"HF_ENDPOINT", "https://mirror.example"}});
  CHECK(io::http_token_for("mirror.example", hf).reveal() == "hf_SECRET");
  CHECK(io::http_token_for("huggingface.co", hf).empty());
  CHECK(io::http_token_for("huggingface.co", test_util::env_of({{"HF_TOKEN", "t"}})).reveal() == "t");
}

TEST_CASE("S3 through rclone serve s3: list, stat and ranged reads byte for byte") {
  SKIP_UNLESS(rclone());
  TempDir cache("cache");
  auto store = io::open_store("s3://data/set", s3_options(rclone().endpoint(), cache.path));
  CHECK(store->remote());
  CHECK(contains(store->describe(), "path-style"));
  CHECK(!contains(store->describe(), kSecret));
  const auto files = store->list("s3://data/set");
  REQUIRE(files.size() == 2);  // the hidden name left out, the sub-folder in
  CHECK(files[0].uri == "s3://data/set/a.bin");
  CHECK(files[0].size == tree().a.size());
  CHECK(!files[0].version.empty());
  CHECK(files[1].uri == "s3://data/set/sub/b.bin");
  CHECK(read_all(*store, files[0]) == tree().a);
  CHECK(read_all(*store, files[1], 1000) == tree().b);
  // A single object lists as itself; stat agrees with the listing.
  const auto one = store->list("s3://data/other/c.bin");
  REQUIRE(one.size() == 1);
  CHECK(store->stat("s3://data/other/c.bin").version == one[0].version);
  const auto s = store->fetch_stats();
  CHECK(s.miss_bytes == tree().a.size() + tree().b.size());  // no plan: every read on demand
  CHECK(s.bytes >= s.miss_bytes);
}

TEST_CASE("S3 refusals are clear, name what to set, and never print a key") {
  SKIP_UNLESS(rclone());
  TempDir cache("cache");
  auto wrong = io::open_store("s3://data/set", s3_options(rclone().endpoint(), cache.path, "WRONGwrongWRONG"));
  const auto denied = error_of([&] { wrong->list("s3://data/set"); });
  CHECK(contains(denied, "403"));
  CHECK(contains(denied, "AWS_SECRET_ACCESS_KEY"));
  CHECK(!contains(denied, "WRONGwrongWRONG"));
  auto store = io::open_store("s3://data/set", s3_options(rclone().endpoint(), cache.path));
  const auto no_bucket = error_of([&] { store->list("s3://nobucket/x"); });
  CHECK(contains(no_bucket, "bucket"));
  CHECK(contains(error_of([&] { store->stat("s3://data/set/missing.bin"); }), "no such object"));
  CHECK(contains(error_of([&] { store->list("s3://data/none/"); }), "no objects"));
  // Plain HTTP only when asked for; nothing listening is named as such, before any retry.
  auto o = s3_options(rclone().endpoint(), cache.path);
  o.allow_http = false;
  CHECK(contains(error_of([&] { io::open_store("s3://data/set", o); }), "allow_http"));
  auto gone = io::open_store("s3://data/set", s3_options("http://127.0.0.1:" + std::to_string(test_util::free_port()), cache.path));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(contains(error_of([&] { gone->list("s3://data/set"); }), "nothing answers"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  auto dns = io::open_store("s3://data/set", s3_options("http://no-such-host.invalid:9000", cache.path));
  CHECK(contains(error_of([&] { dns->list("s3://data/set"); }), "does not resolve"));
}

TEST_CASE("S3 through moto_server, a second implementation, reads the same bytes") {
  TempDir log("moto");
  remote_test::MotoS3 moto(log.path / "moto.log");
  SKIP_UNLESS(moto);
  REQUIRE(moto.upload("moto-data", tree().root / "data" / "set"));
  TempDir cache("cache");
  auto store = io::open_store("s3://moto-data", s3_options(moto.endpoint(), cache.path));
  const auto files = store->list("s3://moto-data");
  REQUIRE(files.size() == 2);
  CHECK(files[0].uri == "s3://moto-data/a.bin");
  CHECK(read_all(*store, files[0]) == tree().a);
  CHECK(read_all(*store, files[1]) == tree().b);
}

TEST_CASE("HTTPS through nginx: ranges, a redirect, brace patterns, list files and manifests") {
  SKIP_UNLESS(nginx());
  TempDir cache("cache");
  const std::string base = nginx().base();
  auto store = io::open_store(base + "/data/set/a.bin", https_options(cache.path));
  auto a = store->stat(base + "/data/set/a.bin");
  CHECK(a.size == tree().a.size());
  CHECK(!a.version.empty());
  CHECK(read_all(*store, a) == tree().a);
  // Through a redirect, as the Hub's resolve/ URLs.
  auto r = store->stat(base + "/redirect/data/other/c.bin");
  CHECK(r.size == tree().c.size());
  CHECK(read_all(*store, r) == tree().c);
  auto braces = store->list(base + "/data/{set/a,other/c}.bin");
  REQUIRE(braces.size() == 2);
  CHECK(braces[1].uri == base + "/data/set/a.bin");
  auto listed = store->list(base + "/data/list.txt");
  REQUIRE(listed.size() == 2);
  CHECK(listed[0].uri == base + "/data/other/c.bin");
  auto manifest = store->list(base + "/data/folder");
  REQUIRE(manifest.size() == 1);
  CHECK(manifest[0].uri == base + "/data/folder/manifest.json");
  CHECK(contains(error_of([&] { store->list(base + "/data/set"); }), "HTTP cannot list a folder"));
  CHECK(contains(error_of([&] { store->stat(base + "/data/missing.bin"); }), "404"));
  // Plain http:// is refused unless asked for; a query string in a source is a credential.
  CHECK(contains(error_of([&] { io::open_store(nginx().http_base() + "/data/set/a.bin", https_options(cache.path)); }),
                 "allow_http"));
  auto o = https_options(cache.path);
  o.allow_http = true;
  auto plain = io::open_store(nginx().http_base() + "/data/set/a.bin", o);
  CHECK(read_all(*plain, plain->stat(nginx().http_base() + "/data/set/a.bin")) == tree().a);
  const auto q = error_of([&] { io::open_store(base + "/data/x.bin?token=SECRET123", https_options(cache.path)); });
  CHECK(contains(q, "query string"));
  CHECK(!contains(q, "SECRET123"));
  // A certificate no CA here vouches for: a clear error, at once, naming what to set.
  io::StoreOptions untrusted;
  untrusted.cache_dir = cache.path;
  untrusted.env = env_with({});
  auto bad_tls = io::open_store(base + "/data/set/a.bin", untrusted);
  CHECK(contains(error_of([&] { bad_tls->stat(base + "/data/set/a.bin"); }), "SSL_CERT_FILE"));
}

TEST_CASE("the fetch threads fill the cache in the plan's order; reads hit, consumed units go, the cap holds") {
  SKIP_UNLESS(rclone());
  TempDir cache("cache");
  const size_t unit = Tree::kUnit, units = Tree::kUnits;
  const std::string& blob = tree().blob;
  auto o = s3_options(rclone().endpoint(), cache.path);
  o.cache_bytes = 3 * unit;
  o.prefetch = 8;
  o.connections = 4;
  auto store = io::open_store("s3://units/blob.bin", o);
  const auto info = store->stat("s3://units/blob.bin");
  // Two lanes: lane 0 reads the even units, lane 1 the odd ones, each in order.
  std::vector<io::LaneUnits> lanes;
  for (size_t l = 0; l < 2; ++l)
    lanes.push_back([=, n = l]() mutable -> std::optional<io::UnitRef> {
      if (n >= units) return std::nullopt;
      io::UnitRef u{info, n * unit, unit};
      n += 2;
      return u;
    });
  store->prefetch(std::move(lanes));
  auto f = store->open(info);
  std::string got(unit, '\0');
  for (size_t n = 0; n < units; ++n) {
    f->read_at(n * unit, got.data(), unit);
    REQUIRE(got == blob.substr(n * unit, unit));
  }
  const auto s = store->fetch_stats();
  CHECK(s.hit_bytes + s.miss_bytes == blob.size());
  CHECK(s.hit_bytes > 0);  // units came from the cache (how many depends on the machine's speed)
  CHECK(s.cache_high_water <= o.cache_bytes + unit);  // never over the cap by more than one unit
  MESSAGE("hits " << s.hit_bytes << " misses " << s.miss_bytes << " cache high water " << s.cache_high_water);
  store.reset();
  // Consumed units were let go: nothing is left of them.
  io::UnitCache after(cache.path, o.cache_bytes);
  CHECK(after.bytes() == 0);
}

TEST_CASE("two processes share the cache: one download per unit, never a half-written one") {
  TempDir cache("shared");
  const io::UnitKey key{"s3://b/k", "etag1", 0, 1 << 20};
  const std::string bytes = random_bytes(key.length, 9);
  std::atomic<int> downloads{0};
  auto download = [&](int fd) {
    downloads++;
    // Slowly, in pieces: a reader that came early would see a part.
    for (size_t at = 0; at < bytes.size(); at += 65536) {
      REQUIRE(::pwrite(fd, bytes.data() + at, 65536, static_cast<off_t>(at)) == 65536);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  const pid_t child = ::fork();
  if (child == 0) {
    io::UnitCache c(cache.path, 8 << 20);
    bool did = false;
    auto e = c.get(key, download, nullptr, &did);
    std::string read(key.length, '\0');
    const bool same = ::pread(e->fd(), read.data(), read.size(), 0) == static_cast<ssize_t>(read.size()) && read == bytes;
    e->keep();
    ::_exit(same ? (did ? 10 : 11) : 1);
  }
  io::UnitCache c(cache.path, 8 << 20);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  bool did = false;
  auto e = c.get(key, download, nullptr, &did);
  std::string read(key.length, '\0');
  REQUIRE(::pread(e->fd(), read.data(), read.size(), 0) == static_cast<ssize_t>(read.size()));
  CHECK(read == bytes);
  const int code = test_util::wait_exit(child, std::chrono::seconds(30));
  REQUIRE((code == 10 || code == 11));
  CHECK(did + (code == 10 ? 1 : 0) == 1);  // exactly one of the two downloaded it
  CHECK(c.bytes() == key.length);
  e.reset();
  CHECK(c.bytes() == 0);  // the last holder lets it go
}

TEST_CASE("faults: resets mid-body, 503 bursts and an outage cost retries, never a wrong byte") {
  SKIP_UNLESS(rclone());
  TempDir cache("cache");
  remote_test::FaultProxy proxy(rclone().port);
  auto store = proxied_store(proxy, cache.path, 60);
  const auto a = store->stat("s3://data/set/a.bin");
  proxy.cut_all();
  proxy.reset_next = 3;
  proxy.reset_after_bytes = 150000;  // inside a's body
  CHECK(read_all(*store, a, a.size) == tree().a);
  proxy.cut_all();
  proxy.fail_next_503 = 4;
  CHECK(read_all(*store, a, a.size) == tree().a);
  CHECK(store->fetch_stats().retries >= 5);
  // Gone for a while, then back: the read waits it out.
  proxy.cut_all();
  proxy.outage_until_ms = remote_test::FaultProxy::now_ms() + 3000;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(read_all(*store, a, a.size) == tree().a);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(2500));
  CHECK(proxy.faulted.load() >= 8);
}

TEST_CASE("a fault that outlasts retry_for stops with the URL, the status and the attempts, never a hang") {
  SKIP_UNLESS(rclone());
  TempDir cache("cache");
  remote_test::FaultProxy proxy(rclone().port);
  auto store = proxied_store(proxy, cache.path, 2);
  const auto a = store->stat("s3://data/set/a.bin");
  proxy.cut_all();
  proxy.fail_next_503 = 1000;
  const auto t0 = std::chrono::steady_clock::now();
  const auto e = error_of([&] { read_all(*store, a, a.size); });
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  CHECK(contains(e, "s3://data/set/a.bin"));
  CHECK(contains(e, "503"));
  CHECK(contains(e, "SlowDown"));
  CHECK(contains(e, "attempts"));
  CHECK(contains(e, "retry_for"));
  CHECK(!contains(e, kSecret));
}

TEST_CASE("an object that changes under the run is an error naming it, never a mix of two versions") {
  SKIP_UNLESS(rclone());
  TempDir cache("cache");
  auto store = io::open_store("s3://data/changing", s3_options(rclone().endpoint(), cache.path));
  const auto x = store->stat("s3://data/changing/x.bin");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // another modification time
  put(tree().root / "data" / "changing" / "x.bin", random_bytes(5000, 12));
  const auto e = error_of([&] { read_all(*store, x); });
  CHECK(contains(e, "s3://data/changing/x.bin"));
  CHECK(contains(e, "changed under the run"));
}

#ifdef PIPELINE_EXE
TEST_CASE("pipeline check of a remote source: no network unless --probe, clear refusals, and the planted key nowhere") {
  SKIP_UNLESS(rclone());
  TempDir home("home");
  const std::string set = " --set data.dataset=s3://data/set --set data.endpoint=" + rclone().endpoint() +
                          " --set data.allow_http=true --set data.cache_dir=" + (home.path / "cache").string();
  auto check = [&](const std::string& secret, const std::string& extra) {
    return test_util::shell("cd " + std::string(PIPELINE_SOURCE_DIR) + " && env HOME=" + home.path.string() +
                            " AWS_ACCESS_KEY_ID=" + kKey + " AWS_SECRET_ACCESS_KEY=" + secret + " " + PIPELINE_EXE +
                            " check quickstart.toml" + set + extra + " 2>&1");
  };
  auto quiet = check(kSecret, "");
  INFO(quiet.out);
  CHECK(quiet.code == 0);
  CHECK(contains(quiet.out, "keys from the environment (AWS_ACCESS_KEY_ID)"));
  CHECK(contains(quiet.out, "the network is not touched"));
  CHECK(!contains(quiet.out, kSecret));
  CHECK(!fs::exists(home.path / "cache"));  // nothing made: the cache waits for the first read
  auto probe = check(kSecret, " --probe");
  INFO(probe.out);
  CHECK(probe.code == 0);
  CHECK(contains(probe.out, "probe: [data] dataset: 2 files"));
  CHECK(!contains(probe.out, kSecret));
  const std::string wrong = "PLANTEDwrongSECRET77";
  auto denied = check(wrong, " --probe");
  INFO(denied.out);
  CHECK(denied.code != 0);
  CHECK(contains(denied.out, "403"));
  CHECK(contains(denied.out, "AWS_SECRET_ACCESS_KEY"));
  CHECK(!contains(denied.out, wrong));
  auto in_toml = check(kSecret, " --set data.aws_secret_access_key=" + wrong);
  CHECK(in_toml.code != 0);
  CHECK(contains(in_toml.out, "keys and tokens never go in the config"));
  CHECK(!contains(in_toml.out, wrong));
}

TEST_CASE("pipeline check takes remote sources in a mix and as the validation source, and --probe lists each") {
  SKIP_UNLESS(rclone());
  TempDir home("home");
  std::string toml = test_util::read_file(fs::path(PIPELINE_SOURCE_DIR) / "pipelines" / "quickstart.toml");
  const auto put_after = [&](const std::string& line, const std::string& added) {
    const auto at = toml.find(line);
    REQUIRE(at != std::string::npos);
    toml.insert(at + line.size(), added);
  };
  put_after("type = \"read_shards\"\n", "mix = [\"s3://data/set=2\", \"s3://data/set/a.bin=1\"]\n");
  put_after("type = \"eval\"\n", "dataset = \"s3://data/set\"\n");
  const fs::path cfg = home.path / "mixed.toml";
  test_util::write_file(cfg, toml);
  auto check = [&](const std::string& extra) {
    return test_util::shell("cd " + std::string(PIPELINE_SOURCE_DIR) + " && env HOME=" + home.path.string() +
                            " AWS_ACCESS_KEY_ID=" + kKey + " AWS_SECRET_ACCESS_KEY=" + kSecret + " " + PIPELINE_EXE +
                            " check " + cfg.string() + " --set data.endpoint=" + rclone().endpoint() +
                            " --set data.allow_http=true" + extra + " 2>&1");
  };
  auto quiet = check("");
  INFO(quiet.out);
  CHECK(quiet.code == 0);
  CHECK(contains(quiet.out, "data: [stages.read] mix = s3://data/set:"));
  CHECK(contains(quiet.out, "data: [stages.eval] dataset = s3://data/set:"));
  CHECK(contains(quiet.out, "the network is not touched"));
  auto probe = check(" --probe");
  INFO(probe.out);
  CHECK(probe.code == 0);
  CHECK(contains(probe.out, "probe: [stages.read] mix: 2 files"));
  CHECK(contains(probe.out, "probe: [stages.read] mix: 1 file,"));
  CHECK(contains(probe.out, "probe: [stages.eval] dataset: 2 files"));
  CHECK(!contains(probe.out, kSecret));
  // A credential in a mix entry's URL is refused as in [data] dataset, naming the key, never printed.
  std::string signed_toml = toml;
  signed_toml.replace(signed_toml.find("s3://data/set/a.bin=1"), 21,
                      "https://h.example/a.bin?X-Amz-Signature=PLANTEDsig99=1");
  test_util::write_file(cfg, signed_toml);
  auto refused = check("");
  INFO(refused.out);
  CHECK(refused.code != 0);
  CHECK(contains(refused.out, "[stages.read] mix"));
  CHECK(contains(refused.out, "a query string in a source's URL is a credential"));
  CHECK(!contains(refused.out, "PLANTEDsig99"));
}
#endif
