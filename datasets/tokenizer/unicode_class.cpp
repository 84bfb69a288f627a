// Unicode classification for the GPT-2 pre-tokenizer, backed by ICU's character properties
// plus the few characters newer than ICU's data that tiktoken already knows.
#include "datasets/tokenizer/unicode_class.h"

#include <unicode/uchar.h>

namespace pipeline::datasets::unicode {

namespace {

// Characters assigned after Unicode 15.0 (ICU 72's data) that tiktoken 0.14 already treats as
// \p{L} or \p{N}: its Rust regex crate carries Unicode 16.0 tables. Found by running tiktoken
// with the patterns \p{L}, \p{N} and \s over every code point and diffing against ICU
// (datasets/tokenizer/vocab/probe_tiktoken_classes.py); there were no other differences, and none for \s.
// Used only where ICU says "unassigned", so a newer ICU that knows these simply agrees.
struct Range {
  uint32_t first, last;
  CharClass cls;
};
constexpr Range newer_than_icu[] = {
    {0x1C89, 0x1C8A, CharClass::letter},   {0xA7CB, 0xA7CD, CharClass::letter},
    {0xA7DA, 0xA7DC, CharClass::letter},   {0x105C0, 0x105F3, CharClass::letter},
    {0x10D40, 0x10D49, CharClass::number}, {0x10D4A, 0x10D65, CharClass::letter},
    {0x10D6F, 0x10D85, CharClass::letter}, {0x10EC2, 0x10EC4, CharClass::letter},
    {0x11380, 0x11389, CharClass::letter}, {0x1138B, 0x1138B, CharClass::letter},
    {0x1138E, 0x1138E, CharClass::letter}, {0x11390, 0x113B5, CharClass::letter},
    {0x113B7, 0x113B7, CharClass::letter}, {0x113D1, 0x113D1, CharClass::letter},
    {0x113D3, 0x113D3, CharClass::letter}, {0x116D0, 0x116E3, CharClass::number},
    {0x11BC0, 0x11BE0, CharClass::letter}, {0x11BF0, 0x11BF9, CharClass::number},
    {0x13460, 0x143FA, CharClass::letter}, {0x16100, 0x1611D, CharClass::letter},
    {0x16130, 0x16139, CharClass::number}, {0x16D40, 0x16D6C, CharClass::letter},
    {0x16D70, 0x16D79, CharClass::number}, {0x18CFF, 0x18CFF, CharClass::letter},
    {0x1CCF0, 0x1CCF9, CharClass::number}, {0x1E5D0, 0x1E5ED, CharClass::letter},
    {0x1E5F0, 0x1E5F0, CharClass::letter}, {0x1E5F1, 0x1E5FA, CharClass::number},
    {0x2EBF0, 0x2EE5D, CharClass::letter},
};

CharClass newer_class(uint32_t cp) {
  for (const Range& r : newer_than_icu)
    if (cp >= r.first && cp <= r.last) return r.cls;
  return CharClass::other;
}

}  // namespace

CharClass classify_slow(uint32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  // \s in the Rust regex crate is the White_Space property (not Python's isspace, which adds
  // U+001C..U+001F), so ask ICU for exactly that property.
  if (u_isUWhiteSpace(c)) return CharClass::space;
  switch (u_charType(c)) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return CharClass::letter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return CharClass::number;
    case U_UNASSIGNED:
      return newer_class(cp);
    default:
      return CharClass::other;
  }
}

}  // namespace pipeline::datasets::unicode
