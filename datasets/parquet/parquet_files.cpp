// Which files a Parquet source names (see parquet_reader.h). No Arrow here: a build without
// Parquet still recognises Parquet input, to refuse it with a sentence.
#include <glob.h>

#include <algorithm>
#include <system_error>

#include "datasets/shards/manifest.h"
#include "datasets/parquet/parquet_reader.h"

namespace pipeline::datasets {
namespace fs = std::filesystem;
namespace {

bool has_parquet_extension(const fs::path& p) { return p.extension() == ".parquet"; }

bool is_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// *.parquet files under `dir` at any depth, skipping names that start with '.' (the hub client's
// .cache/, editors' temporary files).
std::vector<fs::path> parquet_files_under(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->path().filename().string().starts_with(".")) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() && has_parquet_extension(it->path())) out.push_back(it->path());
  }
  if (ec) throw DatasetError(dir.string() + ": cannot list the directory: " + ec.message());
  return out;
}

}  // namespace

bool is_parquet_source(const fs::path& source) {
  const std::string s = source.string();
  if (is_glob(s)) return s.ends_with(".parquet");
  std::error_code ec;
  if (fs::is_regular_file(source, ec)) return has_parquet_extension(source);
  if (!fs::is_directory(source, ec) || fs::exists(source / kManifestFileName, ec)) return false;
  return !parquet_files_under(source).empty();
}

std::vector<fs::path> list_parquet_files(const fs::path& source) {
  const std::string s = source.string();
  std::vector<fs::path> files;
  std::error_code ec;
  if (is_glob(s) && !fs::exists(source, ec)) {
    glob_t g{};
    const int rc = ::glob(s.c_str(), 0, nullptr, &g);
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i)
      if (fs::is_regular_file(g.gl_pathv[i], ec)) files.emplace_back(g.gl_pathv[i]);
    globfree(&g);
    if (files.empty()) throw DatasetError(s + ": the pattern matches no Parquet file");
  } else if (fs::is_directory(source, ec)) {
    // A hub snapshot keeps its data under data/ (data/<config>/*.parquet) beside README.md and
    // the client's metadata; reading only data/ keeps other files out.
    const fs::path data = source / "data";
    files = parquet_files_under(fs::is_directory(data, ec) ? data : source);
    if (files.empty()) throw DatasetError(s + ": no *.parquet files in the directory");
  } else if (fs::exists(source, ec)) {
    files.push_back(source);
  } else {
    throw DatasetError(s + ": no such file or directory");
  }
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.generic_string() < b.generic_string(); });
  return files;
}

}  // namespace pipeline::datasets
