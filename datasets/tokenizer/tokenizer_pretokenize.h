// GPT-2's pre-tokenization rule as a hand-written scanner. The pattern is
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// tried leftmost-first at each position, exactly as tiktoken's `gpt2` encoding runs it.
//
// Why not PCRE2 (UTF+UCP+JIT)? Three reasons, measured or checked when this was written:
//  - Unicode classes: Debian's PCRE2 10.42 carries Unicode 14 tables, tiktoken's Rust regex
//    crate Unicode 16; ICU 72 (Unicode 15.0, used through unicode_class.h) plus a 29-range
//    top-up matches tiktoken on every code point (checked by probing tiktoken itself).
//  - Invalid UTF-8: PCRE2 either rejects such input or (PCRE2_MATCH_INVALID_UTF) makes the bad
//    bytes unmatchable barriers; the byte-level scheme wants them treated like U+FFFD, i.e. as
//    members of [^\s\p{L}\p{N}], so that any byte string splits deterministically.
//  - Speed: the pattern needs only one character of lookahead once its alternatives are read
//    off, so a scanner with an ASCII table visits every byte once, with no per-match call.
// Each branch below names the alternative it implements; tests/test_tokenizer.cpp checks the
// result against tiktoken's ids for a file of deliberately hard text.
#pragma once

#include <cstddef>
#include <string_view>

#include "datasets/tokenizer/unicode_class.h"

namespace pipeline::datasets {

/// Splits text into GPT-2 pre-tokens. Usage: `while (auto piece = s.next(); !piece.empty())`.
class Pretokenizer {
 public:
  explicit Pretokenizer(std::string_view text)
      : p_(reinterpret_cast<const unsigned char*>(text.data())),
        end_(p_ + text.size()),
        bmp_(unicode::bmp_table()) {}

  /// The next piece, or an empty view at the end of the text.
  std::string_view next() {
    using unicode::CharClass;
    const unsigned char* start = p_;
    if (start == end_) return {};
    const unsigned char* p = start;

    // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive in GPT-2's pattern).
    if (*p == '\'' && end_ - p >= 2) {
      const unsigned char c1 = p[1];
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return take(p + 2);
      if (end_ - p >= 3) {
        const unsigned char c2 = p[2];
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return take(p + 3);
      }
    }

    unicode::CharInfo c = char_at(p);
    //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ : an optional U+0020 then a run of one class.
    if (*p == ' ' && end_ - p >= 2) {
      const unicode::CharInfo c1 = char_at(p + 1);
      if (c1.cls != CharClass::space) return take(run_end(p + 1 + c1.len, c1.cls));
    }
    if (c.cls != CharClass::space) return take(run_end(p + c.len, c.cls));

    // \s+(?!\S) | \s+ : the whitespace run, less its last character when a non-space follows
    // and the run has more than one character (backtracking leaves that character to start
    // the next piece, e.g. the space in " word").
    const unsigned char* last = p;
    p += c.len;
    while (p < end_) {
      const unicode::CharInfo d = char_at(p);
      if (d.cls != CharClass::space) return take(last == start ? p : last);
      last = p;
      p += d.len;
    }
    return take(p);
  }

 private:
  unicode::CharInfo char_at(const unsigned char* p) const { return unicode::char_at(p, end_, bmp_); }

  const unsigned char* run_end(const unsigned char* p, unicode::CharClass cls) const {
    while (p < end_) {
      // ASCII letters and digits dominate real text: stay out of the UTF-8 decoder for them.
      if (*p < 0x80) {
        if (bmp_[*p] != cls) break;
        ++p;
        continue;
      }
      const unicode::CharInfo d = char_at(p);
      if (d.cls != cls) break;
      p += d.len;
    }
    return p;
  }

  std::string_view take(const unsigned char* stop) {
    const unsigned char* start = p_;
    p_ = stop;
    return {reinterpret_cast<const char*>(start), static_cast<size_t>(stop - start)};
  }

  const unsigned char* p_;
  const unsigned char* end_;
  const unicode::CharClass* bmp_;
};

}  // namespace pipeline::datasets
