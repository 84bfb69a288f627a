"""Puts the project's GPT-2 vocabulary where tiktoken looks before downloading, so the reference
benchmark runs offline:  write_tiktoken_cache.py DIR  (then TIKTOKEN_CACHE_DIR=DIR).

tiktoken names each cached file by the SHA-1 of its download URL, and checks the content's
SHA-256 against the one it expects: the bytes must be OpenAI's, which the project ships
(datasets/tokenizer/vocab/*.zst)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = {  # sha1(url) -> the vocabulary file
    "6d1cbeee0f20b3d9449abfede4726ed8212e3aee": "gpt2_vocab.bpe.zst",
    "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6": "gpt2_encoder.json.zst",
}

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for name, src in FILES.items():
    data = subprocess.run(["zstd", "-q", "-d", "-c", os.path.join(ROOT, "datasets", "vocab", src)],
                          check=True, capture_output=True).stdout
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
