// Shard writer and streaming reader (format described in shard.h).
#include "datasets/shards/shard.h"

#include <zstd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

namespace pipeline::datasets {
namespace {

static_assert(std::endian::native == std::endian::little, "token shards are read as little-endian uint16 in place");

constexpr uint32_t kSkippableMagic = 0x184D2A50;
constexpr uint32_t kZstdFrameMagic = 0xFD2FB528;
constexpr char kTextMagic[8] = {'P', 'L', 'S', 'H', 'T', 'E', 'X', 'T'};
constexpr char kTokensMagic[8] = {'P', 'L', 'S', 'H', 'T', 'O', 'K', 'N'};

void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string hex_bytes(const unsigned char* p, size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += kHex[p[i] >> 4];
    s += kHex[p[i] & 15];
  }
  return s;
}

std::string printable(const char* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += (p[i] >= 0x20 && p[i] < 0x7f) ? p[i] : '?';
  return s;
}

const char* magic_of(ShardKind kind) { return kind == ShardKind::text ? kTextMagic : kTokensMagic; }

}  // namespace

const char* shard_kind_name(ShardKind kind) { return kind == ShardKind::text ? "text" : "tokens"; }

// ---------------------------------------------------------------------------------------------
// ShardWriter

void ZstdCCtxFree::operator()(ZSTD_CCtx_s* ctx) const { ZSTD_freeCCtx(ctx); }
void ZstdDCtxFree::operator()(ZSTD_DCtx_s* ctx) const { ZSTD_freeDCtx(ctx); }

ShardWriter::ShardWriter(const std::filesystem::path& path, ShardKind kind, ShardWriterOptions options)
    : path_(path), kind_(kind), file_(path), cctx_(ZSTD_createCCtx()) {
  if (!cctx_) throw DatasetError(path.string() + ": cannot allocate a zstd compression context");
  size_t r = ZSTD_CCtx_setParameter(cctx_.get(), ZSTD_c_compressionLevel, options.level);
  if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(cctx_.get(), ZSTD_c_checksumFlag, 1);
  if (ZSTD_isError(r))
    throw DatasetError(path.string() + ": zstd rejected level " + std::to_string(options.level) + ": " +
                       ZSTD_getErrorName(r));
  out_buf_.resize(ZSTD_CStreamOutSize());
  unsigned char header[kShardHeaderBytes] = {};  // counts are patched in by finish()
  put_u32(header, kSkippableMagic);
  put_u32(header + 4, kShardHeaderBytes - 8);
  std::memcpy(header + 8, magic_of(kind), 8);
  put_u32(header + 16, kShardFormatVersion);
  file_.write(header, sizeof header);
}

void ShardWriter::compress(const void* data, size_t size) {
  ZSTD_inBuffer in{data, size, 0};
  while (in.pos < in.size) {
    ZSTD_outBuffer out{out_buf_.data(), out_buf_.size(), 0};
    size_t r = ZSTD_compressStream2(cctx_.get(), &out, &in, ZSTD_e_continue);
    if (ZSTD_isError(r)) throw DatasetError(path_.string() + ": zstd compression failed: " + ZSTD_getErrorName(r));
    file_.write(out_buf_.data(), out.pos);
  }
  payload_bytes_ += size;
}

void ShardWriter::add_document(std::string_view text) {
  if (kind_ != ShardKind::text) throw DatasetError(path_.string() + ": text document added to a tokens shard");
  if (text.size() > UINT32_MAX)
    throw DatasetError(path_.string() + ": document of " + std::to_string(text.size()) +
                       " bytes exceeds the 4 GiB limit of a text shard's length prefix");
  unsigned char len[4];
  put_u32(len, static_cast<uint32_t>(text.size()));
  compress(len, 4);
  compress(text.data(), text.size());
  ++documents_;
  items_ += text.size();
}

void ShardWriter::add_document(std::span<const uint32_t> tokens) {
  if (kind_ != ShardKind::tokens) throw DatasetError(path_.string() + ": token document added to a text shard");
  token_buf_.clear();
  token_buf_.push_back(kShardEotId);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] > UINT16_MAX)
      throw DatasetError(path_.string() + ": token id " + std::to_string(tokens[i]) + " at position " +
                         std::to_string(i) + " of document " + std::to_string(documents_) +
                         " does not fit the shard's uint16 ids");
    token_buf_.push_back(static_cast<uint16_t>(tokens[i]));
  }
  compress(token_buf_.data(), token_buf_.size() * sizeof(uint16_t));
  ++documents_;
  items_ += token_buf_.size();
}

ShardWriter::Summary ShardWriter::finish() {
  if (finished_) throw DatasetError(path_.string() + ": finish() called twice");
  for (;;) {
    ZSTD_inBuffer in{nullptr, 0, 0};
    ZSTD_outBuffer out{out_buf_.data(), out_buf_.size(), 0};
    size_t r = ZSTD_compressStream2(cctx_.get(), &out, &in, ZSTD_e_end);
    if (ZSTD_isError(r)) throw DatasetError(path_.string() + ": zstd compression failed: " + ZSTD_getErrorName(r));
    file_.write(out_buf_.data(), out.pos);
    if (r == 0) break;
  }
  unsigned char counts[16];
  put_u64(counts, documents_);
  put_u64(counts + 8, items_);
  file_.write_at(24, counts, sizeof counts);
  const uint64_t bytes = file_.size();
  file_.commit();
  finished_ = true;
  Summary s;
  s.path = path_;
  s.bytes = bytes;
  s.documents = documents_;
  s.items = items_;
  s.sha256 = sha256_file_hex(path_);
  return s;
}

// ---------------------------------------------------------------------------------------------
// ShardReader

ShardReader::ShardReader(const std::filesystem::path& path, ShardKind expected_kind, bool hash)
    : path_(path), kind_(expected_kind) {
  if (hash) hash_ = std::make_unique<Sha256>();
  file_.reset(std::fopen(path.c_str(), "rb"));
  if (!file_) throw DatasetError(path.string() + ": cannot open shard: " + std::strerror(errno));

  unsigned char h[kShardHeaderBytes];
  size_t n = std::fread(h, 1, sizeof h, file_.get());
  file_bytes_read_ = n;
  if (hash_) hash_->update(h, n);
  unsigned char expected[16];
  put_u32(expected, kSkippableMagic);
  put_u32(expected + 4, kShardHeaderBytes - 8);
  std::memcpy(expected + 8, magic_of(expected_kind), 8);
  size_t magic_n = std::min<size_t>(n, 16);
  if (std::memcmp(h, expected, magic_n) != 0) {
    const char* other = magic_of(expected_kind == ShardKind::text ? ShardKind::tokens : ShardKind::text);
    if (n >= 16 && std::memcmp(h, expected, 8) == 0 && std::memcmp(h + 8, other, 8) == 0)
      fail(std::string("wrong shard kind at byte offset 8: found a ") +
           (expected_kind == ShardKind::text ? "tokens" : "text") + " shard ('" + printable(reinterpret_cast<char*>(h + 8), 8) +
           "'), expected a " + shard_kind_name(expected_kind) + " shard ('" + printable(magic_of(expected_kind), 8) + "')");
    size_t at = 0;
    while (at < magic_n && h[at] == expected[at]) ++at;
    fail("wrong magic at byte offset " + std::to_string(at) + ": expected " + hex_bytes(expected, 16) + " ('" +
         printable(magic_of(expected_kind), 8) + "' in a zstd skippable frame), found " + hex_bytes(h, magic_n) +
         "; this is not a pipeline " + shard_kind_name(expected_kind) + " shard");
  }
  if (n < kShardHeaderBytes)
    fail("truncated: file is " + std::to_string(n) + " bytes, shorter than the " + std::to_string(kShardHeaderBytes) +
         "-byte shard header");
  header_.kind = expected_kind;
  header_.version = get_u32(h + 16);
  header_.documents = get_u64(h + 24);
  header_.items = get_u64(h + 32);
  if (header_.version != kShardFormatVersion)
    fail("wrong format version at byte offset 16: found version " + std::to_string(header_.version) +
         ", this build reads version " + std::to_string(kShardFormatVersion));

  dctx_.reset(ZSTD_createDCtx());
  if (!dctx_) fail("cannot allocate a zstd decompression context");
  in_buf_.resize(ZSTD_DStreamInSize());
  out_buf_.resize(ZSTD_DStreamOutSize());

  // The frame must carry a content checksum: it is what turns a flipped byte into an error.
  in_end_ = std::fread(in_buf_.data(), 1, in_buf_.size(), file_.get());
  file_bytes_read_ += in_end_;
  if (hash_) hash_->update(in_buf_.data(), in_end_);
  if (in_end_ < 6)
    fail("truncated: file ends at byte offset " + std::to_string(file_bytes_read_) +
         " before the zstd frame header (expected at byte offset 40)");
  auto* f = reinterpret_cast<const unsigned char*>(in_buf_.data());
  if (get_u32(f) != kZstdFrameMagic)
    fail("corrupt: no zstd frame at byte offset 40 (found " + hex_bytes(f, 4) + ", expected 28 b5 2f fd)");
  if ((f[4] & 0x04) == 0)
    fail("the zstd frame at byte offset 40 has no content checksum; shards must be written with checksums on");
  high_water_ = in_buf_.capacity() + out_buf_.capacity() + ZSTD_sizeof_DCtx(dctx_.get());
}

void ShardReader::fail(const std::string& what) const { throw DatasetError(path_.string() + ": " + what); }

uint64_t ShardReader::compressed_offset() const { return file_bytes_read_ - (in_end_ - in_pos_); }

bool ShardReader::refill() {
  if (frame_done_) return false;
  for (;;) {
    if (in_pos_ == in_end_) {
      in_pos_ = 0;
      in_end_ = std::fread(in_buf_.data(), 1, in_buf_.size(), file_.get());
      if (in_end_ == 0) {
        if (std::ferror(file_.get()))
          fail("read error at byte offset " + std::to_string(file_bytes_read_) + ": " + std::strerror(errno));
        fail("truncated: file ends at byte offset " + std::to_string(file_bytes_read_) +
             " inside the zstd frame (the frame is incomplete; the file was cut short)");
      }
      file_bytes_read_ += in_end_;
      if (hash_) hash_->update(in_buf_.data(), in_end_);
    }
    uint64_t chunk_start = compressed_offset();
    ZSTD_inBuffer in{in_buf_.data(), in_end_, in_pos_};
    ZSTD_outBuffer out{out_buf_.data(), out_buf_.size(), 0};
    size_t r = ZSTD_decompressStream(dctx_.get(), &out, &in);
    in_pos_ = in.pos;
    if (ZSTD_isError(r))
      fail("corrupt compressed data between byte offsets " + std::to_string(chunk_start) + " and " +
           std::to_string(compressed_offset()) + ": zstd: " + ZSTD_getErrorName(r) +
           " (after " + std::to_string(payload_read_ + out.pos) + " uncompressed bytes)");
    high_water_ = std::max(high_water_, in_buf_.capacity() + out_buf_.capacity() + ZSTD_sizeof_DCtx(dctx_.get()));
    out_pos_ = 0;
    out_end_ = out.pos;
    if (r == 0) {
      frame_done_ = true;
      uint64_t frame_end = compressed_offset();
      size_t trailing = in_end_ - in_pos_;
      char probe[4096];
      size_t more;
      while ((more = std::fread(probe, 1, sizeof probe, file_.get())) > 0) {
        trailing += more;
        file_bytes_read_ += more;
        if (hash_) hash_->update(probe, more);
      }
      if (trailing > 0)
        fail("unexpected " + std::to_string(trailing) + " bytes after the end of the zstd frame at byte offset " +
             std::to_string(frame_end));
      return out_end_ > 0;
    }
    if (out_end_ > 0) return true;
  }
}

size_t ShardReader::read_payload(char* dst, size_t n) {
  size_t got = 0;
  while (got < n) {
    if (out_pos_ == out_end_ && !refill()) break;
    size_t take = std::min(n - got, out_end_ - out_pos_);
    if (dst) std::memcpy(dst + got, out_buf_.data() + out_pos_, take);
    out_pos_ += take;
    got += take;
  }
  payload_read_ += got;
  return got;
}

void ShardReader::finish_checks() {
  finished_ = true;
  uint64_t items = items_read_;
  if (documents_read_ != header_.documents || items != header_.items)
    fail("the header (byte offset 24) declares " + std::to_string(header_.documents) + " documents and " +
         std::to_string(header_.items) + (kind_ == ShardKind::text ? " text bytes" : " tokens") +
         " but the stream holds " + std::to_string(documents_read_) + " and " + std::to_string(items));
  if (kind_ == ShardKind::tokens && eot_seen_ != header_.documents)
    fail("the header declares " + std::to_string(header_.documents) + " documents but the stream holds " +
         std::to_string(eot_seen_) + " end-of-text separators");
  if (hash_) digest_ = hash_->hex_digest();
}

bool ShardReader::next_document(std::string& document) {
  if (kind_ != ShardKind::text) fail("next_document() on a tokens shard");
  if (finished_) return false;
  unsigned char len_bytes[4];
  size_t got = read_payload(reinterpret_cast<char*>(len_bytes), 4);
  if (got == 0) {
    finish_checks();
    return false;
  }
  if (got < 4) fail("stream ends inside the length prefix of document " + std::to_string(documents_read_));
  uint32_t length = get_u32(len_bytes);
  if (length > header_.items - std::min(items_read_, header_.items))
    fail("document " + std::to_string(documents_read_) + " at uncompressed offset " + std::to_string(payload_read_ - 4) +
         " claims " + std::to_string(length) + " bytes but the header declares only " +
         std::to_string(header_.items - items_read_) + " text bytes left");
  // Grown as the bytes arrive rather than sized from the (untrusted) length prefix up front: a
  // corrupt prefix must end in a clear error, not in a multi-gigabyte allocation.
  document.clear();
  size_t have = 0;
  while (have < length) {
    const size_t take = std::min<size_t>(length - have, size_t(1) << 20);
    document.resize(have + take);
    got = read_payload(document.data() + have, take);
    have += got;
    if (got < take)
      fail("stream ends inside document " + std::to_string(documents_read_) + " (" + std::to_string(have) + " of " +
           std::to_string(length) + " bytes)");
  }
  ++documents_read_;
  items_read_ += length;
  return true;
}

size_t ShardReader::read_tokens(std::span<uint16_t> out) {
  if (kind_ != ShardKind::tokens) fail("read_tokens() on a text shard");
  if (finished_ || out.empty()) return 0;
  size_t bytes = read_payload(reinterpret_cast<char*>(out.data()), out.size() * sizeof(uint16_t));
  if (bytes % 2 != 0) fail("stream ends inside a token (odd uncompressed length " + std::to_string(payload_read_) + ")");
  size_t n = bytes / 2;
  for (size_t i = 0; i < n; ++i) eot_seen_ += out[i] == kShardEotId;
  items_read_ += n;
  documents_read_ = eot_seen_;
  if (n < out.size()) finish_checks();
  return n;
}

void ShardReader::skip(uint64_t items) {
  uint64_t target = items_read_ + items;
  if (kind_ == ShardKind::tokens) {
    uint16_t scratch[4096];
    while (items_read_ < target) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(target - items_read_, std::size(scratch)));
      if (read_tokens(std::span<uint16_t>(scratch, want)) < want) break;
    }
  } else {
    target = documents_read_ + items;
    std::string scratch;  // documents are skipped one at a time, so this holds one document at most
    while (documents_read_ < target && next_document(scratch)) {
    }
    if (documents_read_ == target) return;
  }
  if ((kind_ == ShardKind::tokens ? items_read_ : documents_read_) < target)
    fail("cannot skip " + std::to_string(items) + (kind_ == ShardKind::text ? " documents" : " tokens") +
         ": the shard ends after " + std::to_string(kind_ == ShardKind::text ? documents_read_ : items_read_));
}

std::string ShardReader::sha256_hex() {
  if (!hash_) fail("sha256_hex() on a reader opened without hashing");
  if (!finished_) fail("sha256_hex() before the shard was read to its end");
  return digest_;
}

}  // namespace pipeline::datasets
