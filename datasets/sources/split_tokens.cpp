// The token stream of a split (see split_tokens.h).
#include "datasets/sources/split_tokens.h"

#include <algorithm>
#include <stdexcept>

#include "datasets/sources/dataset_manifest.h"
#include "datasets/sources/dataset_reader.h"
#include "datasets/parquet/parquet_reader.h"
#include "datasets/tokenizer/tokenizer.h"

namespace pipeline::datasets {

struct SplitTokens::Impl {
  std::unique_ptr<TokenDatasetReader> tokens;  // token datasets and llm.c shards
  std::unique_ptr<TextDatasetReader> text;
  std::unique_ptr<ParquetDocumentReader> parquet;
  std::vector<uint32_t> pending;  // tokens of the documents read, not yet handed out
  size_t taken = 0;               // of pending
  std::string doc;

  // The next document's tokens into pending; false at the end.
  bool refill() {
    const bool more = text ? text->next(doc) : parquet->next(doc);
    if (!more) return false;
    pending.clear();
    taken = 0;
    pending.push_back(Tokenizer::eot_id);
    Tokenizer::gpt2().encode_ordinary_append(doc, pending);
    return true;
  }
};

SplitTokens::SplitTokens() : impl_(std::make_unique<Impl>()) {}
SplitTokens::~SplitTokens() = default;
SplitTokens::SplitTokens(SplitTokens&&) noexcept = default;
SplitTokens& SplitTokens::operator=(SplitTokens&&) noexcept = default;

void SplitTokens::open(const std::filesystem::path& source, const std::string& split) {
  impl_ = std::make_unique<Impl>();
  if (is_parquet_source(source)) {
    impl_->parquet = std::make_unique<ParquetDocumentReader>();
    ParquetReaderOptions o;
    o.shuffle = false;
    impl_->parquet->open(source, {}, /*loop=*/false, o);
    return;
  }
  const Manifest manifest = load_dataset_manifest(source);
  if (!manifest.splits.count(split)) throw DatasetError(source.string() + ": no split '" + split + "'");
  if (manifest.kind == ShardKind::tokens) {
    impl_->tokens = std::make_unique<TokenDatasetReader>();
    impl_->tokens->open(source, split);
  } else {
    impl_->text = std::make_unique<TextDatasetReader>();
    impl_->text->open(source, split);
  }
}

size_t SplitTokens::read(std::span<uint16_t> out) {
  Impl& m = *impl_;
  if (m.tokens) {
    size_t n = 0, got;
    while (n < out.size() && (got = m.tokens->read(out.subspan(n))) > 0) n += got;
    return n;
  }
  if (!m.text && !m.parquet) throw std::logic_error("SplitTokens::read before open");
  size_t n = 0;
  while (n < out.size()) {
    if (m.taken == m.pending.size() && !m.refill()) break;
    const size_t k = std::min(out.size() - n, m.pending.size() - m.taken);
    for (size_t i = 0; i < k; ++i) out[n + i] = static_cast<uint16_t>(m.pending[m.taken + i]);
    n += k;
    m.taken += k;
  }
  return n;
}

std::vector<uint16_t> read_split_tokens(const std::filesystem::path& source, const std::string& split, int64_t n) {
  SplitTokens s;
  s.open(source, split);
  std::vector<uint16_t> ids(static_cast<size_t>(std::max<int64_t>(n, 0)));
  ids.resize(s.read(ids));
  return ids;
}

}  // namespace pipeline::datasets
