// A small JSON reader and string escaper for the engine's own files (stats.jsonl,
// stats_summary.json), so `pipeline stats` can read runs back without another dependency.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace pipeline::graph::json {

struct Value {
  enum class Kind { null, boolean, number, string, array, object } kind = Kind::null;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<Value> arr;
  std::map<std::string, Value> obj;

  const Value& operator[](const std::string& key) const;  // a null Value when absent
  double number(const std::string& key, double def = 0) const;
  std::string string(const std::string& key, const std::string& def = {}) const;
  bool boolean(const std::string& key, bool def = false) const;
};

/// Parses one JSON document; throws std::runtime_error with the byte offset on bad input.
Value parse(const std::string& text);
/// `s` as a quoted JSON string.
std::string quote(const std::string& s);

}  // namespace pipeline::graph::json
