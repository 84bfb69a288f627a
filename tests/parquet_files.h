// The Parquet files of tests/parquet/make_files.py, for the tests that read Parquet
// (test_parquet, test_data_order): written once per test process with the Python that has
// pyarrow (PIPELINE_ARROW_PYTHON, set-up's venv); without one the process exits 77 (CTest:
// skipped), saying why.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "test_util.h"

namespace parquet_files {

/// The directory of the files; `test` names the test in messages.
inline const std::filesystem::path& dir(const char* test) {
  static const std::filesystem::path d = [test] {
    const std::string python = PIPELINE_ARROW_PYTHON;
    if (python.empty() || test_util::shell(python + " -c 'import pyarrow'").code != 0) {
      std::fprintf(stderr, "%s: no Python with pyarrow (%s); tools/setup.sh installs it. Skipped.\n", test,
                   python.empty() ? "none configured" : python.c_str());
      std::exit(77);
    }
    std::filesystem::path out = test_util::fresh_dir(test, "parquet_files");
    auto r = test_util::shell(python + " " + PIPELINE_SOURCE_DIR + "/tests/parquet/make_files.py " + out.string());
    if (r.code != 0) {
      std::fprintf(stderr, "%s: make_files.py failed:\n%s\n", test, r.out.c_str());
      std::exit(1);
    }
    return out;
  }();
  return d;
}

/// Document i of make_files.py.
inline std::string doc(int i) {
  static const char* words[] = {"the", "quick", "brown", "fox", "h\xc3\xa9llo", "\xe6\x97\xa5\xe6\x9c\xac",
                                "jumps", "over", "lazy", "dog", "\xf0\x9f\x98\x80"};
  std::string s = "document " + std::to_string(i) + ":";
  for (int j = 0; j <= i % 13; ++j) s += std::string(" ") + words[(i * 7 + j) % 11];
  return s + "\n";
}

}  // namespace parquet_files
