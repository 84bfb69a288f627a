// Reading and tokenizing HellaSwag items (see hellaswag.h).
#include "datasets/eval/hellaswag.h"

#include <algorithm>
#include <fstream>
#include <stdexcept>

#include "base/json.h"
#include "datasets/tokenizer/tokenizer.h"

namespace pipeline::datasets {

namespace {

std::runtime_error line_error(const std::filesystem::path& file, int64_t line, const std::string& what) {
  return std::runtime_error(file.string() + ":" + std::to_string(line) + ": " + what);
}

std::string got(const JsonValue& v) {
  if (v.type == JsonValue::Type::string) return "the string " + json_quote(v.text.substr(0, 40));
  if (v.type == JsonValue::Type::number) return "the number " + v.text;
  if (v.type == JsonValue::Type::array) return "an array of " + std::to_string(v.items.size());
  return std::string("a ") + JsonValue::type_name(v.type);
}

int parse_label(const JsonValue& v) {
  std::string t = v.text;
  if (v.type != JsonValue::Type::number && v.type != JsonValue::Type::string) return -1;
  return t.size() == 1 && t[0] >= '0' && t[0] <= '3' ? t[0] - '0' : -1;
}

}  // namespace

HellaSwagSet load_hellaswag(const std::filesystem::path& file, int64_t max_items) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error(file.string() + ": cannot open the HellaSwag file (expected hellaswag_val.jsonl)");
  const auto& tok = Tokenizer::gpt2();
  HellaSwagSet set;
  set.file = file;
  std::string text;
  for (int64_t line = 1; (max_items <= 0 || static_cast<int64_t>(set.items.size()) < max_items) && std::getline(in, text);
       ++line) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    JsonValue v;
    try {
      v = json_parse(text);
    } catch (const JsonParseError& e) {
      throw line_error(file, line, "not JSON: column " + std::to_string(e.column) + ": " + e.message);
    }
    if (v.type != JsonValue::Type::object) throw line_error(file, line, "expected a JSON object, got " + got(v));
    HellaSwagItem item;
    item.line = line;
    const JsonValue* ctx = v.find("ctx");
    if (!ctx) throw line_error(file, line, "field 'ctx': missing");
    if (ctx->type != JsonValue::Type::string || ctx->text.empty())
      throw line_error(file, line, "field 'ctx': expected a non-empty string, got " + got(*ctx));
    const JsonValue* endings = v.find("endings");
    if (!endings) throw line_error(file, line, "field 'endings': missing");
    if (endings->type != JsonValue::Type::array || endings->items.size() != 4)
      throw line_error(file, line, "field 'endings': expected an array of 4 strings, got " + got(*endings));
    for (size_t i = 0; i < 4; ++i)
      if (endings->items[i].type != JsonValue::Type::string)
        throw line_error(file, line, "field 'endings': element " + std::to_string(i) + " is " + got(endings->items[i]) +
                                         ", expected a string");
    const JsonValue* label = v.find("label");
    if (!label) throw line_error(file, line, "field 'label': missing");
    item.label = parse_label(*label);
    if (item.label < 0) throw line_error(file, line, "field 'label': expected 0, 1, 2 or 3, got " + got(*label));
    item.context = tok.encode_ordinary(ctx->text);
    for (size_t i = 0; i < 4; ++i) item.endings[i] = tok.encode_ordinary(" " + endings->items[i].text);
    set.items.push_back(std::move(item));
  }
  if (in.bad()) throw std::runtime_error(file.string() + ": read error");
  if (set.items.empty()) throw std::runtime_error(file.string() + ": holds no HellaSwag items");
  return set;
}

HellaSwagRow hellaswag_row(const HellaSwagItem& item, int ending, int64_t block_size) {
  const auto& e = item.endings.at(static_cast<size_t>(ending));
  // block_size + 1 tokens: the model reads all but the last, which is only a target (lm-eval
  // keeps max_length + 1 the same way).
  const size_t room = static_cast<size_t>(block_size) + 1;
  if (e.size() >= room)
    throw std::invalid_argument("HellaSwag line " + std::to_string(item.line) + ": ending " + std::to_string(ending) +
                                " has " + std::to_string(e.size()) + " tokens, the model's context " +
                                std::to_string(block_size));
  const size_t keep = std::min(item.context.size(), room - e.size());  // the context's last tokens
  HellaSwagRow row;
  row.tokens.reserve(keep + e.size());
  row.tokens.assign(item.context.end() - static_cast<std::ptrdiff_t>(keep), item.context.end());
  row.tokens.insert(row.tokens.end(), e.begin(), e.end());
  row.ending_begin = keep;
  return row;
}

void check_hellaswag_fits(const HellaSwagSet& set, int64_t block_size) {
  for (const auto& item : set.items)
    for (size_t i = 0; i < 4; ++i)
      if (static_cast<int64_t>(item.endings[i].size()) > block_size)
        throw line_error(set.file, item.line,
                         "ending " + std::to_string(i) + " has " + std::to_string(item.endings[i].size()) +
                             " tokens; a model with a context of " + std::to_string(block_size) +
                             " tokens scores endings of up to " + std::to_string(block_size));
}

}  // namespace pipeline::datasets
