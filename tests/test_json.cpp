// Tests for graph/json (nlohmann/json underneath): values and their byte offsets, number
// literals kept as written, errors with line, column and offset, the nesting limit, strict
// UTF-8, and json_quote producing JSON that any strict reader accepts.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "base/json.h"
#include "test_util.h"

using namespace pipeline;
using test_util::contains;

namespace {

JsonParseError parse_error(std::string_view text) {
  try {
    json_parse(text);
  } catch (const JsonParseError& e) {
    return e;
  }
  FAIL("no error for: " << std::string(text));
  return JsonParseError(0, 0, 0, "");
}

}  // namespace

TEST_CASE("json: every value carries the byte offset where it starts") {
  const std::string text = R"( {"a": [1, "x\"y", true, null, {"b": -2.5e3}], "s": "\u00e9", "f": false} )";
  auto v = json_parse(text);
  REQUIRE(v.type == JsonValue::Type::object);
  CHECK(v.offset == 1);
  const auto& a = *v.find("a");
  CHECK(text[a.offset] == '[');
  REQUIRE(a.items.size() == 5);
  CHECK(text.substr(a.items[0].offset, 1) == "1");
  CHECK(text.substr(a.items[1].offset, 6) == R"("x\"y")");
  CHECK(a.items[1].text == "x\"y");
  CHECK(text.substr(a.items[2].offset, 4) == "true");
  CHECK(text.substr(a.items[3].offset, 4) == "null");
  CHECK(text[a.items[4].offset] == '{');
  CHECK(text.substr(a.items[4].find("b")->offset, 6) == "-2.5e3");
  CHECK(text.substr(v.find("s")->offset, 8) == R"("\u00e9")");
  CHECK(text.substr(v.find("f")->offset, 5) == "false");
  // A string ending in an escaped backslash: the opening quote is still found.
  auto w = json_parse(R"(["a\\", "\\\"\\"])");
  CHECK(w.items[0].offset == 1);
  CHECK(w.items[0].text == "a\\");
  CHECK(w.items[1].offset == 8);
  CHECK(w.items[1].text == "\\\"\\");
}

TEST_CASE("json: numbers keep their literal text, whatever their size") {
  auto v = json_parse("[0, -0, 18446744073709551615, 18446744073709551616, -9223372036854775809, 1.50, 1E+2]");
  REQUIRE(v.items.size() == 7);
  CHECK(v.items[0].text == "0");
  CHECK(v.items[1].text == "-0");
  CHECK(v.items[2].text == "18446744073709551615");
  CHECK(v.items[3].text == "18446744073709551616");  // past uint64: still exact text
  CHECK(v.items[4].text == "-9223372036854775809");
  CHECK(v.items[5].text == "1.50");
  CHECK(v.items[6].text == "1E+2");
  CHECK(json_parse("7").text == "7");  // at the very end of the input
  CHECK(json_parse("7 \n").text == "7");
}

TEST_CASE("json: syntax errors name line, column and byte offset") {
  auto e = parse_error("{\n  \"a\": 1,\n  \"b\" 2\n}");
  CHECK(e.line == 3);
  CHECK(e.column == 7);
  CHECK(e.offset == 18);
  CHECK(contains(e.what(), "line 3, column 7 (byte offset 18)"));
  CHECK(contains(e.message, "expected ':'"));
  CHECK(contains(parse_error("[1, 2] 3").message, "end of input"));
  CHECK(contains(parse_error("").message, "unexpected end of input"));
  CHECK(!parse_error("01").message.empty());
  CHECK(!parse_error("[1,]").message.empty());
  CHECK(!parse_error("{\"a\":1,}").message.empty());
  CHECK(!parse_error("'a'").message.empty());
  CHECK(!parse_error(std::string("[\"a\0b\"]", 7)).message.empty());
  CHECK(!parse_error("[\"tab\there\"]").message.empty());  // raw control character in a string
}

TEST_CASE("json: strings must be UTF-8; surrogate escapes must pair") {
  CHECK(json_parse(R"("\ud83d\ude00")").text == "\xf0\x9f\x98\x80");
  auto bad = parse_error("[\"ok\", \"caf\xe9\"]");
  CHECK(contains(bad.message, "UTF-8"));
  CHECK(bad.offset >= 7);
  CHECK(contains(parse_error(R"("\ud800")").message, "surrogate"));
  CHECK(contains(parse_error(R"("\ude00")").message, "surrogate"));
}

TEST_CASE("json: nesting deeper than 256 levels is an error, not a stack overflow") {
  CHECK_NOTHROW(json_parse(std::string(256, '[') + std::string(256, ']')));
  auto e = parse_error(std::string(257, '[') + std::string(257, ']'));
  CHECK(contains(e.message, "nesting deeper than 256"));
  CHECK(e.offset == 256);
  auto huge = parse_error(std::string(1'000'000, '['));  // no recursion anywhere
  CHECK(contains(huge.message, "nesting"));
}

TEST_CASE("json: accessors return the default for absent members or other types") {
  auto o = json_parse(R"({"n": 3.5, "b": true, "l": [1], "s": "t"})");
  CHECK(o.number("n") == 3.5);
  CHECK(o.number("missing", 7) == 7);
  CHECK(o.flag("b"));
  CHECK(o.string("s") == "t");
  CHECK(o.string("n", "d") == "d");
  CHECK(o.array("l").size() == 1);
  CHECK(o.array("s").empty());
  CHECK(json_parse("[1]").find("x") == nullptr);
}

TEST_CASE("json_quote: escapes, and invalid UTF-8 replaced so the output is always valid JSON") {
  CHECK(json_quote("a\"b\\c\n\t\r\x01") == "\"a\\\"b\\\\c\\n\\t\\r\\u0001\"");
  CHECK(json_quote("caf\xc3\xa9") == "\"caf\xc3\xa9\"");  // valid UTF-8 passes through
  const std::string bad = "x\xff y\xc3";                  // a stray byte and a cut sequence
  const std::string q = json_quote(bad);
  CHECK(q == "\"x\xef\xbf\xbd y\xef\xbf\xbd\"");
  CHECK(json_parse(q).text == "x\xef\xbf\xbd y\xef\xbf\xbd");
  for (int c = 0; c < 256; ++c) {
    const std::string one(1, static_cast<char>(c));
    CHECK_NOTHROW(json_parse(json_quote(one)));
  }
}

TEST_CASE("json_number: a float32 exactly, the format asked for, and null where JSON has no number") {
  CHECK(json_number(static_cast<double>(0.1f)) == "0.100000001");
  CHECK(json_parse(json_number(static_cast<double>(0.1f))).text == "0.100000001");
  CHECK(json_number(2.0) == "2");
  CHECK(json_number(0.5, "%.5f") == "0.50000");
  CHECK(json_number(std::nan("")) == "null");
  CHECK(json_number(std::numeric_limits<double>::infinity()) == "null");
  CHECK(json_number(-std::numeric_limits<double>::infinity(), "%.5f") == "null");
  CHECK(json_parse("[" + json_number(std::nan("")) + "]").items.at(0).type == JsonValue::Type::null);
}
