// See resume_records.h.
#include "runner/resume_records.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include "base/atomic_file.h"
#include "base/json.h"

namespace pipeline::stages {

namespace {

// A line's "step", or -1 when it has none (or is no JSON object).
int64_t step_of(const std::string& line) {
  try {
    const JsonValue v = json_parse(line);
    const JsonValue* s = v.find("step");
    if (!s || s->type != JsonValue::Type::number) return -1;
    const double d = std::strtod(s->text.c_str(), nullptr);
    return std::isfinite(d) && d >= 0 ? static_cast<int64_t>(d) : -1;
  } catch (const JsonParseError&) {
    return -1;
  }
}

}  // namespace

size_t supersede_metrics_after(const std::filesystem::path& run_dir, int64_t step) {
  const auto path = run_dir / "metrics.jsonl";
  std::ifstream in(path, std::ios::binary);
  if (!in) return 0;
  std::ostringstream all;
  all << in.rdbuf();
  if (in.bad()) throw std::runtime_error(path.string() + ": cannot read it to drop the steps after " + std::to_string(step));
  const std::string text = all.str();
  std::string kept, moved;
  size_t n_moved = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find('\n', at);
    const bool whole = end != std::string::npos;
    const std::string line = text.substr(at, (whole ? end : text.size()) - at);
    if (!whole || step_of(line) > step) {
      moved += line + "\n";
      ++n_moved;
    } else {
      kept += line + "\n";
    }
    at = whole ? end + 1 : text.size();
  }
  if (n_moved == 0) return 0;
  const auto superseded = run_dir / "metrics.superseded.jsonl";
  std::FILE* f = std::fopen(superseded.c_str(), "a");
  if (!f) throw std::runtime_error(superseded.string() + ": cannot open for appending: " + std::strerror(errno));
  const bool ok = std::fwrite(moved.data(), 1, moved.size(), f) == moved.size() && std::fflush(f) == 0 &&
                  ::fsync(fileno(f)) == 0;
  const int err = errno;
  std::fclose(f);
  if (!ok) throw std::runtime_error(superseded.string() + ": cannot write the records past step " + std::to_string(step) +
                                    ": " + std::strerror(err));
  write_file_atomic(path, kept);
  return n_moved;
}

}  // namespace pipeline::stages
