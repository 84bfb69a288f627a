#!/usr/bin/env python3
"""The Hugging Face side of tests/test_interop.cpp: runs transformers on directories `pipeline
export` wrote, and writes GPT-2 directories with transformers for `[model] init_from` to read.

    hf_reference.py check-export --model DIR --input IN.json --out OUT.safetensors
        Loads DIR with GPT2LMHeadModel and AutoTokenizer as a user would, and writes:
          logits     (B, T, V) float32: the model's logits for IN's "ids" (B, T)
          generated  (P + N,) int64: greedy generation of N = IN's "new_tokens" from "prompt"
          tokens_<i> int64: AutoTokenizer's ids for IN's "texts"[i]
        and checks that DIR/tokenizer.json is the tokenizer transformers builds itself from
        DIR/vocab.json and DIR/merges.txt (exit status 1 with the difference otherwise).

    hf_reference.py make-model --layout L --out DIR --input IN.json [--seed S]
        A randomly initialised GPT2LMHeadModel of IN's "config", written in layout L:
          save_pretrained  transformers' own (keys "transformer.*", no lm_head)
          hub              the Hub's openai-community/gpt2 layout (no prefix, attn.bias and
                           attn.masked_bias buffers, no lm_head), via safetensors.torch.save_file
          sharded          save_pretrained with small shards and model.safetensors.index.json
          fp16             save_pretrained of the model in float16
        plus DIR/reference.safetensors: "logits" (B, T, V) float32 for IN's "ids", computed in
        float32 from the weights as stored.

    hf_reference.py shapes --out OUT.json DIR...
        For each DIR holding a config.json, the GPT2LMHeadModel transformers builds from it (on
        the meta device: shapes only, no memory), as {DIR: {"tensors": {name: shape, ...},
        "tied": lm_head shares wte's weight}}, names in state_dict order.

Run with the interpreter tools/setup.sh prepares (the torch venv, with transformers, safetensors
and tensorboard installed).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel


def logits_of(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids, dtype=torch.long)).logits.float().contiguous()


def check_tokenizer_json(model_dir):
    """tokenizer.json must equal what transformers builds from vocab.json + merges.txt."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("vocab.json", "merges.txt", "config.json"):
            shutil.copy(os.path.join(model_dir, name), tmp)
        converted = json.loads(AutoTokenizer.from_pretrained(tmp).backend_tokenizer.to_str())
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        ours = json.load(f)
    if ours != converted:
        for key in sorted(set(ours) | set(converted)):
            if ours.get(key) != converted.get(key):
                a, b = json.dumps(ours.get(key))[:300], json.dumps(converted.get(key))[:300]
                print(f"tokenizer.json differs at {key!r}:\n  ours:         {a}\n  transformers: {b}")
        sys.exit(1)


def check_export(args):
    with open(args.input, encoding="utf-8") as f:
        spec = json.load(f)
    model = GPT2LMHeadModel.from_pretrained(args.model, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(args.model)
    check_tokenizer_json(args.model)
    out = {"logits": logits_of(model, spec["ids"])}
    prompt = torch.tensor([spec["prompt"]], dtype=torch.long)
    with torch.no_grad():
        gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=spec["new_tokens"],
                             min_new_tokens=spec["new_tokens"], do_sample=False, pad_token_id=50256)
    out["generated"] = gen[0].to(torch.int64).contiguous()
    for i, text in enumerate(spec["texts"]):
        out[f"tokens_{i}"] = torch.tensor(tok(text)["input_ids"], dtype=torch.int64)
    save_file(out, args.out)


def make_model(args):
    with open(args.input, encoding="utf-8") as f:
        spec = json.load(f)
    torch.manual_seed(args.seed)
    config = GPT2Config(**spec["config"])
    model = GPT2LMHeadModel(config).eval()
    os.makedirs(args.out, exist_ok=True)
    if args.layout == "save_pretrained":
        model.save_pretrained(args.out)
    elif args.layout == "sharded":
        model.save_pretrained(args.out, max_shard_size="2MB")
        if not os.path.exists(os.path.join(args.out, "model.safetensors.index.json")):
            sys.exit("sharded: transformers wrote a single file")
    elif args.layout == "fp16":
        model = model.half()
        model.save_pretrained(args.out)
        model = model.float()  # the reference is computed from the weights as stored
    elif args.layout == "hub":
        prefix = "transformer."
        sd = {k[len(prefix):]: v.contiguous() for k, v in model.state_dict().items() if k.startswith(prefix)}
        n = config.n_positions
        for i in range(config.n_layer):
            sd[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
            sd[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
        save_file(sd, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
        config.save_pretrained(args.out)
    else:
        sys.exit(f"unknown layout {args.layout}")
    save_file({"logits": logits_of(model, spec["ids"])}, os.path.join(args.out, "reference.safetensors"))


def shapes(args):
    out = {}
    for d in args.dirs:
        with torch.device("meta"):
            model = GPT2LMHeadModel(GPT2Config.from_pretrained(d))
        tensors = {k: list(v.shape) for k, v in model.state_dict().items()}
        out[d] = {"tensors": tensors, "tied": model.lm_head.weight is model.transformer.wte.weight}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check-export")
    c.add_argument("--model", required=True)
    c.add_argument("--input", required=True)
    c.add_argument("--out", required=True)
    m = sub.add_parser("make-model")
    m.add_argument("--layout", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--input", required=True)
    m.add_argument("--seed", type=int, default=1234)
    s = sub.add_parser("shapes")
    s.add_argument("--out", required=True)
    s.add_argument("dirs", nargs="+")
    args = p.parse_args()
    torch.set_num_threads(1)
    {"check-export": check_export, "make-model": make_model, "shapes": shapes}[args.cmd](args)


if __name__ == "__main__":
    main()
