// Shard writer and streaming reader, both formats (described in shard.h).
#include "datasets/shards/shard.h"

#include "datasets/shards/shard_bytes.h"

#include <zstd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

namespace pipeline::datasets {
namespace {

using namespace shard_bytes;

static_assert(std::endian::native == std::endian::little, "token shards are read as little-endian uint16 in place");

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
    : path_(path), kind_(kind), options_(options), file_(path), cctx_(ZSTD_createCCtx()) {
  if (!cctx_) throw DatasetError(path.string() + ": cannot allocate a zstd compression context");
  size_t r = ZSTD_CCtx_setParameter(cctx_.get(), ZSTD_c_compressionLevel, options.level);
  if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(cctx_.get(), ZSTD_c_checksumFlag, 1);
  if (ZSTD_isError(r))
    throw DatasetError(path.string() + ": zstd rejected level " + std::to_string(options.level) + ": " +
                       ZSTD_getErrorName(r));
  out_buf_.resize(ZSTD_CStreamOutSize());
  unsigned char header[kShardHeaderBytes] = {};  // counts are patched in by finish()
  put_u32(header, kHeaderMagic);
  put_u32(header + 4, kShardHeaderBytes - 8);
  std::memcpy(header + 8, magic_of(kind), 8);
  put_u32(header + 16, options.block_bytes > 0 ? kShardFormatVersion : kShardFormatOneFrame);
  file_.write(header, sizeof header);
}

void ShardWriter::compress(const void* data, size_t size) {
  payload_bytes_ += size;
  if (options_.block_bytes > 0) {  // into the open block, compressed whole when it closes
    const char* p = static_cast<const char*>(data);
    block_.insert(block_.end(), p, p + size);
    return;
  }
  ZSTD_inBuffer in{data, size, 0};
  while (in.pos < in.size) {
    ZSTD_outBuffer out{out_buf_.data(), out_buf_.size(), 0};
    size_t r = ZSTD_compressStream2(cctx_.get(), &out, &in, ZSTD_e_continue);
    if (ZSTD_isError(r)) throw DatasetError(path_.string() + ": zstd compression failed: " + ZSTD_getErrorName(r));
    file_.write(out_buf_.data(), out.pos);
  }
}

void ShardWriter::end_document(uint64_t items) {
  ++documents_;
  items_ += items;
  ++block_documents_;
  block_items_ += items;
  if (options_.block_bytes > 0 && block_.size() >= options_.block_bytes) flush_block();
}

void ShardWriter::flush_block() {
  if (block_documents_ == 0) return;
  // One frame, compressed at once: its header records the payload size, so its reader allocates
  // exactly that, and zstd's window is no larger than the block.
  out_buf_.resize(std::max(out_buf_.size(), ZSTD_compressBound(block_.size())));
  const size_t n = ZSTD_compress2(cctx_.get(), out_buf_.data(), out_buf_.size(), block_.data(), block_.size());
  if (ZSTD_isError(n)) throw DatasetError(path_.string() + ": zstd compression failed: " + ZSTD_getErrorName(n));
  blocks_.push_back({file_.size(), n, block_documents_, block_items_});
  file_.write(out_buf_.data(), n);
  block_.clear();
  block_documents_ = block_items_ = 0;
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
  end_document(text.size());
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
  end_document(token_buf_.size());
}

ShardWriter::Summary ShardWriter::finish() {
  if (finished_) throw DatasetError(path_.string() + ": finish() called twice");
  if (options_.block_bytes > 0) {
    flush_block();
    // The index frame: the entries, then their count and the closing magic, found from the end.
    std::vector<unsigned char> index(8 + kIndexEntryBytes * blocks_.size() + kIndexTailBytes);
    put_u32(index.data(), kIndexMagic);
    put_u32(index.data() + 4, static_cast<uint32_t>(index.size() - 8));
    unsigned char* e = index.data() + 8;
    for (const ShardBlock& b : blocks_) {
      put_u64(e, b.offset);
      put_u64(e + 8, b.bytes);
      put_u64(e + 16, b.documents);
      put_u64(e + 24, b.items);
      e += kIndexEntryBytes;
    }
    put_u64(e, blocks_.size());
    std::memcpy(e + 8, kIndexEnd, 8);
    file_.write(index.data(), index.size());
  } else {
    for (;;) {
      ZSTD_inBuffer in{nullptr, 0, 0};
      ZSTD_outBuffer out{out_buf_.data(), out_buf_.size(), 0};
      size_t r = ZSTD_compressStream2(cctx_.get(), &out, &in, ZSTD_e_end);
      if (ZSTD_isError(r)) throw DatasetError(path_.string() + ": zstd compression failed: " + ZSTD_getErrorName(r));
      file_.write(out_buf_.data(), out.pos);
      if (r == 0) break;
    }
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
  s.blocks = blocks_.size();
  return s;
}

// ---------------------------------------------------------------------------------------------
// ShardReader

ShardReader::ShardReader(const std::filesystem::path& path, ShardKind expected_kind, bool hash)
    : ShardReader(io::open_local_file(path), expected_kind, hash) {}

ShardReader::ShardReader(std::unique_ptr<io::RangeFile> file, ShardKind expected_kind, bool hash)
    : path_(file->name()), kind_(expected_kind), file_(std::move(file)) {
  if (hash) hash_ = std::make_unique<Sha256>();

  unsigned char h[kShardHeaderBytes];
  size_t n = fetch(h, sizeof h);
  unsigned char expected[16];
  put_u32(expected, kHeaderMagic);
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
  if (header_.version != kShardFormatOneFrame && header_.version != kShardFormatVersion)
    fail("wrong format version at byte offset 16: found version " + std::to_string(header_.version) +
         ", this build reads versions 1 and 2");

  dctx_.reset(ZSTD_createDCtx());
  if (!dctx_) fail("cannot allocate a zstd decompression context");
  in_buf_.resize(ZSTD_DStreamInSize());
  out_buf_.resize(ZSTD_DStreamOutSize());

  in_end_ = fetch(in_buf_.data(), in_buf_.size());
  if (header_.version == kShardFormatVersion) {
    // A block shard may hold no block at all (an empty shard): its index follows the header.
    if (!next_frame(kShardHeaderBytes)) frame_done_ = true;
  } else {
    check_frame_header(kShardHeaderBytes, reinterpret_cast<const unsigned char*>(in_buf_.data()), in_end_);
  }
  high_water_ = in_buf_.capacity() + out_buf_.capacity() + ZSTD_sizeof_DCtx(dctx_.get());
}

void ShardReader::fail(const std::string& what) const { throw DatasetError(path_.string() + ": " + what); }

size_t ShardReader::fetch(void* dst, size_t n) {
  const size_t got = file_->read_at(file_bytes_read_, dst, n);
  file_bytes_read_ += got;
  if (hash_) hash_->update(dst, got);
  return got;
}

uint64_t ShardReader::compressed_offset() const { return file_bytes_read_ - (in_end_ - in_pos_); }

// The frame must carry a content checksum: it is what turns a flipped byte into an error.
void ShardReader::check_frame_header(uint64_t at, const unsigned char* head, size_t n) const {
  if (n < 6)
    fail("truncated: file ends at byte offset " + std::to_string(at + n) + " before the zstd frame header (expected at byte offset " +
         std::to_string(at) + ")");
  if (get_u32(head) != kZstdFrameMagic)
    fail("corrupt: no zstd frame at byte offset " + std::to_string(at) + " (found " + hex_bytes(head, 4) +
         ", expected 28 b5 2f fd)");
  if ((head[4] & 0x04) == 0)
    fail("the zstd frame at byte offset " + std::to_string(at) +
         " has no content checksum; shards must be written with checksums on");
}

// At byte offset `at`, where a block shard's frame ended (or its first begins): either another
// block's frame, or the block index, which must match the frames seen and end the file.
bool ShardReader::next_frame(uint64_t at) {
  if (!frames_.empty()) frames_.back().bytes = at - frames_.back().offset;
  if (in_end_ - in_pos_ < 8) {  // the next frame's first bytes, whole, at the buffer's start
    std::memmove(in_buf_.data(), in_buf_.data() + in_pos_, in_end_ - in_pos_);
    in_end_ -= in_pos_;
    in_pos_ = 0;
    in_end_ += fetch(in_buf_.data() + in_end_, in_buf_.size() - in_end_);
  }
  const auto* head = reinterpret_cast<const unsigned char*>(in_buf_.data() + in_pos_);
  const size_t have = in_end_ - in_pos_;
  if (have >= 4 && get_u32(head) == kIndexMagic) {
    // The index: read from the file where it lies (it may be larger than the buffer).
    const uint64_t size = file_->size();
    const uint64_t expected = 8 + kIndexEntryBytes * frames_.size() + kIndexTailBytes;
    if (size - at != expected)
      fail("the block index at byte offset " + std::to_string(at) + " is " + std::to_string(size - at) +
           " bytes to the end of the file; " + std::to_string(frames_.size()) + " blocks make an index of " +
           std::to_string(expected) + " bytes");
    std::vector<unsigned char> index(expected);
    if (at + have >= size) {
      std::memcpy(index.data(), head, expected);
    } else {
      if (file_->read_at(at, index.data(), index.size()) != index.size())
        fail("truncated: the block index at byte offset " + std::to_string(at) + " ends early");
      if (hash_) hash_->update(index.data() + have, index.size() - have);
      file_bytes_read_ = size;
    }
    in_pos_ = in_end_;
    if (get_u32(index.data() + 4) != expected - 8 || get_u64(index.data() + expected - 16) != frames_.size() ||
        std::memcmp(index.data() + expected - 8, kIndexEnd, 8) != 0)
      fail("corrupt block index at byte offset " + std::to_string(at) + ": its size, count or closing magic do not "
           "match the " + std::to_string(frames_.size()) + " blocks of the shard");
    uint64_t documents = 0, items = 0;
    for (size_t b = 0; b < frames_.size(); ++b) {
      const unsigned char* e = index.data() + 8 + kIndexEntryBytes * b;
      if (get_u64(e) != frames_[b].offset || get_u64(e + 8) != frames_[b].bytes)
        fail("block index entry " + std::to_string(b) + " (byte offset " + std::to_string(at + 8 + kIndexEntryBytes * b) +
             ") records a frame at byte offset " + std::to_string(get_u64(e)) + " of " + std::to_string(get_u64(e + 8)) +
             " bytes, but the block's frame is at " + std::to_string(frames_[b].offset) + " and " +
             std::to_string(frames_[b].bytes) + " bytes");
      documents += get_u64(e + 16);
      items += get_u64(e + 24);
    }
    if (documents != header_.documents || items != header_.items)
      fail("the block index at byte offset " + std::to_string(at) + " counts " + std::to_string(documents) +
           " documents and " + std::to_string(items) + " items, the header (byte offset 24) " +
           std::to_string(header_.documents) + " and " + std::to_string(header_.items));
    return false;
  }
  check_frame_header(at, head, have);
  frames_.push_back({at, 0, 0, 0});
  return true;
}

bool ShardReader::refill() {
  if (frame_done_) return false;
  for (;;) {
    if (in_pos_ == in_end_) {
      in_pos_ = 0;
      in_end_ = fetch(in_buf_.data(), in_buf_.size());
      if (in_end_ == 0)
        fail("truncated: file ends at byte offset " + std::to_string(file_bytes_read_) +
             " inside the zstd frame (the frame is incomplete; the file was cut short)");
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
      const uint64_t frame_end = compressed_offset();
      if (header_.version == kShardFormatVersion) {
        if (next_frame(frame_end)) {  // the next block: the context starts a new frame by itself
          if (out_end_ > 0) return true;
          continue;
        }
        frame_done_ = true;
        return out_end_ > 0;
      }
      frame_done_ = true;
      size_t trailing = in_end_ - in_pos_;
      char probe[4096];
      for (size_t more; (more = fetch(probe, sizeof probe)) > 0;) trailing += more;
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
