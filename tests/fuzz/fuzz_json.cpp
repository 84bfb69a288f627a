// Fuzzes graph/json: any bytes either parse or raise JsonParseError with an offset inside the
// input; every parsed value's offset points at the character that starts it, and a number's
// text is its literal. json_quote of any bytes is JSON that parses back to a string, and
// quoting that string again gives the same text.
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "base/json.h"

using pipeline::JsonValue;
using fuzz_util::broken;

namespace {

void check_value(const JsonValue& v, std::string_view text, int depth) {
  if (v.offset >= text.size()) broken("offset past the end of the input");
  const char c = text[v.offset];
  switch (v.type) {
    case JsonValue::Type::object:
      if (c != '{') broken("object offset does not point at '{'");
      break;
    case JsonValue::Type::array:
      if (c != '[') broken("array offset does not point at '['");
      break;
    case JsonValue::Type::string:
      if (c != '"') broken("string offset does not point at '\"'");
      break;
    case JsonValue::Type::number:
      if (text.substr(v.offset, v.text.size()) != v.text) broken("number text is not the literal at its offset");
      break;
    case JsonValue::Type::boolean:
      if (c != (v.boolean ? 't' : 'f')) broken("boolean offset");
      break;
    case JsonValue::Type::null:
      if (c != 'n') broken("null offset");
      break;
  }
  for (const auto& item : v.items) check_value(item, text, depth + 1);
  for (const auto& [key, member] : v.members) check_value(member, text, depth + 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto text = fuzz_util::as_text(data, size);
  try {
    check_value(pipeline::json_parse(text), text, 0);
  } catch (const pipeline::JsonParseError& e) {
    if (e.offset > size) broken("error offset past the end of the input");
    if (e.message.empty()) broken("error without a message");
  }
  const std::string quoted = pipeline::json_quote(text);
  JsonValue back;
  try {
    back = pipeline::json_parse(quoted);
  } catch (const pipeline::JsonParseError& e) {
    broken(std::string("json_quote produced invalid JSON: ") + e.what());
  }
  if (back.type != JsonValue::Type::string) broken("json_quote did not produce a string");
  if (pipeline::json_quote(back.text) != quoted) broken("quoting is not stable");
  return 0;
}
