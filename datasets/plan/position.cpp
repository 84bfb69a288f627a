// DatasetPosition as text, both ways (see position.h).
#include "datasets/plan/position.h"

#include <charconv>

#include "datasets/dataset_error.h"

namespace pipeline::datasets {

std::string DatasetPosition::str() const {
  return "epoch=" + std::to_string(epoch) + " shard=" + std::to_string(shard) + " item=" + std::to_string(item);
}

DatasetPosition DatasetPosition::parse(std::string_view s) {
  DatasetPosition p;
  bool seen[3] = {false, false, false};
  auto bad = [&](const std::string& why) {
    return DatasetError("dataset position \"" + std::string(s) + "\": " + why +
                        " (expected \"epoch=E shard=S item=I\")");
  };
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == ' ') {
      ++i;
      continue;
    }
    size_t eq = s.find('=', i);
    if (eq == std::string_view::npos) throw bad("missing '='");
    std::string_view key = s.substr(i, eq - i);
    size_t end = s.find(' ', eq);
    if (end == std::string_view::npos) end = s.size();
    std::string_view val = s.substr(eq + 1, end - eq - 1);
    uint64_t v = 0;
    auto [ptr, ec] = std::from_chars(val.data(), val.data() + val.size(), v);
    if (ec != std::errc() || ptr != val.data() + val.size() || val.empty())
      throw bad("\"" + std::string(val) + "\" is not a non-negative integer");
    int k = key == "epoch" ? 0 : key == "shard" ? 1 : key == "item" ? 2 : -1;
    if (k < 0) throw bad("unknown key \"" + std::string(key) + "\"");
    if (seen[k]) throw bad("\"" + std::string(key) + "\" given twice");
    seen[k] = true;
    if (k == 0) p.epoch = v;
    if (k == 1) {
      if (v > UINT32_MAX) throw bad("shard index too large");
      p.shard = static_cast<uint32_t>(v);
    }
    if (k == 2) p.item = v;
    i = end;
  }
  if (!seen[0] || !seen[1] || !seen[2]) throw bad("missing a key");
  return p;
}

}  // namespace pipeline::datasets
