#!/usr/bin/env python3
"""Reads a run directory's TensorBoard event files with TensorBoard's own EventAccumulator and
writes every scalar as JSON, {tag: [[step, value], ...]}, for tests/test_interop.cpp.

    tensorboard_scalars.py --logdir RUN_DIR --out OUT.json
"""
import argparse
import json

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--logdir", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    acc = EventAccumulator(args.logdir, size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    out = {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
