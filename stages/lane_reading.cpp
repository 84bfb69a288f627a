// See lane_reading.h.
#include "stages/lane_reading.h"

#include <algorithm>

#include "stages/dry_run.h"

namespace pipeline::stages {

LaneReader::LaneReader(RunContext& rc, datasets::SourceRequest source, const std::string& stage)
    : rc_(rc), session_(*rc.lanes) {
  source.lanes = session_.lanes;
  order_ = std::move(*open_stage_source(source, stage).order);
  for (const auto& src : order_.sources)  // a source that reads slowly by lanes says so, and what to do
    if (const auto note = src.catalog->slow_reading_note(); !note.empty() && rc.writer()) rc.log->print(stage + ": " + note);
  if (session_.start.empty()) session_.start = datasets::start_cursors(order_, session_.mine);  // a fresh run
  session_.content = order_.content;
  if (order_.content == datasets::UnitContent::documents)
    documents_.emplace(order_, session_.start);
  else
    tokens_.emplace(order_, session_.start);
}

std::optional<size_t> LaneReader::neediest() const {
  const size_t i = session_.demand->neediest();
  if (i >= session_.demand->size()) return std::nullopt;
  return i;
}

bool LaneReader::next_documents(TextChunk& chunk, size_t bytes) {
  while (const auto i = neediest()) {
    chunk.lane = documents_->lane(*i);
    std::string_view doc;
    datasets::LanePlace place;
    while (chunk.text.size() < bytes) {
      if (!documents_->next(*i, doc, place)) {  // the lane has ended ([data] loop = false)
        session_.demand->ended(*i);
        break;
      }
      chunk.places.push_back(place);
      chunk.text += doc;
      chunk.ends.push_back(static_cast<uint32_t>(chunk.text.size()));
    }
    if (chunk.ends.empty()) continue;
    // GPT-2's BPE makes about a token of 4 bytes of English, and each document one <|endoftext|>.
    chunk.estimate = chunk.text.size() / 4 + chunk.ends.size();
    session_.demand->sent(*i, chunk.estimate);
    return true;
  }
  return false;
}

bool LaneReader::next_tokens(TokenChunk& chunk, size_t tokens) {
  chunk.tokens.resize(tokens);
  chunk.content = datasets::UnitContent::tokens;
  while (const auto i = neediest()) {
    chunk.lane = tokens_->lane(*i);
    size_t filled = 0;
    datasets::LanePlace place;
    while (filled < tokens) {
      const size_t n = tokens_->read(*i, std::span<uint16_t>(chunk.tokens).subspan(filled), place);
      if (n == 0) {  // the lane has ended ([data] loop = false)
        session_.demand->ended(*i);
        break;
      }
      filled += n;
      chunk.places.push_back(place);
      chunk.ends.push_back(static_cast<uint32_t>(filled));
    }
    if (filled == 0) continue;
    chunk.tokens.resize(filled);
    chunk.estimate = filled;
    session_.demand->sent(*i, chunk.estimate);
    return true;
  }
  return false;
}

size_t LaneReader::memory() const { return documents_ ? documents_->memory() : tokens_->memory(); }

size_t lane_chunk_tokens(const RunContext& rc) {
  const auto& t = rc.cfg.training;
  const auto lanes = static_cast<int64_t>(std::max<size_t>(1, rc.lanes->mine.size()));
  return static_cast<size_t>(std::max({t.seq_len, t.batch_size * t.seq_len / lanes, kLeastLaneChunkTokens}));
}

}  // namespace pipeline::stages
