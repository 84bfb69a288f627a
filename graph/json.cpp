// A small recursive-descent JSON parser (see json.h): enough for the files the engine writes.
#include "graph/json.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace pipeline::graph::json {

namespace {

const Value& null_value() {
  static const Value v;
  return v;
}

struct Parser {
  const std::string& s;
  size_t i = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("JSON: " + what + " at byte " + std::to_string(i));
  }
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
  }
  bool eat(char c) {
    ws();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  std::string parse_string() {
    expect('"');
    std::string out;
    while (i < s.size() && s[i] != '"') {
      char c = s[i++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size()) fail("unterminated escape");
      char e = s[i++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i + 4 > s.size()) fail("short \\u escape");
          unsigned cp = static_cast<unsigned>(std::strtoul(s.substr(i, 4).c_str(), nullptr, 16));
          i += 4;
          if (cp < 0x80) {
            out += static_cast<char>(cp);
          } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          } else {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          }
          break;
        }
        default: out += e;
      }
    }
    if (i >= s.size()) fail("unterminated string");
    ++i;
    return out;
  }
  Value parse_value(int depth) {
    if (depth > 64) fail("nested too deeply");
    ws();
    if (i >= s.size()) fail("unexpected end");
    Value v;
    char c = s[i];
    if (c == '{') {
      ++i;
      v.kind = Value::Kind::object;
      if (eat('}')) return v;
      do {
        ws();
        std::string k = parse_string();
        expect(':');
        v.obj[k] = parse_value(depth + 1);
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++i;
      v.kind = Value::Kind::array;
      if (eat(']')) return v;
      do v.arr.push_back(parse_value(depth + 1));
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Value::Kind::string;
      v.str = parse_string();
    } else if (s.compare(i, 4, "true") == 0) {
      i += 4;
      v.kind = Value::Kind::boolean;
      v.b = true;
    } else if (s.compare(i, 5, "false") == 0) {
      i += 5;
      v.kind = Value::Kind::boolean;
    } else if (s.compare(i, 4, "null") == 0) {
      i += 4;
    } else {
      char* end = nullptr;
      v.num = std::strtod(s.c_str() + i, &end);
      if (end == s.c_str() + i) fail("unexpected character");
      i = static_cast<size_t>(end - s.c_str());
      v.kind = Value::Kind::number;
    }
    return v;
  }
};

}  // namespace

const Value& Value::operator[](const std::string& key) const {
  auto it = obj.find(key);
  return it == obj.end() ? null_value() : it->second;
}
double Value::number(const std::string& key, double def) const {
  const Value& v = (*this)[key];
  return v.kind == Kind::number ? v.num : def;
}
std::string Value::string(const std::string& key, const std::string& def) const {
  const Value& v = (*this)[key];
  return v.kind == Kind::string ? v.str : def;
}
bool Value::boolean(const std::string& key, bool def) const {
  const Value& v = (*this)[key];
  return v.kind == Kind::boolean ? v.b : def;
}

Value parse(const std::string& text) {
  Parser p{text};
  Value v = p.parse_value(0);
  p.ws();
  if (p.i != text.size()) p.fail("trailing characters");
  return v;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace pipeline::graph::json
