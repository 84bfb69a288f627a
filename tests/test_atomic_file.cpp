// Tests for graph/atomic_file: the new file appears whole or not at all, a failure (file size
// limit, full filesystem, read-only filesystem, missing directory) names the file and the step,
// removes the temporary and leaves the previous file as it was.
#include <doctest/doctest.h>

#include <sys/mount.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "base/atomic_file.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace pipeline;
using test_util::contains;
using test_util::error_of;
using test_util::FileSizeLimit;

namespace {

fs::path temp_dir(const std::string& tag) { return test_util::fresh_dir("atomic", tag); }

// A small tmpfs mounted over `dir` while alive (needs CAP_SYS_ADMIN, as root in CI and here).
struct SmallFs {
  explicit SmallFs(const fs::path& d, const char* size) : dir(d) {
    mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, (std::string("size=") + size).c_str()) == 0;
  }
  bool remount_read_only() {
    return ::mount("tmpfs", dir.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, nullptr) == 0;
  }
  ~SmallFs() {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
  }
  fs::path dir;
  bool mounted = false;
};

}  // namespace

TEST_CASE("atomic file: writes, replaces, patches, and leaves no temporary") {
  auto d = temp_dir("ok");
  write_file_atomic(d / "a.txt", "first");
  CHECK(test_util::read_file(d / "a.txt") == "first");
  write_file_atomic(d / "a.txt", "second, longer");
  CHECK(test_util::read_file(d / "a.txt") == "second, longer");
  CHECK(!fs::exists(d / "a.txt.tmp"));

  {
    AtomicFile f(d / "b.bin");
    f.write("0000");
    std::string big(3 << 20, 'x');  // larger than the buffer: goes straight to the file
    f.write(big);
    f.write("tail");
    f.write_at(0, "HEAD", 4);
    CHECK(f.size() == 8 + big.size());
    CHECK(contains(error_of([&] { f.write_at(f.size() - 2, "abc", 3); }), "past the end"));
  }
  CHECK(!fs::exists(d / "b.bin"));  // the patch error above failed the file: nothing committed
  CHECK(!fs::exists(d / "b.bin.tmp"));

  {
    AtomicFile f(d / "c.bin");
    f.write("0000");
    f.write(std::string(3 << 20, 'y'));
    f.write_at(0, "HEAD", 4);
    f.commit();
  }
  auto c = test_util::read_file(d / "c.bin");
  CHECK(c.size() == 4 + (3u << 20));
  CHECK(c.substr(0, 5) == "HEADy");

  {
    AtomicFile abandoned(d / "a.txt");
    abandoned.write("never committed");
    CHECK(fs::exists(d / "a.txt.tmp"));
  }
  CHECK(!fs::exists(d / "a.txt.tmp"));
  CHECK(test_util::read_file(d / "a.txt") == "second, longer");
  fs::remove_all(d);
}

TEST_CASE("atomic file: a missing directory is an error naming the file") {
  auto d = temp_dir("missing");
  auto err = error_of([&] { write_file_atomic(d / "no" / "such" / "x.json", "{}"); });
  CHECK(contains(err, (d / "no" / "such" / "x.json").string()));
  CHECK(contains(err, "creating"));
  CHECK(contains(err, "No such file or directory"));
  fs::remove_all(d);
}

TEST_CASE("atomic file: a write past the file size limit fails cleanly; the old file survives") {
  auto d = temp_dir("fsize");
  write_file_atomic(d / "state", "good old state");
  std::string err;
  {
    FileSizeLimit limit(64 * 1024);
    err = error_of([&] { write_file_atomic(d / "state", std::string(1 << 20, 'n')); });
  }
  CHECK(contains(err, (d / "state").string()));
  CHECK(contains(err, "writing"));
  CHECK(contains(err, "File too large"));
  CHECK(contains(err, "previous state, if any, is unchanged"));
  CHECK(test_util::read_file(d / "state") == "good old state");
  CHECK(!fs::exists(d / "state.tmp"));
  fs::remove_all(d);
}

TEST_CASE("atomic file: a full filesystem and a read-only one (tmpfs; needs CAP_SYS_ADMIN)") {
  auto d = temp_dir("tmpfs");
  SmallFs small(d, "256k");
  if (!small.mounted) {
    MESSAGE("not run: cannot mount a tmpfs here (" << std::strerror(errno) << "); the RLIMIT_FSIZE case covers the code path");
    return;
  }
  write_file_atomic(d / "state", "good old state");
  auto err = error_of([&] { write_file_atomic(d / "state", std::string(1 << 20, 'n')); });
  CHECK(contains(err, "No space left on device"));
  CHECK(test_util::read_file(d / "state") == "good old state");
  CHECK(!fs::exists(d / "state.tmp"));
  REQUIRE(small.remount_read_only());
  err = error_of([&] { write_file_atomic(d / "state", "new"); });
  CHECK(contains(err, "Read-only file system"));
  CHECK(contains(err, (d / "state").string()));
  CHECK(test_util::read_file(d / "state") == "good old state");
}
