#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/): small valid inputs of
each format, so the fuzzers start from the interesting paths. Rerun after a format change:
    python3 tests/fuzz/make_seeds.py
Shards are compressed with the zstd command (content checksums on, as the format requires)."""
import json
import os
import struct
import subprocess
import tempfile
import zlib

ROOT = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(ROOT))
EOT = 50256


def put(target, name, data):
    d = os.path.join(ROOT, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def zstd(payload):
    return subprocess.run(["zstd", "-q", "-c", "-19", "--check"], input=payload, capture_output=True, check=True).stdout


def zstd_sized(payload):
    """One frame that records its content size, as a block shard's blocks must (the CLI records it
    for a file, not for a pipe)."""
    with tempfile.NamedTemporaryFile() as f:
        f.write(payload)
        f.flush()
        return subprocess.run(["zstd", "-q", "-c", "-19", "--check", f.name], capture_output=True, check=True).stdout


def payload_of(kind, docs):
    """(payload bytes, items) of documents: text with length prefixes, tokens with an EOT before each."""
    if kind == "text":
        return b"".join(struct.pack("<I", len(d)) + d for d in docs), sum(len(d) for d in docs)
    return (b"".join(struct.pack("<H", EOT) + struct.pack("<%dH" % len(d), *d) for d in docs),
            sum(len(d) + 1 for d in docs))


def header(kind, version, documents, items):
    magic = b"PLSHTEXT" if kind == "text" else b"PLSHTOKN"
    return struct.pack("<II", 0x184D2A50, 32) + magic + struct.pack("<IIQQ", version, 0, documents, items)


def shard(kind, docs):
    """Format 1: one frame."""
    payload, items = payload_of(kind, docs)
    return header(kind, 1, len(docs), items) + zstd(payload)


def block_shard(kind, blocks):
    """Format 2: a frame per block (a list of documents), then the block index."""
    body, entries, offset = b"", [], 40
    for docs in blocks:
        payload, items = payload_of(kind, docs)
        frame = zstd_sized(payload)
        entries.append(struct.pack("<QQQQ", offset, len(frame), len(docs), items))
        body += frame
        offset += len(frame)
    index = b"".join(entries) + struct.pack("<Q", len(blocks)) + b"PLSHBLKS"
    documents = sum(len(b) for b in blocks)
    items = sum(payload_of(kind, b)[1] for b in blocks)
    return header(kind, 2, documents, items) + body + struct.pack("<II", 0x184D2A5B, len(index)) + index


def checkpoint(meta, tensors):
    payload = meta
    for name, code, dims, data in tensors:
        payload += struct.pack("<I", len(name)) + name + struct.pack("<BBH", code, len(dims), 0)
        payload += b"".join(struct.pack("<q", d) for d in dims) + struct.pack("<Q", len(data)) + data
    header = b"PIPECKPT" + struct.pack("<IIqQQII", 1, 64, 12, len(meta), len(payload), len(tensors), zlib.crc32(payload))
    return header + b"\0" * (64 - len(header)) + payload


put("fuzz_shard_text", "three_docs", shard("text", [b"First Citizen:\nBefore we proceed", b"", "caf\u00e9 \u2603".encode()]))
put("fuzz_shard_text", "empty", shard("text", []))
put("fuzz_shard_tokens", "two_docs", shard("tokens", [[15496, 995], [464, 2068, 7586, 21831]]))
put("fuzz_shard_tokens", "empty_doc", shard("tokens", [[]]))
put("fuzz_shard_text", "blocks", block_shard("text", [[b"First Citizen:\nBefore we proceed", b""], ["caf\u00e9 \u2603".encode()],
                                                      [b"x" * 300, b"y"]]))
put("fuzz_shard_text", "no_blocks", block_shard("text", []))
put("fuzz_shard_tokens", "blocks", block_shard("tokens", [[[15496, 995], [464]], [[2068, 7586, 21831], []]]))

manifest = open(os.path.join(SRC, "datasets/data/tinyshakespeare/text/manifest.json")).read()
put("fuzz_manifest", "tinyshakespeare_text", manifest)
put("fuzz_manifest", "tinyshakespeare_tokens", open(os.path.join(SRC, "datasets/data/tinyshakespeare/tokens/manifest.json")).read())
put("fuzz_manifest", "one_frame_v1", json.dumps({
    "format": "pipeline-dataset", "version": 1, "kind": "tokens", "created_by": "pipeline prepare", "seed": 1337,
    "val_fraction": 0.1, "split_rule": "blank-lines",
    "splits": {"train": [{"name": "train_00000.tokens.zst", "bytes": 320370, "documents": 6499, "tokens": 304242,
                          "sha256": "396270aa4f21384d952b2af49b7b530dd5a918aea8f5489b09d1afedfa425c9c"}], "val": []}},
    indent=2))
put("fuzz_lane_cursor", "one_source", "lane=3 draws=17 tokens=5 units=12 items=40")
put("fuzz_lane_cursor", "mix", "lane=0 draws=0 tokens=0 units=1,0,7 items=2,0,9")
put("fuzz_lane_cursor", "checkpoint", json.dumps({"lanes": 2, "cursors": ["lane=1 draws=4 tokens=0 units=3 items=1",
                                                                          "lane=0 draws=2 tokens=9 units=2 items=0"]}))
put("fuzz_json", "manifest", manifest)
put("fuzz_json", "values", json.dumps({"a": [1, -2.5e3, True, None, 0, 1e400], "s": "x\"\u00e9\U0001F600\n\t\\/", "o": {}}))
put("fuzz_json", "cursor", '{"pos":"epoch=0 shard=1 item=25","skip":17,"mixed":false}')
put("fuzz_json", "escapes", '["\\u0000\\ud83d\\ude00\\b\\f", 18446744073709551616, -0, 0.5e-3]')

meta = b'{"cursor":{"pos":"epoch=0 shard=0 item=3","skip":5},"seed":7}'
put("fuzz_checkpoint", "two_tensors", checkpoint(meta, [
    (b"model/wte.weight", 1, [2, 3], struct.pack("<6f", *range(6))),
    (b"rng/cpu", 7, [4], b"\1\2\3\4")]))
put("fuzz_checkpoint", "empty", checkpoint(b"", []))

put("fuzz_config", "quickstart", open(os.path.join(SRC, "pipelines/quickstart.toml")).read())
put("fuzz_config", "with_sets", "model.n_layer=3\nstages.x.workers=2\n\0[model]\npreset = \"tiny\"\ninput = [\"a\", \"b\"]\n"
    "[stages.src]\ntype = \"test_source\"\n[stages.x]\ntype = \"delay\"\ninput = \"src\"\n")
put("fuzz_config", "removals", "stages.x.workers=2\nstages.x=\nmodel=\nstages.x.type=spin\nstages.nope=\n\0[model]\n"
    "n_layer = 3\n[stages.src]\ntype = \"test_source\"\n[stages.x]\ntype = \"delay\"\ninput = \"src\"\n")
put("fuzz_config", "types", "[model]\ndropout = 0.5\nbias = false\nprompt = \"a\\tb\\u00e9\"\nn_layer = 0x10\n")

put("fuzz_tokenizer", "ascii", "\0Hello world! It's 2024, isn't it?\n\n  spaces")
put("fuzz_tokenizer", "special", "\1<|endoftext|>The end<|endoftext|><|endo")
put("fuzz_tokenizer", "utf8", b"\0caf\xc3\xa9 \xe2\x98\x83 \xf0\x9f\x98\x80 \xff\xfe bad \xc3")


def safetensors(tensors, metadata=None):
    """tensors: (name, dtype, shape, raw bytes) in data order."""
    header, at = {}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(raw)]}
        at += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


put("fuzz_safetensors", "two_tensors", safetensors([
    ("wte.weight", "F32", [2, 3], struct.pack("<6f", *range(6))),
    ("h.0.ln_1.bias", "BF16", [4], b"\0\x3f" * 4)], {"format": "pt"}))
put("fuzz_safetensors", "empty_and_scalar", safetensors([
    ("empty", "F16", [0, 5], b""), ("scalar", "I64", [], struct.pack("<q", 7))]))


def llmc(tokens, magic=20240520, version=1):
    header = struct.pack("<3i", magic, version, len(tokens)) + b"\0" * (1024 - 12)
    return header + struct.pack("<%dH" % len(tokens), *tokens)


put("fuzz_llmc", "gpt2", llmc([EOT, 15496, 995, 0, EOT, 40, 716]))
put("fuzz_llmc", "empty", llmc([]))

# The Slurm variables a rank reads (fuzz_slurm_env: the host list, then NUL-separated: tasks per
# node, reserved ports, SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURMD_NODENAME, SLURM_NODEID,
# SLURM_JOB_ID), from tests/test_launch_env.cpp.
def slurm(*fields):
    return "\0".join(fields)


put("fuzz_slurm_env", "two_groups", slurm("n[1-3,7],gpu-a[01-02]", "2(x3),1", "20001-20002", "2", "3", "0", "n7", "3", "1234567"))
put("fuzz_slurm_env", "nested", slurm("rack[0-1]_blade[08-10]", "1(x6)", "", "5", "6", "0", "rack1_blade10", "5", "42"))
put("fuzz_slurm_env", "suffix", slurm("n[1-2]-ib,,m[5],", "2,1,1", "20001,20005-20006", "1", "4", "1", "n1-ib", "0", "9"))
put("fuzz_slurm_env", "loopback", slurm("127.0.0.[1-2]", "1(x2)", "22201-22202", "0", "2", "0", "127.0.0.2", "1", "5190"))
put("fuzz_slurm_env", "padding", slurm("n[009-011],a[1-2]b[3-4]", "1(x7)", "70000", "7", "7", "0", "n010"))
put("fuzz_slurm_env", "malformed", slurm("n[1-[2]],n[3-1],n1]", "2(x", "x-y", "two", "-1"))

# HellaSwag lines (fuzz_hellaswag), from tests/test_hellaswag.cpp.
put("fuzz_hellaswag", "good", '{"ctx": "A man is sitting on a roof. he", "endings": ["is using wrap.", "is ripping tiles '
    'off.", "is holding a cube.", "starts pulling up roofing."], "label": 3, "ind": 24}\n\n'
    '{"ctx": "Clean and jerk: the lady", "endings": ["a", "b", "c", "d"], "label": "1"}\n')
put("fuzz_hellaswag", "long_ending", '{"ctx": "c", "endings": ["' + " ".join(["word"] * 70) + '", "b", "c", "d"], '
    '"label": 0}\r\n')
put("fuzz_hellaswag", "malformed", '{"ctx": "c", "endings": ["a", "b", "c", "d"], "label": 0}\n'
    '{"ctx": "c", "endings": ["a", "b", "c", 4], "label": 0}\n[1, 2]\n{"ctx": "", "label": 4}\n')
