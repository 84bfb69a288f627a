#!/usr/bin/env python3
"""Converts HellaSwag's validation set from its six-lines-per-task text layout into the official
JSONL form (hellaswag_val.jsonl: one object per line with ctx, endings and label), for the tests.

    make_items.py hellaswag_val_full.txt.bz2 --every 40 --out val_every40.jsonl

The text layout (from the public hellaswag_text_data repository) is, per task:
    activity_label + ": " + ctx
    label                    (0-3)
    endings[0] .. endings[3] (one per line)
ctx is the first line after its first ": " (the activity label is written before it and no label
holds ": "); the label goes into "activity_label". "item" is the task's index in the validation
set (0-based; the official file's "ind" is another numbering, which the text layout lacks).
--every K keeps tasks 0, K, 2K, ...; --count N stops after N kept (0: no limit).

HellaSwag: Rowan Zellers et al. 2019, MIT License (see README.md in this folder).
"""
import argparse
import bz2
import json


def tasks(path):
    opener = bz2.open if path.endswith(".bz2") else open
    with opener(path, "rt", encoding="utf-8", newline="\n") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) % 6:
        raise SystemExit(f"{path}: {len(lines)} lines, not a multiple of 6")
    for i in range(len(lines) // 6):
        head, label, *endings = lines[6 * i:6 * i + 6]
        activity, sep, ctx = head.partition(": ")
        if not sep or label not in ("0", "1", "2", "3"):
            raise SystemExit(f"{path}:{6 * i + 1}: not a task (activity_label: ctx, then a label 0-3)")
        yield i, {"ctx": ctx, "endings": endings, "label": int(label), "activity_label": activity, "item": i}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text")
    p.add_argument("--every", type=int, default=1)
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    kept = 0
    with open(args.out, "w", encoding="utf-8", newline="\n") as out:
        for i, task in tasks(args.text):
            if i % args.every:
                continue
            out.write(json.dumps(task, ensure_ascii=False) + "\n")
            kept += 1
            if args.count and kept == args.count:
                break
    print(f"{args.out}: {kept} items")


if __name__ == "__main__":
    main()
