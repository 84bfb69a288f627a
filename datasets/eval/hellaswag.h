// HellaSwag's validation items as GPT-2 reproductions score them (build-nanogpt's hellaswag.py,
// llm.c): read from the official hellaswag_val.jsonl (one object per line with "ctx", "endings"
// and "label"; every other member is ignored) and tokenized here, torch-free. The scoring is in
// model/eval/hellaswag.h.
//
// The context is `ctx` tokenized alone; each ending is tokenized as " " + ending, alone too (as the
// references do: tokens are not merged across the boundary). The model sees context + ending; a
// sequence longer than its context (plus the last target) is cut from the left, the ending kept
// whole (hellaswag_row).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace pipeline::datasets {

struct HellaSwagItem {
  int64_t line = 0;                              // 1-based line of the file
  int label = 0;                                 // the right ending, 0..3
  std::vector<uint32_t> context;                 // (tokens of ctx)
  std::array<std::vector<uint32_t>, 4> endings;  // (tokens of " " + endings[i])
};

struct HellaSwagSet {
  std::filesystem::path file;
  std::vector<HellaSwagItem> items;  // in file order
};

/// Reads and tokenizes the first `max_items` items of a HellaSwag JSONL file (0: all). Blank lines
/// are skipped. `label` may be a number or a string of one digit (the Hugging Face copy's). A
/// missing file, a line that is not a JSON object, or a missing or malformed field is a
/// std::runtime_error "FILE:LINE: field 'F': expected ..., got ..."; a file without items too.
HellaSwagSet load_hellaswag(const std::filesystem::path& file, int64_t max_items = 0);

/// What the model reads for one ending: context + ending, cut from the left to at most
/// `block_size` + 1 tokens with the ending whole (the last token is a target only: the model reads
/// the first block_size, as lm-eval's max_length + 1); the ending starts at tokens[ending_begin]
/// (>= 1).
struct HellaSwagRow {
  std::vector<uint32_t> tokens;
  size_t ending_begin = 0;
};
HellaSwagRow hellaswag_row(const HellaSwagItem& item, int ending, int64_t block_size);

/// Throws, naming the file, line and ending, when an ending has more than `block_size` tokens (it
/// needs one context token before it to be scored whole).
void check_hellaswag_fits(const HellaSwagSet& set, int64_t block_size);

}  // namespace pipeline::datasets
