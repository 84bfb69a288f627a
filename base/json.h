// The project's one JSON reader and string escaper: dataset manifests, JSON Lines records, the
// GPT-2 vocabulary, run statistics and checkpoint metadata. Errors carry the line, column and
// byte offset of the problem. The parsing is nlohmann/json's (strict RFC 8259, UTF-8 checked);
// this interface keeps it out of every other translation unit and gives each value its byte
// offset and each number its literal text.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pipeline {

struct JsonValue {
  enum class Type { null, boolean, number, string, array, object };
  Type type = Type::null;
  bool boolean = false;
  std::string text;  // the decoded string, or a number's literal text
  std::vector<JsonValue> items;                            // array elements
  std::vector<std::pair<std::string, JsonValue>> members;  // object members in file order
  size_t offset = 0;                                       // byte offset where the value starts

  // Declared here, defined in json.cpp: a type that holds pairs of itself must not have them
  // generated where it is still incomplete (clang with libstdc++ rejects that).
  JsonValue();
  JsonValue(const JsonValue&);
  JsonValue(JsonValue&&) noexcept;
  JsonValue& operator=(const JsonValue&);
  JsonValue& operator=(JsonValue&&) noexcept;
  ~JsonValue();

  /// Object member by key, or nullptr (also for non-objects).
  const JsonValue* find(std::string_view key) const;
  /// Member `key` read as a number, string or boolean; `def` when absent or of another type.
  double number(std::string_view key, double def = 0) const;
  std::string string(std::string_view key, const std::string& def = {}) const;
  bool flag(std::string_view key, bool def = false) const;
  /// Elements of the array member `key` (empty when absent).
  const std::vector<JsonValue>& array(std::string_view key) const;
  static const char* type_name(Type t);
};

/// Thrown by json_parse; `what()` is "line L, column C (byte offset O): message".
struct JsonParseError : std::runtime_error {
  JsonParseError(size_t offset, size_t line, size_t column, const std::string& message);
  size_t offset, line, column;
  std::string message;
};

/// Parses exactly one JSON value (surrounding whitespace allowed, anything else after it is an error).
JsonValue json_parse(std::string_view text);

/// `s` as a quoted JSON string literal (control characters, quotes and backslashes escaped;
/// invalid UTF-8 sequences become U+FFFD, so the output is always valid JSON).
std::string json_quote(std::string_view s);

/// `x` printed with the printf `format` ("%.9g": a float32 exactly), or null when it is not finite
/// (JSON has no NaN or infinity: a diverged loss is written as null).
std::string json_number(double x, const char* format = "%.9g");

}  // namespace pipeline
