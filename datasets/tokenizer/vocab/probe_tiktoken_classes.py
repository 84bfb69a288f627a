"""Asks tiktoken how its regex engine classifies every code point (\\p{L}, \\p{N}, \\s), and
prints where that differs from our classifier's dump, as ranges for unicode_class.cpp.

A dev tool, not part of the build. Run when tiktoken or ICU changes Unicode version:
    pip install tiktoken
    python probe_tiktoken_classes.py OURS.bin
OURS.bin is one byte per code point 0..0x10FFFF (0 other, 1 letter, 2 number, 3 space), e.g.
written by a loop over pipeline::datasets::unicode::classify_slow.

How: an Encoding whose vocabulary is the 256 single bytes and whose pattern is just \\p{L}
returns (as bytes) exactly the characters of the input that the pattern matches, because
tiktoken drops the text between matches.
"""
import sys

import tiktoken

ranks = {bytes([i]): i for i in range(256)}
theirs = bytearray(0x110000)
for value, pat in [(1, r"\p{L}"), (2, r"\p{N}"), (3, r"\s")]:
    enc = tiktoken.Encoding(f"probe{value}", pat_str=pat, mergeable_ranks=ranks, special_tokens={})
    for start in range(0, 0x110000, 0x10000):
        text = "".join(chr(c) for c in range(start, start + 0x10000) if not 0xD800 <= c < 0xE000)
        for ch in bytes(enc.encode_ordinary(text)).decode("utf-8"):
            theirs[ord(ch)] = value

ours = open(sys.argv[1], "rb").read()
names = ["other", "letter", "number", "space"]
ranges = []
for c in range(0x110000):
    if ours[c] == theirs[c] or 0xD800 <= c < 0xE000:
        continue
    if ranges and ranges[-1][1] == c - 1 and ranges[-1][2:] == [ours[c], theirs[c]]:
        ranges[-1][1] = c
    else:
        ranges.append([c, c, ours[c], theirs[c]])
for first, last, o, t in ranges:
    print(f"{{0x{first:04X}, 0x{last:04X}, CharClass::{names[t]}}},  // ours: {names[o]}")
print(f"{len(ranges)} ranges differ (tiktoken {tiktoken.__version__})", file=sys.stderr)
