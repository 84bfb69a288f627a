// Reading GPT-2's encoder.json and vocab.bpe (see tokenizer_files.h).
#include "datasets/tokenizer/tokenizer_files.h"

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "base/json.h"
#include "datasets/tokenizer/tokenizer.h"

namespace pipeline::datasets {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error(msg); }

std::string hex_byte(unsigned c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", c & 0xFF);
  return buf;
}

// GPT-2 stores token bytes as printable code points: printable Latin-1 bytes stand for
// themselves, the other 68 bytes are moved to U+0100.. in byte order. This is the inverse.
const std::array<int, 512>& unicode_to_byte() {
  static const auto table = [] {
    std::array<int, 512> t;
    t.fill(-1);
    int shifted = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[printable ? b : 256 + shifted++] = b;
    }
    return t;
  }();
  return table;
}

// Maps a token written in GPT-2's byte alphabet (UTF-8 text) to its bytes. Returns false and
// sets bad_cp if a code point is outside the alphabet.
bool alphabet_to_bytes(std::string_view text, std::string& out, uint32_t& bad_cp) {
  const auto& inv = unicode_to_byte();
  out.clear();
  size_t i = 0;
  while (i < text.size()) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    uint32_t cp;
    size_t len;
    if (b0 < 0x80) {
      cp = b0;
      len = 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < text.size()) {
      cp = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu);
      len = 2;
    } else {
      cp = b0 >= 0xE0 ? 0xFFFD : b0;  // anything wider is outside the alphabet
      len = 1;
      bad_cp = cp;
      return false;
    }
    if (cp >= inv.size() || inv[cp] < 0) {
      bad_cp = cp;
      return false;
    }
    out += static_cast<char>(inv[cp]);
    i += len;
  }
  return true;
}

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F && u != '\\' && u != '\'') {
      out += c;
    } else {
      out += "\\x" + hex_byte(u).substr(2);
    }
  }
  return "'" + out + "'";
}

// encoder.json is a flat JSON object of token -> id. It is read with the project's one JSON
// parser; here only the shape is checked and each key is mapped back from GPT-2's printable
// byte alphabet to raw bytes.
struct EncoderEntry {
  std::string bytes;
  uint64_t id;
  size_t offset;  // byte offset of the value, for messages
};

std::vector<EncoderEntry> parse_encoder_json(std::string_view text, std::string_view name) {
  JsonValue root;
  try {
    root = json_parse(text);
  } catch (const JsonParseError& e) {
    fail(std::string(name) + ": malformed JSON at " + e.what());
  }
  if (root.type != JsonValue::Type::object)
    fail(std::string(name) + ": expected a JSON object of token -> id at byte offset " + std::to_string(root.offset) +
         ", got " + JsonValue::type_name(root.type));
  std::vector<EncoderEntry> out;
  out.reserve(root.members.size());
  for (const auto& [key, val] : root.members) {
    EncoderEntry e;
    e.offset = val.offset;
    uint32_t bad_cp = 0;
    if (!alphabet_to_bytes(key, e.bytes, bad_cp)) {
      char cp[16];
      std::snprintf(cp, sizeof cp, "U+%04X", bad_cp);
      fail(std::string(name) + ": token before byte offset " + std::to_string(val.offset) + " contains " + cp +
           ", which is not in GPT-2's byte-to-unicode alphabet");
    }
    const bool digits = val.type == JsonValue::Type::number && !val.text.empty() && val.text.size() <= 10 &&
                        val.text.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoull(val.text) > 0xFFFFFFFFull)
      fail(std::string(name) + ": malformed vocabulary at byte offset " + std::to_string(val.offset) +
           ": expected a non-negative integer token id below 2^32, got " +
           (val.type == JsonValue::Type::number ? val.text : std::string(JsonValue::type_name(val.type))));
    e.id = std::stoull(val.text);
    out.push_back(std::move(e));
  }
  return out;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open " + path.string() + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("error reading " + path.string());
  return std::move(ss).str();
}

}  // namespace

VocabTokens vocab_tokens_parse(std::string_view encoder_json, std::string_view vocab_bpe,
                               std::string_view encoder_name, std::string_view bpe_name) {
  const std::string enc_name(encoder_name);
  const std::string merges_name(bpe_name);

  // encoder.json: ids must be exactly 0..n-1, each token once.
  const auto entries = parse_encoder_json(encoder_json, encoder_name);
  const size_t n = entries.size();
  if (n < 256) fail(enc_name + ": " + std::to_string(n) + " tokens; a byte-level vocabulary needs at least 256");
  std::vector<const EncoderEntry*> by_id(n, nullptr);
  std::unordered_map<std::string, uint32_t> id_of;
  id_of.reserve(n * 2);
  for (const auto& e : entries) {
    if (e.id >= n)
      fail(enc_name + ": token " + printable(e.bytes) + " at byte offset " + std::to_string(e.offset) + " has id " +
           std::to_string(e.id) + "; ids must be 0.." + std::to_string(n - 1));
    if (by_id[e.id] != nullptr)
      fail(enc_name + ": id " + std::to_string(e.id) + " at byte offset " + std::to_string(e.offset) +
           " was already given to token " + printable(by_id[e.id]->bytes));
    if (!id_of.emplace(e.bytes, static_cast<uint32_t>(e.id)).second)
      fail(enc_name + ": token " + printable(e.bytes) + " at byte offset " + std::to_string(e.offset) +
           " appears twice");
    by_id[e.id] = &e;
  }
  VocabTokens out;
  out.offsets.reserve(n + 1);
  for (size_t id = 0; id < n; ++id) {
    out.offsets.push_back(static_cast<uint32_t>(out.pool.size()));
    out.pool += by_id[id]->bytes;
    if (by_id[id]->bytes == Tokenizer::eot_text) out.special_ids.push_back(static_cast<uint32_t>(id));
  }
  out.offsets.push_back(static_cast<uint32_t>(out.pool.size()));
  for (int b = 0; b < 256; ++b)
    if (!id_of.contains(std::string(1, static_cast<char>(b))))
      fail(enc_name + ": no token for byte " + hex_byte(static_cast<unsigned>(b)));

  // vocab.bpe: merge i must produce token 256 + i, i.e. ids are merge ranks (tiktoken checks
  // the same); the table actually used is built from the tokens (tokenizer_table.cpp).
  size_t line_no = 0;
  size_t merges = 0;
  size_t pos = 0;
  std::string a, b;
  uint32_t bad_cp = 0;
  while (pos < vocab_bpe.size()) {
    size_t eol = vocab_bpe.find('\n', pos);
    if (eol == std::string_view::npos) eol = vocab_bpe.size();
    std::string_view line = vocab_bpe.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const std::string where = merges_name + ": line " + std::to_string(line_no) + ": ";
    const size_t sp = line.find(' ');
    if (sp == 0 || sp == std::string_view::npos || sp + 1 == line.size() || line.find(' ', sp + 1) != std::string_view::npos)
      fail(where + "expected two tokens separated by one space, got " + printable(line));
    if (!alphabet_to_bytes(line.substr(0, sp), a, bad_cp) || !alphabet_to_bytes(line.substr(sp + 1), b, bad_cp)) {
      char cp[16];
      std::snprintf(cp, sizeof cp, "U+%04X", bad_cp);
      fail(where + "contains " + cp + ", which is not in GPT-2's byte-to-unicode alphabet");
    }
    for (const std::string* part : {&a, &b})
      if (!id_of.contains(*part)) fail(where + "token " + printable(*part) + " is not in " + enc_name);
    const auto merged = id_of.find(a + b);
    if (merged == id_of.end()) fail(where + "merged token " + printable(a + b) + " is not in " + enc_name);
    const size_t want = 256 + merges;
    if (merged->second != want)
      fail(where + "merge makes " + printable(a + b) + " with id " + std::to_string(merged->second) + ", expected id " +
           std::to_string(want) + " (merges must be listed in id order)");
    ++merges;
  }
  if (256 + merges + out.special_ids.size() != n)
    fail(merges_name + ": " + std::to_string(merges) + " merges, but " + enc_name + " has " + std::to_string(n) +
         " tokens (expected 256 bytes + merges + " + std::to_string(out.special_ids.size()) + " special)");
  return out;
}

VocabTokens vocab_tokens_load(const std::filesystem::path& encoder_json, const std::filesystem::path& vocab_bpe) {
  const std::string enc = read_file(encoder_json);
  const std::string merges = read_file(vocab_bpe);
  return vocab_tokens_parse(enc, merges, encoder_json.string(), vocab_bpe.string());
}

}  // namespace pipeline::datasets
