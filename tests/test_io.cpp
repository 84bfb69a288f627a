// The store layer (datasets/io/store.h): the local file system as a store, files read at
// offsets, and a file that changes under a run refused.
#include <doctest/doctest.h>

#include <fstream>
#include <string>
#include <thread>

#include "datasets/dataset_error.h"
#include "datasets/io/store.h"
#include "test_util.h"

using namespace pipeline::datasets;
using test_util::error_of;
using test_util::TempDir;

namespace {
void write(const std::filesystem::path& p, const std::string& bytes) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}
}  // namespace

TEST_CASE("a local store lists a directory's files, sorted and recursively, hidden ones left out") {
  TempDir dir("io");
  write(dir.path / "b.bin", "bb");
  write(dir.path / "a" / "z.bin", "zzz");
  write(dir.path / "a" / ".partial", "x");
  write(dir.path / ".cache" / "c.bin", "c");
  io::LocalStore store;
  const auto files = store.list(dir.path.string());
  REQUIRE(files.size() == 2);
  CHECK(files[0].uri == (dir.path / "a" / "z.bin").string());
  CHECK(files[0].size == 3);
  CHECK(files[1].uri == (dir.path / "b.bin").string());
  CHECK(!files[1].version.empty());
  // A file lists as itself.
  const auto one = store.list((dir.path / "b.bin").string());
  REQUIRE(one.size() == 1);
  CHECK(one[0].size == 2);
  CHECK(error_of([&] { store.list((dir.path / "nope").string()); }).find("nope: no such file or directory") !=
        std::string::npos);
  CHECK(error_of([&] { store.stat((dir.path / "a").string()); }).find("not a regular file") != std::string::npos);
}

TEST_CASE("a local file reads at offsets, and short only at its end") {
  TempDir dir("io");
  write(dir.path / "f", "0123456789");
  io::LocalStore store;
  auto f = store.open(store.stat((dir.path / "f").string()));
  CHECK(f->size() == 10);
  CHECK(f->local_path() == dir.path / "f");
  char buf[8] = {};
  CHECK(f->read_at(3, buf, 4) == 4);
  CHECK(std::string(buf, 4) == "3456");
  CHECK(f->read_at(8, buf, 8) == 2);
  CHECK(std::string(buf, 2) == "89");
  CHECK(f->read_at(10, buf, 8) == 0);
}

TEST_CASE("a file that changed after it was listed is refused, naming it") {
  TempDir dir("io");
  write(dir.path / "f", "version one");
  io::LocalStore store;
  const auto info = store.stat((dir.path / "f").string());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  write(dir.path / "f", "version two, longer");
  const std::string e = error_of([&] { store.open(info); });
  CHECK(e.find((dir.path / "f").string()) != std::string::npos);
  CHECK(e.find("changed after the run listed it") != std::string::npos);
}

TEST_CASE("sources are local paths unless they carry a scheme") {
  CHECK(io::is_remote_source("s3://bucket/prefix"));
  CHECK(io::is_remote_source("https://host/path?x=1"));
  CHECK(!io::is_remote_source("data/fineweb"));
  CHECK(!io::is_remote_source("/abs/path:with://colon"));
  CHECK(!io::is_remote_source("://nothing"));
  CHECK(dynamic_cast<io::LocalStore*>(io::open_store("data/x").get()) != nullptr);
}
