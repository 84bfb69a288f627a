// UTF-8 stepping and the three Unicode classes GPT-2's pre-tokenizer distinguishes
// (\p{L}, \p{N}, \s) plus "other". Classification comes from ICU (Debian 12: ICU 72, Unicode
// 15.0) topped up with the characters of Unicode 15.1/16.0 that tiktoken's Rust regex already
// knows (see unicode_class.cpp), tabulated for the Basic Multilingual Plane at build time so the
// hot path is one array load per code point.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pipeline::datasets::unicode {

/// What the GPT-2 pattern cares about. Invalid UTF-8 bytes count as `other`, which is what the
/// pattern would see for U+FFFD if the bytes were decoded with replacement.
enum class CharClass : uint8_t { other = 0, letter = 1, number = 2, space = 3 };

/// Class of a code point (any value up to U+10FFFF; surrogates are `other`).
CharClass classify_slow(uint32_t cp);

/// Classes of U+0000..U+FFFF: classify_slow's answers, tabulated at build time against the ICU
/// the library links (datasets/tokenizer/gen/make_unicode_table.cpp), so start-up asks ICU nothing.
extern const CharClass bmp_classes[0x10000];
inline const CharClass* bmp_table() { return bmp_classes; }

/// One UTF-8 character: its class and its length in bytes (1 for an invalid byte).
struct CharInfo {
  CharClass cls;
  uint32_t len;
};

/// Decodes the character at p (p < end). Well-formed UTF-8 only: overlong forms, surrogates,
/// values above U+10FFFF, stray continuation bytes and truncated sequences each yield a one-byte
/// `other` character, so every byte of any input belongs to exactly one character.
inline CharInfo char_at(const unsigned char* p, const unsigned char* end, const CharClass* bmp) {
  const uint32_t b0 = p[0];
  if (b0 < 0x80) return {bmp[b0], 1};
  const ptrdiff_t left = end - p;
  auto cont = [](uint32_t b) { return (b & 0xC0) == 0x80; };
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (left >= 2 && cont(p[1])) return {bmp[((b0 & 0x1F) << 6) | (p[1] & 0x3F)], 2};
    return {CharClass::other, 1};
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (left < 3) return {CharClass::other, 1};
    const uint32_t b1 = p[1];
    const uint32_t lo = b0 == 0xE0 ? 0xA0 : 0x80;  // no overlongs
    const uint32_t hi = b0 == 0xED ? 0x9F : 0xBF;  // no surrogates
    if (b1 < lo || b1 > hi || !cont(p[2])) return {CharClass::other, 1};
    return {bmp[((b0 & 0x0F) << 12) | ((b1 & 0x3F) << 6) | (p[2] & 0x3F)], 3};
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (left < 4) return {CharClass::other, 1};
    const uint32_t b1 = p[1];
    const uint32_t lo = b0 == 0xF0 ? 0x90 : 0x80;
    const uint32_t hi = b0 == 0xF4 ? 0x8F : 0xBF;  // nothing above U+10FFFF
    if (b1 < lo || b1 > hi || !cont(p[2]) || !cont(p[3])) return {CharClass::other, 1};
    const uint32_t cp = ((b0 & 0x07) << 18) | ((b1 & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    return {classify_slow(cp), 4};
  }
  return {CharClass::other, 1};
}

}  // namespace pipeline::datasets::unicode
