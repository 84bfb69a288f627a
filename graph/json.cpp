// Recursive-descent JSON parser (RFC 8259): the project's one JSON reader (see json.h).
#include "graph/json.h"

#include <cstdio>
#include <cstdlib>
#include <tuple>

namespace pipeline {
namespace {

constexpr int kMaxDepth = 256;  // deeper input is rejected instead of overflowing the stack

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  JsonValue parse_document() {
    skip_ws();
    JsonValue v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected " + describe_here() + " after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw JsonParseError(pos_, line, col, msg);
  }

  std::string describe_here() const {
    if (pos_ >= s_.size()) return "end of input";
    unsigned char c = static_cast<unsigned char>(s_[pos_]);
    char buf[32];
    if (c >= 0x20 && c < 0x7f)
      std::snprintf(buf, sizeof buf, "'%c'", c);
    else
      std::snprintf(buf, sizeof buf, "byte 0x%02x", c);
    return buf;
  }

  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }

  void expect(char c) {
    if (pos_ >= s_.size() || s_[pos_] != c) fail(std::string("expected '") + c + "' but found " + describe_here());
    ++pos_;
  }

  JsonValue parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than 256 levels");
    JsonValue v;
    v.offset = pos_;
    if (pos_ >= s_.size()) fail("expected a value but found end of input");
    char c = s_[pos_];
    if (c == '{') {
      v.type = JsonValue::Type::object;
      ++pos_;
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return v;
      }
      for (;;) {
        skip_ws();
        if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string key but found " + describe_here());
        std::string key = parse_string();
        skip_ws();
        expect(':');
        skip_ws();
        v.members.emplace_back(std::move(key), parse_value(depth + 1));
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == '}') {
          ++pos_;
          return v;
        }
        fail("expected ',' or '}' but found " + describe_here());
      }
    }
    if (c == '[') {
      v.type = JsonValue::Type::array;
      ++pos_;
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return v;
      }
      for (;;) {
        skip_ws();
        v.items.push_back(parse_value(depth + 1));
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == ']') {
          ++pos_;
          return v;
        }
        fail("expected ',' or ']' but found " + describe_here());
      }
    }
    if (c == '"') {
      v.type = JsonValue::Type::string;
      v.text = parse_string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      v.type = JsonValue::Type::number;
      v.text = parse_number();
      return v;
    }
    for (auto [word, type, b] : {std::tuple{"true", JsonValue::Type::boolean, true},
                                 std::tuple{"false", JsonValue::Type::boolean, false},
                                 std::tuple{"null", JsonValue::Type::null, false}}) {
      std::string_view w(word);
      if (s_.substr(pos_, w.size()) == w) {
        pos_ += w.size();
        v.type = type;
        v.boolean = b;
        return v;
      }
    }
    fail("expected a value but found " + describe_here());
  }

  std::string parse_number() {
    size_t start = pos_;
    auto digit = [&] { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; };
    if (s_[pos_] == '-') ++pos_;
    if (!digit()) fail("expected a digit but found " + describe_here());
    if (s_[pos_] == '0') {
      ++pos_;
    } else {
      while (digit()) ++pos_;
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!digit()) fail("expected a digit after '.' but found " + describe_here());
      while (digit()) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digit()) fail("expected a digit in the exponent but found " + describe_here());
      while (digit()) ++pos_;
    }
    return std::string(s_.substr(start, pos_ - start));
  }

  uint32_t parse_hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= uint32_t(c - 'A' + 10);
      else
        fail("expected a hex digit in \\u escape but found " + describe_here());
      ++pos_;
    }
    return v;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xc0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += char(0xe0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    } else {
      out += char(0xf0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3f));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    }
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      size_t run = pos_;
      while (run < s_.size() && s_[run] != '"' && s_[run] != '\\' && static_cast<unsigned char>(s_[run]) >= 0x20) ++run;
      out.append(s_.data() + pos_, run - pos_);
      pos_ = run;
      if (pos_ >= s_.size()) fail("unterminated string");
      char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c != '\\') fail("unescaped control character " + describe_here() + " in string");
      ++pos_;
      if (pos_ >= s_.size()) fail("unterminated escape in string");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (cp >= 0xd800 && cp < 0xdc00 && s_.substr(pos_, 2) == "\\u") {
            size_t save = pos_;
            pos_ += 2;
            uint32_t lo = parse_hex4();
            if (lo >= 0xdc00 && lo < 0xe000) {
              cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else {
              pos_ = save;  // unpaired high surrogate: encode it alone, then the next escape
            }
          }
          append_utf8(out, cp);  // lone surrogates become their 3-byte (WTF-8) form
          break;
        }
        default:
          --pos_;
          fail("invalid escape character " + describe_here() + " after '\\' in string");
      }
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

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

JsonValue json_parse(std::string_view text) { return Parser(text).parse_document(); }

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

}  // namespace pipeline
