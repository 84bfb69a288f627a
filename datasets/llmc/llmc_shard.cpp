// llm.c shard header checks, reader, writer and directory naming (format in llmc_shard.h).
#include "datasets/llmc/llmc_shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "base/atomic_file.h"
#include "datasets/shards/manifest.h"
#include "datasets/shards/shard.h"

namespace pipeline::datasets {

static_assert(std::endian::native == std::endian::little, "llm.c shards are little-endian");

namespace {

int32_t header_int(std::string_view head, size_t index) {
  int32_t v = 0;
  std::memcpy(&v, head.data() + 4 * index, 4);
  return v;
}

}  // namespace

bool looks_like_llmc_shard(std::string_view head) {
  if (head.size() < 4) return false;
  const int32_t magic = header_int(head, 0);
  return magic == kLlmcMagic || magic == kLlmcLlama3Magic;
}

uint64_t parse_llmc_header(std::string_view head, uint64_t file_size, const std::string& source) {
  if (file_size < kLlmcHeaderBytes || head.size() < kLlmcHeaderBytes)
    throw DatasetError(source + ": file is " + std::to_string(file_size) + " bytes, shorter than the " +
                       std::to_string(kLlmcHeaderBytes) + "-byte llm.c shard header (truncated at byte offset " +
                       std::to_string(file_size) + ")");
  const int32_t magic = header_int(head, 0), version = header_int(head, 1), count = header_int(head, 2);
  if (magic == kLlmcLlama3Magic)
    throw DatasetError(source + ": byte offset 0: magic 20240801 is an llm.c Llama 3 shard (uint32 ids of the Llama 3 "
                                "vocabulary); this pipeline trains on GPT-2 token shards (magic 20240520)");
  if (magic != kLlmcMagic)
    throw DatasetError(source + ": byte offset 0: bad magic " + std::to_string(magic) +
                       ", expected 20240520 (not an llm.c GPT-2 token shard)");
  if (version != kLlmcVersion)
    throw DatasetError(source + ": byte offset 4: unsupported version " + std::to_string(version) +
                       ", expected 1 (uint16 GPT-2 tokens)");
  if (count < 0)
    throw DatasetError(source + ": byte offset 8: negative token count " + std::to_string(count) + " (corrupt header)");
  const uint64_t expected = kLlmcHeaderBytes + 2 * static_cast<uint64_t>(count);
  if (file_size != expected)
    throw DatasetError(source + ": byte offset 8: the header counts " + std::to_string(count) + " tokens, so the file should be " +
                       std::to_string(expected) + " bytes, but it is " + std::to_string(file_size) +
                       (file_size < expected ? " (truncated at byte offset " + std::to_string(file_size) + ")"
                                             : " (trailing bytes from byte offset " + std::to_string(expected) + ")"));
  return static_cast<uint64_t>(count);
}

// ---- reader ---------------------------------------------------------------------------------

LlmcShardReader::LlmcShardReader(const std::filesystem::path& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw DatasetError(path.string() + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  char head[kLlmcHeaderBytes] = {};
  ssize_t got = ::fstat(fd_, &st) == 0 ? ::pread(fd_, head, sizeof head, 0) : -1;
  try {
    if (got < 0) throw DatasetError(path.string() + ": cannot read the header: " + std::strerror(errno));
    tokens_ = parse_llmc_header(std::string_view(head, static_cast<size_t>(got)), static_cast<uint64_t>(st.st_size),
                                path.string());
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

LlmcShardReader::LlmcShardReader(LlmcShardReader&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), tokens_(other.tokens_) {}

LlmcShardReader::~LlmcShardReader() {
  if (fd_ >= 0) ::close(fd_);
}

size_t LlmcShardReader::read(uint64_t offset, std::span<uint16_t> out) const {
  if (offset >= tokens_) return 0;
  const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size(), tokens_ - offset));
  auto* dst = reinterpret_cast<char*>(out.data());
  size_t done = 0;
  while (done < 2 * n) {
    const uint64_t at = kLlmcHeaderBytes + 2 * offset + done;
    ssize_t k = ::pread(fd_, dst + done, 2 * n - done, static_cast<off_t>(at));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      throw DatasetError(path_.string() + ": " +
                         (k < 0 ? std::string("read error at byte offset ") + std::to_string(at) + ": " + std::strerror(errno)
                                : "the file ends at byte offset " + std::to_string(at) + " (it shrank after it was opened)"));
    done += static_cast<size_t>(k);
  }
  return n;
}

// ---- writer ---------------------------------------------------------------------------------

LlmcShardWriter::LlmcShardWriter(std::filesystem::path path) : file_(std::move(path)) {
  const std::vector<char> zeros(kLlmcHeaderBytes, 0);  // the header is written by finish()
  file_.write(zeros.data(), zeros.size());
  buf_.reserve(size_t(1) << 20);
}

void LlmcShardWriter::flush() {
  file_.write(buf_.data(), 2 * buf_.size());
  buf_.clear();
}

void LlmcShardWriter::add_document(std::span<const uint32_t> tokens) {
  if (tokens_ + 1 + tokens.size() > kLlmcMaxTokens)
    throw std::invalid_argument(file_.path().string() + ": a document of " + std::to_string(tokens.size()) +
                                " tokens would take the shard past the format's 2^31 - 1 tokens");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] > UINT16_MAX)
      throw std::invalid_argument(file_.path().string() + ": token id " + std::to_string(tokens[i]) +
                                  " does not fit the shard's uint16 ids");
  buf_.push_back(kShardEotId);
  for (uint32_t t : tokens) {
    if (buf_.size() == buf_.capacity()) flush();
    buf_.push_back(static_cast<uint16_t>(t));
  }
  tokens_ += 1 + tokens.size();
  ++documents_;
}

uint64_t LlmcShardWriter::finish() {
  flush();
  int32_t header[256] = {};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersion;
  header[2] = static_cast<int32_t>(tokens_);
  file_.write_at(0, header, sizeof header);
  file_.commit();
  return kLlmcHeaderBytes + 2 * tokens_;
}

// ---- directories ------------------------------------------------------------------------------

bool parse_llmc_shard_name(const std::string& name, std::string& split, uint64_t& index) {
  std::string_view s(name);
  if (!s.ends_with(".bin")) return false;
  s.remove_suffix(4);
  auto last = s.rfind('_');
  if (last == std::string_view::npos) return false;
  std::string_view tail = s.substr(last + 1);
  index = 0;
  auto [p, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), index);
  if (!tail.empty() && ec == std::errc() && p == tail.data() + tail.size()) {
    s = s.substr(0, last);
    last = s.rfind('_');
    if (last == std::string_view::npos) return false;
    tail = s.substr(last + 1);
  }
  if (tail.empty() || last == 0) return false;  // a split and a non-empty prefix
  split = std::string(tail);
  return true;
}


std::map<std::string, std::vector<std::filesystem::path>> llmc_splits(const std::filesystem::path& dir) {
  std::map<std::string, std::vector<std::tuple<uint64_t, std::string, std::filesystem::path>>> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::string split;
    uint64_t index = 0;
    if (e.is_regular_file(ec) && parse_llmc_shard_name(e.path().filename().string(), split, index))
      found[split].emplace_back(index, e.path().filename().string(), e.path());
  }
  std::map<std::string, std::vector<std::filesystem::path>> out;
  for (auto& [split, files] : found) {
    std::sort(files.begin(), files.end());  // by index, then name (unpadded indices sort numerically)
    for (auto& f : files) out[split].push_back(std::get<2>(f));
  }
  return out;
}

bool is_llmc_dataset(const std::filesystem::path& dir) {
  // The names decide; each shard's header is checked when the dataset is opened, so a corrupt
  // or foreign file is reported with its byte offset instead of being skipped.
  std::error_code ec;
  return std::filesystem::is_directory(dir, ec) && !std::filesystem::exists(dir / kManifestFileName, ec) &&
         !llmc_splits(dir).empty();
}

std::string llmc_shard_name(const std::string& prefix, const std::string& split, size_t index) {
  char num[32];
  std::snprintf(num, sizeof num, "%06zu", index);
  return prefix + "_" + split + "_" + num + ".bin";
}

}  // namespace pipeline::datasets
