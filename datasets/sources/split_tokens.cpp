// The token stream of a split (see split_tokens.h).
#include "datasets/sources/split_tokens.h"

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "datasets/lanes/data_order.h"
#include "datasets/lanes/document_lanes.h"
#include "datasets/lanes/token_lanes.h"
#include "datasets/sources/dataset_manifest.h"
#include "datasets/sources/dataset_reader.h"
#include "datasets/parquet/parquet_reader.h"
#include "datasets/tokenizer/tokenizer.h"

namespace pipeline::datasets {

struct SplitTokens::Impl {
  std::unique_ptr<TokenDatasetReader> tokens;  // token datasets and llm.c shards
  std::unique_ptr<TextDatasetReader> text;
  std::unique_ptr<ParquetDocumentReader> parquet;
  // A remote source: one lane of its data order, unshuffled (the lanes hold the order by reference).
  std::unique_ptr<DataOrder> order;
  std::optional<DocumentLanes> remote_documents;
  std::optional<TokenLanes> remote_tokens;
  bool whole = false;  // Parquet
  std::vector<uint32_t> pending;  // tokens of the documents read, not yet handed out
  size_t taken = 0;               // of pending
  std::string doc;

  // The next document's tokens into pending; false at the end.
  bool refill() {
    if (remote_documents) {
      std::string_view view;
      LanePlace place;
      if (!remote_documents->next(0, view, place)) return false;
      doc.assign(view);
    } else if (!(text ? text->next(doc) : parquet->next(doc))) {
      return false;
    }
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

void SplitTokens::open(const std::filesystem::path& source, const std::string& split, const io::StoreOptions& store) {
  impl_ = std::make_unique<Impl>();
  if (io::is_remote_source(source.string())) {
    Impl& m = *impl_;
    m.order = std::make_unique<DataOrder>(open_data_order(
        {{source.string()}}, {.lanes = 1, .shuffle = false, .loop = false, .split = split, .store = store}));
    const auto starts = start_cursors(*m.order, {0});
    m.whole = m.order->sources.front().catalog->format == SourceFormat::parquet;
    if (m.order->content == UnitContent::tokens)
      m.remote_tokens.emplace(*m.order, starts);
    else
      m.remote_documents.emplace(*m.order, starts);
    return;
  }
  if (is_parquet_source(source)) {
    impl_->whole = true;
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

bool SplitTokens::whole_source() const { return impl_->whole; }

size_t SplitTokens::read(std::span<uint16_t> out) {
  Impl& m = *impl_;
  if (m.tokens || m.remote_tokens) {
    size_t n = 0, got;
    LanePlace place;
    while (n < out.size() &&
           (got = m.tokens ? m.tokens->read(out.subspan(n)) : m.remote_tokens->read(0, out.subspan(n), place)) > 0)
      n += got;
    return n;
  }
  if (!m.text && !m.parquet && !m.remote_documents) throw std::logic_error("SplitTokens::read before open");
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

std::vector<uint16_t> read_split_tokens(const std::filesystem::path& source, const std::string& split, int64_t n,
                                        const io::StoreOptions& store) {
  SplitTokens s;
  s.open(source, split, store);
  std::vector<uint16_t> ids(static_cast<size_t>(std::max<int64_t>(n, 0)));
  ids.resize(s.read(ids));
  return ids;
}

}  // namespace pipeline::datasets
