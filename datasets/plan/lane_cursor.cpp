// Lane cursors as text and as a checkpoint's JSON, both ways (lane_cursor.h).
#include "datasets/plan/lane_cursor.h"

#include <algorithm>
#include <charconv>

#include "datasets/dataset_error.h"

namespace pipeline::datasets {
namespace {

constexpr const char* kCursorForm = "\"lane=L draws=D tokens=T units=N0,N1,... items=I0,I1,...\"";

uint64_t parse_count(std::string_view text, std::string_view key, const std::string& whole) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size())
    throw DatasetError("lane cursor \"" + whole + "\": " + std::string(key) + ": \"" + std::string(text) +
                       "\" is not a non-negative integer (expected " + kCursorForm + ")");
  return v;
}

std::vector<uint64_t> parse_list(std::string_view text, std::string_view key, const std::string& whole) {
  std::vector<uint64_t> out;
  size_t i = 0;
  for (;;) {
    const size_t comma = text.find(',', i);
    out.push_back(parse_count(text.substr(i, comma == std::string_view::npos ? std::string_view::npos : comma - i),
                              key, whole));
    if (comma == std::string_view::npos) return out;
    i = comma + 1;
  }
}

}  // namespace

LaneCursor LaneCursor::start(uint32_t lane, size_t sources) {
  LaneCursor c;
  c.lane = lane;
  c.sources.assign(sources, SourceCursor{});
  return c;
}

std::string LaneCursor::str() const {
  std::string units, items;
  for (size_t i = 0; i < sources.size(); ++i) {
    units += (i ? "," : "") + std::to_string(sources[i].unit);
    items += (i ? "," : "") + std::to_string(sources[i].item);
  }
  return "lane=" + std::to_string(lane) + " draws=" + std::to_string(draws) + " tokens=" + std::to_string(tokens) +
         " units=" + units + " items=" + items;
}

LaneCursor LaneCursor::parse(std::string_view text) {
  const std::string whole(text);
  static constexpr std::string_view kKeys[] = {"lane", "draws", "tokens", "units", "items"};
  bool seen[5] = {};
  LaneCursor c;
  std::vector<uint64_t> units, items;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ') {
      ++i;
      continue;
    }
    size_t end = text.find(' ', i);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view field = text.substr(i, end - i);
    const size_t eq = field.find('=');
    if (eq == std::string_view::npos)
      throw DatasetError("lane cursor \"" + whole + "\": \"" + std::string(field) + "\" is not KEY=VALUE (expected " +
                         kCursorForm + ")");
    const std::string_view key = field.substr(0, eq), value = field.substr(eq + 1);
    const auto k = static_cast<size_t>(std::find(std::begin(kKeys), std::end(kKeys), key) - std::begin(kKeys));
    if (k == std::size(kKeys))
      throw DatasetError("lane cursor \"" + whole + "\": unknown key \"" + std::string(key) + "\" (expected " +
                         kCursorForm + ")");
    if (seen[k]) throw DatasetError("lane cursor \"" + whole + "\": " + std::string(key) + " given twice");
    seen[k] = true;
    if (k == 0) {
      const uint64_t lane = parse_count(value, key, whole);
      if (lane > UINT32_MAX) throw DatasetError("lane cursor \"" + whole + "\": lane: " + std::to_string(lane) + " is too large");
      c.lane = static_cast<uint32_t>(lane);
    } else if (k == 1) {
      c.draws = parse_count(value, key, whole);
    } else if (k == 2) {
      c.tokens = parse_count(value, key, whole);
    } else {
      (k == 3 ? units : items) = parse_list(value, key, whole);
    }
    i = end;
  }
  for (size_t k = 0; k < std::size(kKeys); ++k)
    if (!seen[k])
      throw DatasetError("lane cursor \"" + whole + "\": " + std::string(kKeys[k]) + " is missing (expected " +
                         kCursorForm + ")");
  if (units.size() != items.size())
    throw DatasetError("lane cursor \"" + whole + "\": items: " + std::to_string(items.size()) + " values for " +
                       std::to_string(units.size()) + " units (one of each per source)");
  for (size_t s = 0; s < units.size(); ++s) c.sources.push_back({units[s], items[s]});
  return c;
}

std::string lane_cursors_to_json(std::span<const LaneCursor> cursors, uint32_t lanes) {
  std::string out = "{\"lanes\": " + std::to_string(lanes) + ", \"cursors\": [";
  for (size_t i = 0; i < cursors.size(); ++i) out += (i ? ", " : "") + json_quote(cursors[i].str());
  return out + "]}";
}

std::vector<LaneCursor> lane_cursors_from_json(const JsonValue& v, size_t sources) {
  auto fail = [&](const JsonValue& at, const std::string& field, const std::string& why) {
    return DatasetError("lane cursors: " + field + " (byte offset " + std::to_string(at.offset) + "): " + why);
  };
  if (v.type != JsonValue::Type::object) throw fail(v, "the value", "expected an object {\"lanes\": K, \"cursors\": [...]}");
  const JsonValue* lanes = v.find("lanes");
  if (!lanes || lanes->type != JsonValue::Type::number) throw fail(v, "lanes", "missing, or not a number");
  uint64_t k = 0;
  auto [p, ec] = std::from_chars(lanes->text.data(), lanes->text.data() + lanes->text.size(), k);
  if (ec != std::errc() || p != lanes->text.data() + lanes->text.size() || k == 0 || k > UINT32_MAX)
    throw fail(*lanes, "lanes", "expected a positive integer, found " + lanes->text);
  const JsonValue* list = v.find("cursors");
  if (!list || list->type != JsonValue::Type::array) throw fail(v, "cursors", "missing, or not an array");
  if (list->items.size() != k)
    throw fail(*list, "cursors", std::to_string(list->items.size()) + " cursors for " + std::to_string(k) + " lanes");
  std::vector<LaneCursor> out(k);
  std::vector<bool> seen(k, false);
  for (size_t i = 0; i < list->items.size(); ++i) {
    const JsonValue& item = list->items[i];
    const std::string field = "cursors[" + std::to_string(i) + "]";
    if (item.type != JsonValue::Type::string) throw fail(item, field, "expected a string");
    LaneCursor c;
    try {
      c = LaneCursor::parse(item.text);
    } catch (const DatasetError& e) {
      throw fail(item, field, e.what());
    }
    if (c.lane >= k) throw fail(item, field, "lane " + std::to_string(c.lane) + " of " + std::to_string(k) + " lanes");
    if (seen[c.lane]) throw fail(item, field, "lane " + std::to_string(c.lane) + " given twice");
    if (c.sources.size() != sources)
      throw fail(item, field, std::to_string(c.sources.size()) + " sources, the data order has " + std::to_string(sources));
    seen[c.lane] = true;
    out[c.lane] = std::move(c);
  }
  return out;
}

}  // namespace pipeline::datasets
