// Fuzzes the lane cursor's readers (datasets/plan/lane_cursor.h): any text either parses or raises
// DatasetError, and a parsed cursor written back reads back the same; any JSON either gives one
// cursor per lane or raises DatasetError, and what it gives written back reads back the same.
#include <cstdint>
#include <string>
#include <vector>

#include "base/json.h"
#include "datasets/dataset_error.h"
#include "datasets/plan/lane_cursor.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace ds = pipeline::datasets;
  const std::string_view text = fuzz_util::as_text(data, size);
  try {
    const ds::LaneCursor c = ds::LaneCursor::parse(text);
    if (ds::LaneCursor::parse(c.str()) != c) fuzz_util::broken("a cursor written back reads back otherwise: " + c.str());
  } catch (const ds::DatasetError&) {
  }
  pipeline::JsonValue v;
  try {
    v = pipeline::json_parse(text);
  } catch (const pipeline::JsonParseError&) {
    return 0;
  }
  for (size_t sources = 1; sources <= 3; ++sources) {
    std::vector<ds::LaneCursor> cursors;
    try {
      cursors = ds::lane_cursors_from_json(v, sources);
    } catch (const ds::DatasetError&) {
      continue;
    }
    for (size_t l = 0; l < cursors.size(); ++l)
      if (cursors[l].lane != l || cursors[l].sources.size() != sources) fuzz_util::broken("cursors not one per lane");
    const std::string json = ds::lane_cursors_to_json(cursors, static_cast<uint32_t>(cursors.size()));
    try {
      if (ds::lane_cursors_from_json(pipeline::json_parse(json), sources) != cursors)
        fuzz_util::broken("cursors written back read back otherwise: " + json);
    } catch (const std::exception& e) {
      fuzz_util::broken(std::string("cursors we wrote do not read back: ") + e.what() + "\n" + json);
    }
  }
  return 0;
}
