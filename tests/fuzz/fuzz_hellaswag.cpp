// Fuzzes the HellaSwag reader (datasets/eval/hellaswag.h): any bytes either read as items or raise
// std::runtime_error naming the file; read items have a label from 0 to 3, lines that rise, and,
// for each context size they fit, rows of at most that size + 1 tokens whose tail is the ending
// whole after at least one token of the context's end.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "datasets/eval/hellaswag.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipeline::datasets;
  static fuzz_util::InputFile file;
  const auto& path = file.write(data, size);
  HellaSwagSet set;
  try {
    set = load_hellaswag(path);
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).rfind(path, 0) != 0) fuzz_util::broken(std::string("an error without the file: ") + e.what());
    return 0;
  }
  if (set.items.empty()) fuzz_util::broken("a set without items was accepted");
  int64_t line = 0;
  for (const auto& item : set.items) {
    if (item.label < 0 || item.label > 3) fuzz_util::broken("label " + std::to_string(item.label));
    if (item.line <= line) fuzz_util::broken("lines that do not rise");
    line = item.line;
  }
  for (int64_t block : {1, 4, 64}) {
    try {
      check_hellaswag_fits(set, block);
    } catch (const std::runtime_error&) {
      continue;
    }
    for (const auto& item : set.items)
      for (int e = 0; e < 4; ++e) {
        const auto row = hellaswag_row(item, e, block);
        const auto& ending = item.endings[static_cast<size_t>(e)];
        if (row.tokens.size() > static_cast<size_t>(block) + 1) fuzz_util::broken("a row longer than the context + 1");
        if (row.ending_begin < 1 && !item.context.empty()) fuzz_util::broken("an ending with no context before it");
        if (row.tokens.size() != row.ending_begin + ending.size() ||
            !std::equal(ending.begin(), ending.end(), row.tokens.begin() + static_cast<std::ptrdiff_t>(row.ending_begin)))
          fuzz_util::broken("a row whose tail is not the ending");
        if (!std::equal(row.tokens.begin(), row.tokens.begin() + static_cast<std::ptrdiff_t>(row.ending_begin),
                        item.context.end() - static_cast<std::ptrdiff_t>(row.ending_begin)))
          fuzz_util::broken("a row whose head is not the context's end");
      }
  }
  return 0;
}
