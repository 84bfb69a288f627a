#!/usr/bin/env python3
"""HellaSwag scored with transformers, the way build-nanogpt's hellaswag.py and llm.c score it: the
reference `pipeline eval --hellaswag` is checked against (tests/test_interop.cpp).

    hellaswag_reference.py --model DIR --items FILE.jsonl [--n N] --predictions OUT

For each item: the context `ctx` and each ending, as " " + ending, are tokenized apart with
AutoTokenizer; a row is context + ending, its first tokens dropped when it is longer than the
model's n_positions + 1 (the ending kept whole; the last token is a target only, as lm-eval keeps
max_length + 1); the 4 rows, all their tokens but the last, go through GPT2LMHeadModel together,
padded on the right; an ending's loss is the cross-entropy of its tokens given what precedes them.
acc_norm's prediction is the ending with the lowest mean, acc's the lowest sum. Writes acc_norm's
predictions to OUT, one a line, and prints

    hellaswag acc_norm A acc B n N
    closest: the smallest gap between acc_norm's best and second-best mean over the items

Run with the interpreter tools/setup.sh prepares (the torch venv, with transformers installed).
"""
import argparse
import json

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, GPT2LMHeadModel


def rows_of(tok, item, n_ctx):
    ctx = tok(item["ctx"])["input_ids"]
    tokens, masks = [], []
    for ending in item["endings"]:
        end = tok(" " + ending)["input_ids"]
        keep = min(len(ctx), n_ctx + 1 - len(end))
        tokens.append(ctx[len(ctx) - keep:] + end)
        masks.append([0] * keep + [1] * len(end))
    length = max(len(r) for r in tokens)
    t = torch.zeros((4, length), dtype=torch.long)
    m = torch.zeros((4, length), dtype=torch.long)
    for i, (r, k) in enumerate(zip(tokens, masks)):
        t[i, :len(r)] = torch.tensor(r)
        m[i, :len(k)] = torch.tensor(k)
    return t, m


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--items", required=True)
    p.add_argument("--n", type=int, default=0)
    p.add_argument("--predictions", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    model = GPT2LMHeadModel.from_pretrained(args.model, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(args.model)
    n_ctx = model.config.n_positions
    with open(args.items, encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.strip()]
    if args.n:
        items = items[:args.n]
    preds, correct, correct_norm, closest = [], 0, 0, float("inf")
    with torch.no_grad():
        for item in items:
            tokens, mask = rows_of(tok, item, n_ctx)
            logits = model(tokens[:, :-1]).logits  # (4, L - 1, V)
            losses = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1),
                                     reduction="none").view(4, -1)
            shift_mask = mask[:, 1:].float()
            sums = (losses * shift_mask).sum(dim=1)
            means = sums / shift_mask.sum(dim=1)
            pred, pred_norm = int(sums.argmin()), int(means.argmin())
            label = int(item["label"])
            correct += pred == label
            correct_norm += pred_norm == label
            preds.append(pred_norm)
            ordered = sorted(means.tolist())
            closest = min(closest, ordered[1] - ordered[0])
    with open(args.predictions, "w", encoding="utf-8") as f:
        f.writelines(f"{x}\n" for x in preds)
    n = len(items)
    print(f"hellaswag acc_norm {correct_norm / n:.4f} acc {correct / n:.4f} n {n}")
    print(f"closest: {closest:.3g}")


if __name__ == "__main__":
    main()
