// Tokenizer tests: tiktoken parity on the reference files, byte-exact round trips (valid and
// invalid UTF-8), special tokens, errors, the embedded vocabulary and its table, and concurrent use.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "datasets/shards/sha256.h"
#include "datasets/tokenizer/tokenizer.h"
#include "datasets/tokenizer/tokenizer_bpe.h"
#include "datasets/tokenizer/tokenizer_files.h"
#include "datasets/tokenizer/tokenizer_pretokenize.h"
#include "datasets/tokenizer/tokenizer_table.h"
#include "datasets/tokenizer/unicode_class.h"

namespace fs = std::filesystem;
using pipeline::datasets::Tokenizer;

namespace {

const fs::path data_dir = PIPELINE_REFERENCE_DATA_DIR;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open " << p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

std::vector<uint32_t> read_u16(const fs::path& p) {
  const std::string b = read_bytes(p);
  REQUIRE(b.size() % 2 == 0);
  std::vector<uint32_t> ids(b.size() / 2);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<uint8_t>(b[2 * i]) | (static_cast<uint32_t>(static_cast<uint8_t>(b[2 * i + 1])) << 8);
  return ids;
}

std::string show_ids(const std::vector<uint32_t>& ids, size_t from, size_t to) {
  std::string s;
  for (size_t i = from; i < std::min(to, ids.size()); ++i) s += std::to_string(ids[i]) + " ";
  return s;
}

// Fails with the first differing index, the ids around it on both sides and the text they decode to.
void check_same_ids(const std::vector<uint32_t>& got, const std::vector<uint32_t>& want) {
  const auto mm = std::mismatch(got.begin(), got.end(), want.begin(), want.end());
  if (mm.first == got.end() && mm.second == want.end()) return;
  const size_t i = static_cast<size_t>(mm.first - got.begin());
  const size_t from = i >= 5 ? i - 5 : 0;
  const auto& tok = Tokenizer::gpt2();
  std::vector<uint32_t> ctx(want.begin() + static_cast<ptrdiff_t>(from),
                            want.begin() + static_cast<ptrdiff_t>(std::min(want.size(), i + 5)));
  FAIL("first mismatch at index " << i << " (got " << got.size() << " ids, want " << want.size() << ")\n  got:  "
                                  << show_ids(got, from, i + 5) << "\n  want: " << show_ids(want, from, i + 5)
                                  << "\n  text: \"" << tok.decode(ctx) << "\"");
}

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> out;
  pipeline::datasets::Pretokenizer pre(text);
  for (auto p = pre.next(); !p.empty(); p = pre.next()) out.emplace_back(p);
  return out;
}

}  // namespace

TEST_CASE("embedded vocabulary is byte-identical to the GPT-2 release files") {
  const auto files = pipeline::datasets::gpt2_vocab_files();
  const std::string enc = read_bytes(data_dir / "gpt2_encoder.json");
  const std::string bpe = read_bytes(data_dir / "gpt2_vocab.bpe");
  CHECK(files.encoder_json.size() == enc.size());
  CHECK(files.encoder_json == enc);
  CHECK(files.vocab_bpe == bpe);
  CHECK(pipeline::datasets::sha256_hex(files.encoder_json) ==
        "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783");
  CHECK(pipeline::datasets::sha256_hex(files.vocab_bpe) ==
        "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5");
}

TEST_CASE("the embedded table is the one laid out from the release files") {
  namespace ds = pipeline::datasets;
  const auto tokens = ds::vocab_tokens_load(data_dir / "gpt2_encoder.json", data_dir / "gpt2_vocab.bpe");
  CHECK(tokens.size() == 50257);
  REQUIRE(tokens.special_ids == std::vector<uint32_t>{Tokenizer::eot_id});
  const std::vector<unsigned char> built = ds::vocab_table_build(tokens);
  REQUIRE(built.size() == ds::embedded::gpt2_vocab_table_size);
  CHECK(std::equal(built.begin(), built.end(), ds::embedded::gpt2_vocab_table));
}

TEST_CASE("the embedded table and the files give the same ids on varied text") {
  const auto& embedded = Tokenizer::gpt2();
  const Tokenizer from_files = Tokenizer::load(data_dir / "gpt2_encoder.json", data_dir / "gpt2_vocab.bpe");
  REQUIRE(&from_files.internal_vocab() != &embedded.internal_vocab());
  std::string text =
      "Hello world, it's 2024! They're here; we'll see, I'd say you've won. DON'T SHOUT, Y'ALL'M.\n"
      "Numbers: 3.14159 1,234,567 0x1F 12345678901234567890 -42 1e-9 \u00bd \u2163\n"
      "Whitespace:   three\t\ttabs \r\n\r\n\n\n    indented\u00a0\u00a0nbsp \u3000ideographic      \n"
      "Unicode: caf\u00e9 na\u00efve \u00c5ngstr\u00f6m \u4f60\u597d\u4e16\u754c \u3053\u3093\u306b\u3061\u306f "
      "\u0645\u0631\u062d\u0628\u0627 \u041f\u0440\u0438\u0432\u0435\u0442 e\u0301 \U0001F600\U0001F680 "
      "\U00013495'm \u05e9\u05dc\u05d5\u05dd\n"
      "Code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; } // <|endoftext|> inside\n"
      "<|endoftext|>after a special<|endoftext|><|endoftext|>";
  text += std::string(200, 'a') + " " + std::string(150, ' ') + "x " + std::string(100, '7');  // the heap merge
  text += "\xFF\xFE\xC3 \xE2\x82 \xED\xA0\x80 trailing   ";  // invalid UTF-8
  text += read_bytes(data_dir / "edge_cases.txt");
  size_t n_specials = 0;
  for (size_t at = text.find(Tokenizer::eot_text); at != std::string::npos; at = text.find(Tokenizer::eot_text, at + 1))
    ++n_specials;
  REQUIRE(n_specials >= 4);
  for (bool allow_special : {false, true}) {
    CAPTURE(allow_special);
    const auto want = from_files.encode(text, allow_special);
    const auto got = embedded.encode(text, allow_special);
    check_same_ids(got, want);
    CHECK(embedded.decode(got) == text);
    CHECK(static_cast<size_t>(std::count(got.begin(), got.end(), Tokenizer::eot_id)) == (allow_special ? n_specials : 0));
  }
  // Both also agree with tiktoken on the reference text.
  check_same_ids(from_files.encode_ordinary(read_bytes(data_dir / "edge_cases.txt")),
                 read_u16(data_dir / "edge_cases.gpt2.u16"));
  for (uint32_t id = 0; id < embedded.vocab_size(); ++id)
    REQUIRE_MESSAGE(embedded.token_bytes(id) == from_files.token_bytes(id), "token " << id);
}

TEST_CASE("a damaged vocabulary table is refused with what is wrong") {
  namespace ds = pipeline::datasets;
  const std::vector<unsigned char> good(ds::embedded::gpt2_vocab_table,
                                        ds::embedded::gpt2_vocab_table + ds::embedded::gpt2_vocab_table_size);
  const ds::bpe::Vocab v = ds::vocab_table_open(good, "good");
  CHECK(v.size() == 50257);
  CHECK(v.pieces.find(reinterpret_cast<const unsigned char*>("Hello"), 5) == 15496);
  CHECK(v.bytes_of(Tokenizer::eot_id) == Tokenizer::eot_text);

  auto message_of = [](std::vector<unsigned char> table) -> std::string {
    try {
      (void)ds::vocab_table_open(table, "t.bin");
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "no exception";
  };
  auto with_word = [&](size_t word, uint32_t value) {
    std::vector<unsigned char> t = good;
    for (int i = 0; i < 4; ++i) t[4 * word + i] = static_cast<unsigned char>(value >> (8 * i));
    return t;
  };
  auto contains = [](const std::string& msg, const std::string& part) {
    INFO(msg);
    CHECK(msg.rfind("t.bin: ", 0) == 0);
    CHECK(msg.find(part) != std::string::npos);
  };
  contains(message_of({good.begin(), good.begin() + 10}), "10 bytes, shorter than the 64-byte header");
  std::vector<unsigned char> not_a_table = good;
  not_a_table[0] = 'X';
  contains(message_of(not_a_table), "magic \"BPEVOCAB\"");
  contains(message_of(with_word(2, 7)), "format version 7, this build reads version 1");
  contains(message_of({good.begin(), good.end() - 1000}), "truncated or damaged");
  std::vector<unsigned char> longer = good;
  longer.push_back(0);
  contains(message_of(longer), "truncated or damaged");
  contains(message_of(with_word(6, 1000)), "inconsistent header");          // piece slots: not a power of two
  contains(message_of(with_word(7, 1u << 16)), "inconsistent header");     // pair slots: too few for the pairs
  contains(message_of(with_word(4, 12345)), "truncated or damaged");       // token bytes: size disagrees
  // The first word after the header is token 0's offset.
  contains(message_of(with_word(16, 3)), "token offsets do not span the token bytes");
}

TEST_CASE("gpt2() basics") {
  const auto& tok = Tokenizer::gpt2();
  CHECK(&tok == &Tokenizer::gpt2());
  CHECK(tok.vocab_size() == 50257);
  CHECK(tok.token_bytes(Tokenizer::eot_id) == "<|endoftext|>");
  CHECK(tok.encode_ordinary("Hello world") == std::vector<uint32_t>{15496, 995});
  CHECK(tok.encode_ordinary("").empty());
  CHECK(tok.decode(std::vector<uint32_t>{}).empty());
  // Loading from files gives the same tokenizer as the embedded copy.
  const Tokenizer from_files = Tokenizer::load(data_dir / "gpt2_encoder.json", data_dir / "gpt2_vocab.bpe");
  CHECK(from_files.vocab_size() == 50257);
  CHECK(from_files.encode_ordinary("Hello world, it's 2024!") == tok.encode_ordinary("Hello world, it's 2024!"));
}

TEST_CASE("pre-tokenizer follows GPT-2's pattern") {
  using V = std::vector<std::string>;
  CHECK(pieces("Hello world") == V{"Hello", " world"});
  CHECK(pieces("it's I'M we'll") == V{"it", "'s", " I", "'", "M", " we", "'ll"});  // contractions are case-sensitive
  CHECK(pieces("a  b") == V{"a", " ", " b"});              // \s+(?!\S) leaves the last space for " b"
  CHECK(pieces("a\n\nb") == V{"a", "\n", "\n", "b"});     // then \s+ takes the lone newline
  CHECK(pieces("a   ") == V{"a", "   "});                  // trailing run stays whole
  CHECK(pieces("x123 456!?") == V{"x", "123", " 456", "!?"});
  CHECK(pieces("''s") == V{"''", "s"});                    // symbol run, then letters
  CHECK(pieces("caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD") == V{"caf\xC3\xA9", " \xE4\xBD\xA0\xE5\xA5\xBD"});
  CHECK(pieces("e\xCC\x81") == V{"e", "\xCC\x81"});        // combining marks are not \p{L}
  CHECK(pieces("a\xC2\xA0\xC2\xA0" "b") == V{"a", "\xC2\xA0", "\xC2\xA0", "b"});  // NBSP is \s, not the ' ?' prefix
  CHECK(pieces(" \xFF\xFE!") == V{" \xFF\xFE!"});          // invalid bytes are "other"
  CHECK(pieces("\x1C") == V{"\x1C"});                      // U+001C is not White_Space
  // Characters newer than ICU 72's Unicode 15.0 that tiktoken's regex (Unicode 16) knows:
  // U+13495 (Egyptian hieroglyph, Lo), U+2EBF0 (CJK extension I, Lo), U+1E5F1 (Ol Onal digit, Nd).
  CHECK(pieces("\xF0\x93\x92\x95'm") == V{"\xF0\x93\x92\x95", "'m"});
  CHECK(pieces("+\xF0\xAE\xAF\xB0'm") == V{"+", "\xF0\xAE\xAF\xB0", "'m"});
  CHECK(pieces("a\xF0\x9E\x97\xB1") == V{"a", "\xF0\x9E\x97\xB1"});
  CHECK(pieces("\xF0\x9E\x97\xB1" "1") == V{"\xF0\x9E\x97\xB1" "1"});
  // Still-unassigned code points are "other".
  CHECK(pieces("\xF3\xA0\x80\x80" "!") == V{"\xF3\xA0\x80\x80" "!"});
}

TEST_CASE("the build-time BMP class table is what ICU answers now") {
  namespace uc = pipeline::datasets::unicode;
  const uc::CharClass* table = uc::bmp_table();
  size_t mismatches = 0, letters = 0;
  for (uint32_t cp = 0; cp < 0x10000; ++cp) {
    if (table[cp] != uc::classify_slow(cp) && ++mismatches <= 5) FAIL_CHECK("U+" << std::hex << cp);
    letters += table[cp] == uc::CharClass::letter;
  }
  CHECK(mismatches == 0);
  CHECK(letters > 40000);  // most of the BMP is CJK and Hangul
  CHECK(table[' '] == uc::CharClass::space);
  CHECK(table['7'] == uc::CharClass::number);
  CHECK(table[0x4F60] == uc::CharClass::letter);  // 你
  CHECK(table[0xA7CB] == uc::CharClass::letter);  // Unicode 16, from the top-up list
}

TEST_CASE("short hard strings match tiktoken") {
  // Expected ids from tiktoken 0.14's gpt2 encoding (encode_ordinary).
  const auto& tok = Tokenizer::gpt2();
  using V = std::vector<uint32_t>;
  CHECK(tok.encode_ordinary("Hello\n\nworld  foo   bar\t\tbaz \r\n") ==
        V{15496, 198, 198, 6894, 220, 22944, 220, 220, 2318, 197, 197, 65, 1031, 220, 201, 198});
  CHECK(tok.encode_ordinary("I'M don't WE'LL they're") == V{40, 6, 44, 836, 470, 12887, 6, 3069, 484, 821});
  // Unicode 16 letters and digits (see unicode_class.cpp).
  CHECK(tok.encode_ordinary("\xF0\x93\x92\x95'm \xF0\xAE\xAF\xB0'm \xF0\x9E\x97\xB1\xF0\x9E\x97\xB2") ==
        V{172, 241, 240, 243, 1101, 220, 172, 106, 107, 108, 1101, 220, 172, 252, 245, 109, 172, 252, 245, 110});
  CHECK(tok.encode_ordinary("x = 12345678901234567890; // \xC3\xBCn\xC3\xAF" "c\xC3\xB6" "d\xC3\xA9") ==
        V{87, 796, 17031, 2231, 3134, 4531, 486, 1954, 2231, 30924, 3829, 26, 3373, 6184, 120, 77, 26884, 66, 9101, 67, 2634});
  // Pieces longer than small_piece_max take the heap merge.
  CHECK(tok.encode_ordinary(std::string(100, 'a')) == V(25, 24794));
  V spaces(99, 220);
  spaces.push_back(2124);
  CHECK(tok.encode_ordinary(std::string(100, ' ') + "x") == spaces);
  std::string digits;
  V digit_ids{10163};
  for (int i = 0; i < 10; ++i) digits += "1234567890";
  for (int i = 0; i < 9; ++i) digit_ids.insert(digit_ids.end(), {2231, 3134, 4531, 486, 1954});
  digit_ids.insert(digit_ids.end(), {2231, 30924, 3829});
  CHECK(tok.encode_ordinary(digits) == digit_ids);
  const V super{12442, 9948, 361, 22562, 346, 396, 501, 42372, 498, 312, 32346};
  V super3;
  for (int i = 0; i < 3; ++i) super3.insert(super3.end(), super.begin(), super.end());
  CHECK(tok.encode_ordinary("SupercalifragilisticexpialidociousSupercalifragilisticexpialidocious"
                            "Supercalifragilisticexpialidocious") == super3);
}

TEST_CASE("edge_cases.txt matches tiktoken exactly") {
  const auto& tok = Tokenizer::gpt2();
  const std::string text = read_bytes(data_dir / "edge_cases.txt");
  const std::vector<uint32_t> want = read_u16(data_dir / "edge_cases.gpt2.u16");
  REQUIRE(want.size() == 48830);
  const auto got = tok.encode_ordinary(text);
  check_same_ids(got, want);
  CHECK(tok.decode(got) == text);
}

TEST_CASE("tinyshakespeare.txt: count, first ids, round trip") {
  const auto& tok = Tokenizer::gpt2();
  const std::string text = read_bytes(data_dir / "tinyshakespeare.txt");
  REQUIRE(text.size() == 1115394);
  const auto ids = tok.encode_ordinary(text);
  CHECK(ids.size() == 338025);
  const std::vector<uint32_t> first{5962, 22307, 25, 198, 8421, 356, 5120, 597, 2252, 11};
  REQUIRE(ids.size() >= first.size());
  CHECK(std::vector<uint32_t>(ids.begin(), ids.begin() + 10) == first);
  CHECK(tok.decode(ids) == text);
  // Appending to a non-empty vector continues it.
  std::vector<uint32_t> out{7};
  tok.encode_ordinary_append(text.substr(0, 100), out);
  CHECK(out.size() == 1 + tok.encode_ordinary(text.substr(0, 100)).size());
  CHECK(out[0] == 7);
}

TEST_CASE("any byte string round-trips, including invalid UTF-8") {
  const auto& tok = Tokenizer::gpt2();
  const std::vector<std::string> cases = {
      std::string("\xFF\xFE\xFD", 3),
      std::string("abc\x80" "def", 7),
      std::string("\xC3", 1),                 // truncated 2-byte sequence at the end
      std::string("\xE2\x82", 2),             // truncated 3-byte sequence
      std::string("\xC0\xAF", 2),             // overlong '/'
      std::string("\xED\xA0\x80", 3),         // UTF-16 surrogate
      std::string("\xF4\x90\x80\x80", 4),     // above U+10FFFF
      std::string("x \xF0\x9F\x98\x80\xF0\x9F", 8),
      std::string("\0\0 \0", 4),
  };
  for (const auto& s : cases) {
    const auto ids = tok.encode_ordinary(s);
    CHECK(tok.decode(ids) == s);
  }
  // A lone invalid byte becomes its byte token.
  CHECK(tok.encode_ordinary(std::string("\xFF", 1)) == std::vector<uint32_t>{tok.encode_ordinary("\xFF").at(0)});
  CHECK(tok.token_bytes(tok.encode_ordinary(std::string("\x80", 1)).at(0)) == std::string("\x80", 1));

  std::mt19937 rng(1234);
  for (int round = 0; round < 300; ++round) {
    std::string s(rng() % 300, '\0');
    // Mix uniform bytes with ASCII so pieces are both short and long.
    for (auto& c : s) c = static_cast<char>(rng() % 3 == 0 ? rng() % 256 : 'a' + rng() % 4 + (rng() % 5 == 0 ? -65 : 0));
    const auto ids = tok.encode_ordinary(s);
    REQUIRE(tok.decode(ids) == s);
  }
}

TEST_CASE("long pieces: the heap merge agrees with the scan merge") {
  // The scan is tiktoken's algorithm as written; the heap must pick the same merges.
  const auto& tok = Tokenizer::gpt2();
  const std::string text = read_bytes(data_dir / "tinyshakespeare.txt");
  // The scan path is only used up to small_piece_max bytes; compare both on pieces of
  // Shakespeare and on random digit/letter strings of every length up to that limit.
  std::mt19937 rng(99);
  const auto& vocab = tok.internal_vocab();
  for (int round = 0; round < 2000; ++round) {
    const size_t len = 2 + rng() % (pipeline::datasets::bpe::small_piece_max - 1);
    std::string s;
    if (round % 2 == 0) {
      const size_t at = rng() % (text.size() - len);
      s = text.substr(at, len);
    } else {
      for (size_t i = 0; i < len; ++i) s += static_cast<char>(round % 4 == 1 ? '0' + rng() % 10 : 'a' + rng() % 3);
    }
    std::vector<uint32_t> a, b;
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    pipeline::datasets::bpe::merge_small(vocab, p, s.size(), a);
    pipeline::datasets::bpe::merge_large(vocab, p, s.size(), b);
    REQUIRE_MESSAGE(a == b, "piece '" << s << "'");
  }
  // Megabyte-long single pieces still encode (and round-trip) quickly.
  const std::string digits(1 << 20, '7');
  const auto ids = tok.encode_ordinary(digits);
  CHECK(tok.decode(ids) == digits);
}

TEST_CASE("special tokens") {
  const auto& tok = Tokenizer::gpt2();
  const std::string text = "Hello<|endoftext|> world<|endoftext|>";
  const auto special = tok.encode(text, true);
  CHECK(std::count(special.begin(), special.end(), Tokenizer::eot_id) == 2);
  CHECK(special.back() == Tokenizer::eot_id);
  CHECK(special == std::vector<uint32_t>{15496, 50256, 995, 50256});
  const auto ordinary = tok.encode_ordinary(text);
  CHECK(std::count(ordinary.begin(), ordinary.end(), Tokenizer::eot_id) == 0);
  CHECK(tok.encode(text, false) == ordinary);
  CHECK(tok.decode(special) == text);
  CHECK(tok.decode(ordinary) == text);
  CHECK(tok.encode("<|endoftext|>", true) == std::vector<uint32_t>{50256});
}

TEST_CASE("decode rejects out-of-range ids, naming id and index") {
  const auto& tok = Tokenizer::gpt2();
  const std::vector<uint32_t> ids{15496, 995, 50257, 1};
  try {
    (void)tok.decode(ids);
    FAIL("decode accepted id 50257");
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    CHECK(msg.find("50257") != std::string::npos);
    CHECK(msg.find("index 2") != std::string::npos);
  }
  CHECK_THROWS_AS(tok.token_bytes(60000), std::invalid_argument);
}

TEST_CASE("loading errors name the file and position") {
  const fs::path dir = fs::temp_directory_path() / ("pipeline_test_tokenizer_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path good_enc = data_dir / "gpt2_encoder.json";
  const fs::path good_bpe = data_dir / "gpt2_vocab.bpe";
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir / name, std::ios::binary) << content;
    return dir / name;
  };
  auto message_of = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "no exception";
  };

  const std::string missing = message_of([&] { Tokenizer::load(dir / "nope.json", good_bpe); });
  CHECK(missing.find("nope.json") != std::string::npos);

  const auto bad_json = write("bad.json", "{\"a\": 0, \"b\" 1}");
  const std::string m1 = message_of([&] { Tokenizer::load(bad_json, good_bpe); });
  CHECK(m1.find("bad.json") != std::string::npos);
  CHECK(m1.find("byte offset 13") != std::string::npos);

  std::string enc = read_bytes(good_enc);
  std::string bpe = read_bytes(good_bpe);
  // Break merge line 5 (the header is line 1).
  size_t at = 0;
  for (int line = 1; line < 5; ++line) at = bpe.find('\n', at) + 1;
  bpe.insert(at, "zz");
  const auto bad_bpe = write("bad.bpe", bpe);
  const std::string m2 = message_of([&] { Tokenizer::load(good_enc, bad_bpe); });
  CHECK(m2.find("bad.bpe") != std::string::npos);
  CHECK(m2.find("line 5") != std::string::npos);

  const auto truncated = write("trunc.json", enc.substr(0, enc.size() / 2));
  const std::string m3 = message_of([&] { Tokenizer::load(truncated, good_bpe); });
  CHECK(m3.find("trunc.json") != std::string::npos);
  CHECK(m3.find("byte offset") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("concurrent encoding from several threads gives identical results") {
  const auto& tok = Tokenizer::gpt2();
  const std::string text = read_bytes(data_dir / "edge_cases.txt") + read_bytes(data_dir / "tinyshakespeare.txt");
  const auto want = tok.encode_ordinary(text);
  constexpr int n_threads = 8;
  std::vector<std::vector<uint32_t>> got(n_threads);
  std::vector<std::thread> threads;
  for (int t = 0; t < n_threads; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep) got[t] = tok.encode_ordinary(text);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < n_threads; ++t) CHECK(got[t] == want);
}
