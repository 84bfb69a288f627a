// The project's JSON module (see json.h): nlohmann/json's SAX parser does the parsing; this file
// only builds JsonValue trees from its events and recovers what the events do not carry (the byte
// offset of each value and the literal text of numbers) from the input itself.
#include "base/json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>

#include <nlohmann/json.hpp>

namespace pipeline {
namespace {

constexpr size_t kMaxDepth = 256;  // deeper input is rejected: JsonValue's destructor recurses

// A `const char*` that publishes how far nlohmann's lexer has read. The lexer reads a token and
// at most one character after it (a number's terminator) before the parser reports the token, so
// each SAX event can place its value in the input.
struct CountingIterator {
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  const char* p = nullptr;
  const char** read_to = nullptr;  // shared with the handler

  reference operator*() const { return *p; }
  CountingIterator& operator++() {
    *read_to = ++p;
    return *this;
  }
  CountingIterator operator++(int) {
    CountingIterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const CountingIterator& o) const { return p == o.p; }
};

bool is_number_char(char c) { return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'; }

class TreeBuilder : public nlohmann::json_sax<nlohmann::json> {
 public:
  TreeBuilder(std::string_view text, const char* const* read_to) : s_(text), read_to_(read_to) {}

  JsonValue take() { return std::move(root_); }

  bool null() override { return literal(JsonValue::Type::null, false, 4); }
  bool boolean(bool b) override { return literal(JsonValue::Type::boolean, b, b ? 4 : 5); }
  bool number_integer(number_integer_t) override { return number(); }
  bool number_unsigned(number_unsigned_t) override { return number(); }
  bool number_float(number_float_t, const string_t&) override { return number(); }
  bool string(string_t& val) override {
    // The token ends at its closing quote; it starts at the first quote before that which is
    // not escaped (preceded by an even run of backslashes). nlohmann has validated the token.
    size_t end = read();
    size_t q = end - 1;
    while (q > 0) {
      --q;
      size_t slashes = 0;
      while (q > slashes && s_[q - 1 - slashes] == '\\') ++slashes;
      if (s_[q] == '"' && slashes % 2 == 0) break;
    }
    JsonValue v;
    v.type = JsonValue::Type::string;
    v.text = std::move(val);
    v.offset = q;
    add(std::move(v));
    return true;
  }
  bool binary(binary_t&) override { return false; }  // not produced by JSON text
  bool start_object(std::size_t) override { return open(JsonValue::Type::object); }
  bool key(string_t& val) override {
    key_ = std::move(val);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(JsonValue::Type::array); }
  bool end_array() override { return close(); }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) override {
    // what() is "[json.exception.parse_error.N] parse error at line L, column C: MESSAGE".
    std::string what = ex.what();
    auto colon = what.find(": ");
    fail(position > 0 ? position - 1 : 0, colon == std::string::npos ? what : what.substr(colon + 2));
  }

  [[noreturn]] void fail(size_t offset, const std::string& message) const {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < offset && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    throw JsonParseError(offset, line, column, message);
  }

 private:
  size_t read() const { return static_cast<size_t>(*read_to_ - s_.data()); }

  bool literal(JsonValue::Type type, bool b, size_t length) {
    JsonValue v;
    v.type = type;
    v.boolean = b;
    v.offset = read() - length;
    add(std::move(v));
    return true;
  }

  bool number() {
    // The lexer has read the number and the character that ended it (none at end of input).
    size_t end = read();
    if (end > 0 && !is_number_char(s_[end - 1])) --end;
    size_t start = end;
    while (start > 0 && is_number_char(s_[start - 1])) --start;
    JsonValue v;
    v.type = JsonValue::Type::number;
    v.text = std::string(s_.substr(start, end - start));
    v.offset = start;
    add(std::move(v));
    return true;
  }

  bool open(JsonValue::Type type) {
    size_t at = read() - 1;  // the '{' or '[' just read
    if (open_.size() >= kMaxDepth) fail(at, "nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    JsonValue v;
    v.type = type;
    v.offset = at;
    open_.push_back(add(std::move(v)));
    return true;
  }

  bool close() {
    open_.pop_back();
    return true;
  }

  // Places v in the innermost open container (or at the root) and returns where it now lives.
  // Pointers to open containers stay valid: only the innermost one's vector grows.
  JsonValue* add(JsonValue&& v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    JsonValue* parent = open_.back();
    if (parent->type == JsonValue::Type::array) {
      parent->items.push_back(std::move(v));
      return &parent->items.back();
    }
    parent->members.emplace_back(std::move(key_), std::move(v));
    return &parent->members.back().second;
  }

  std::string_view s_;
  const char* const* read_to_;
  JsonValue root_;
  std::vector<JsonValue*> open_;
  std::string key_;
};

}  // namespace

JsonValue::JsonValue() = default;
JsonValue::JsonValue(const JsonValue&) = default;
JsonValue::JsonValue(JsonValue&&) noexcept = default;
JsonValue& JsonValue::operator=(const JsonValue&) = default;
JsonValue& JsonValue::operator=(JsonValue&&) noexcept = default;
JsonValue::~JsonValue() = default;

const JsonValue* JsonValue::find(std::string_view key) const {
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

double JsonValue::number(std::string_view key, double def) const {
  auto v = find(key);
  return v && v->type == Type::number ? std::strtod(v->text.c_str(), nullptr) : def;
}

std::string JsonValue::string(std::string_view key, const std::string& def) const {
  auto v = find(key);
  return v && v->type == Type::string ? v->text : def;
}

bool JsonValue::flag(std::string_view key, bool def) const {
  auto v = find(key);
  return v && v->type == Type::boolean ? v->boolean : def;
}

const std::vector<JsonValue>& JsonValue::array(std::string_view key) const {
  static const std::vector<JsonValue> none;
  auto v = find(key);
  return v && v->type == Type::array ? v->items : none;
}

const char* JsonValue::type_name(Type t) {
  switch (t) {
    case Type::null: return "null";
    case Type::boolean: return "boolean";
    case Type::number: return "number";
    case Type::string: return "string";
    case Type::array: return "array";
    case Type::object: return "object";
  }
  return "?";
}

JsonParseError::JsonParseError(size_t offset_, size_t line_, size_t column_, const std::string& message_)
    : std::runtime_error("line " + std::to_string(line_) + ", column " + std::to_string(column_) + " (byte offset " +
                         std::to_string(offset_) + "): " + message_),
      offset(offset_),
      line(line_),
      column(column_),
      message(message_) {}

JsonValue json_parse(std::string_view text) {
  const char* read_to = text.data();
  TreeBuilder builder(text, &read_to);
  CountingIterator first{text.data(), &read_to}, last{text.data() + text.size(), &read_to};
  if (!nlohmann::json::sax_parse(first, last, &builder)) builder.fail(read_to - text.data(), "invalid JSON");
  return builder.take();
}

std::string json_quote(std::string_view s) {
  // Invalid UTF-8 becomes U+FFFD, so whatever we write is JSON that strict readers accept.
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string json_number(double x, const char* format) {
  if (!std::isfinite(x)) return "null";
  char buf[48];
  std::snprintf(buf, sizeof buf, format, x);
  return buf;
}

}  // namespace pipeline
