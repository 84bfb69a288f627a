#!/usr/bin/env python3
"""Replays a `pipeline run` in PyTorch, step by step, the nanoGPT way, and compares the two
trajectories: every step's learning rate, loss and gradient norm, and the final weights.

    tools/parity_train.py RUN_DIR [--init HF_DIR] [--final HF_DIR] [--pipeline EXE] [--json OUT]

What the run must have (docs/eval.md, "A trajectory pinned to PyTorch's"):
  - started from a Hugging Face GPT-2 directory: `[model] init_from` (read from RUN_DIR/config.toml),
    or --init HF_DIR, the directory the run's first weights were exported to;
  - trained in the documents order (`[data] order = "documents"`: one token stream, cut in windows);
  - recorded its batches with the last target: a `record_batches` stage after pack with
    `last_target = true`, so RUN_DIR/batches.u16 holds steps * grad_accum * B * T + 1 tokens
    (pack's windows overlap by one token: batch i is x = tokens[i*B*T : (i+1)*B*T] and
    y = tokens[i*B*T + 1 : (i+1)*B*T + 1]);
  - one process (no torchrun), dropout 0, and a checkpoint at its last step (the default).

The replay, from the same weights and on the same batches (GPT2LMHeadModel from transformers):
  - the learning rate of step s (0-based) is model/net/schedule.h's: lr * (s+1) / warmup during the
    warmup, then cosine from lr to min_lr over the remaining steps, min_lr from `steps` on;
  - AdamW (torch.optim.AdamW) with two groups: weight decay on parameters of 2 or more
    dimensions (matrices, embeddings), none on biases and LayerNorm weights;
  - grad_accum micro-batches, each loss divided by grad_accum before backward; the logged loss
    is their sum; then the gradients' global norm is clipped to grad_clip (after the
    accumulation), the optimizer steps and the gradients are set to None;
  - in fp32, or under torch.autocast(bfloat16) when the run trained in bf16; on the run's device.
The final weights are the run's last checkpoint, exported (`pipeline export`, found beside this
script in build/tools/, or --pipeline EXE), or --final HF_DIR.

Tolerances (relative unless said): fp32: loss 1e-5 at every step, grad norm 1e-5 (plus half a
unit of the 5 decimals metrics.jsonl keeps), learning rate 1e-6 (its 7 printed digits), final
weights 1e-4 absolute. bf16: loss and grad norm 2**-6 (4 bf16 units, torch.testing's bfloat16
default), final weights steps * lr * 2**-6 absolute (each AdamW update moves a weight by about lr
at most). --rtol-loss, --rtol-norm and --atol-weights override them. Exit status 0 when every
check holds, 1 otherwise (the first steps that differ are printed), 2 on bad input.
Run with the interpreter tools/setup.sh prepares (the torch venv, with transformers installed).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import tomllib

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel


def fail(message):
    print(f"parity_train: {message}", file=sys.stderr)
    sys.exit(2)


def lr_at(step, o, total):
    """model/net/schedule.h's LrSchedule::at, for 0-based `step`."""
    if step < o["warmup_steps"]:
        return o["lr"] * (step + 1) / o["warmup_steps"]
    if step >= total:
        return o["min_lr"]
    span = max(total - o["warmup_steps"], 1)
    progress = (step - o["warmup_steps"]) / span
    return o["min_lr"] + (o["lr"] - o["min_lr"]) * 0.5 * (1.0 + math.cos(math.pi * progress))


def read_metrics(path):
    steps = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = json.loads(line)
            if "loss" in m and "grad_norm" in m:
                steps[m["step"]] = m
    return steps


def export_final(run_dir, exe, out):
    if not os.path.exists(exe):
        fail(f"{exe}: no pipeline executable to export the final checkpoint with (give --pipeline EXE or --final HF_DIR)")
    r = subprocess.run([exe, "export", run_dir, "--out", out, "--no-tokenizer"], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"pipeline export {run_dir} failed:\n{r.stdout}{r.stderr}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir")
    p.add_argument("--init", help="the Hugging Face directory the run started from (default: [model] init_from)")
    p.add_argument("--final", help="the run's last checkpoint as a Hugging Face directory (default: exported now)")
    p.add_argument("--pipeline", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build",
                                                      "tools", "pipeline"))
    p.add_argument("--batches", help="the recorded batches (default: RUN_DIR/batches.u16)")
    p.add_argument("--rtol-loss", type=float)
    p.add_argument("--rtol-norm", type=float)
    p.add_argument("--atol-weights", type=float)
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (default 1)")
    p.add_argument("--json", help="write every step's figures and the verdict to this file")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    run_dir = args.run_dir
    try:
        with open(os.path.join(run_dir, "config.toml"), "rb") as f:
            cfg = tomllib.load(f)
    except OSError as e:
        fail(f"{run_dir}: not a run directory ({e})")
    t, o, m = cfg["training"], cfg["optimizer"], cfg["model"]
    B, T, accum, steps = t["batch_size"], t["seq_len"], t["grad_accum"], t["steps"]
    bf16 = t["dtype"] == "bf16"
    if m.get("dropout", 0.0) != 0.0:
        fail(f"{run_dir}: [model] dropout = {m['dropout']}: the replay needs dropout 0 (random masks differ)")
    if cfg.get("data", {}).get("order", "documents") != "documents":
        fail(f"{run_dir}: [data] order = \"{cfg['data']['order']}\": the replay reads one token stream, which only "
             "the documents order trains on (train with --set data.order='\"documents\"')")
    init = args.init or m.get("init_from", "")
    if not init:
        fail(f"{run_dir}: the run did not start from a Hugging Face directory ([model] init_from is empty); "
             "give --init HF_DIR, the weights it started from")
    if not os.path.isabs(init) and not os.path.exists(init):
        init = os.path.join(run_dir, init)
    if not os.path.exists(os.path.join(init, "config.json")):
        fail(f"{init}: no Hugging Face model (config.json)")

    batches = args.batches or os.path.join(run_dir, "batches.u16")
    if not os.path.exists(batches):
        fail(f"{batches}: missing: record the run's batches (a record_batches stage after pack, last_target = true)")
    tokens = np.fromfile(batches, dtype="<u2")
    want = steps * accum * B * T + 1
    if tokens.size == want - 1:
        fail(f"{batches}: {tokens.size} tokens, the last batch's last target missing: record with "
             "[stages.<record_batches stage>] last_target = true")
    if tokens.size != want:
        fail(f"{batches}: {tokens.size} tokens, expected {want} (steps {steps} x grad_accum {accum} x B {B} x T {T} + 1): "
             "an interrupted or resumed-with-changes run cannot be replayed")
    tokens = torch.from_numpy(tokens.astype(np.int64))
    metrics = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    missing = [s for s in range(1, steps + 1) if s not in metrics]
    if missing:
        fail(f"{run_dir}/metrics.jsonl: no line for steps {missing[:5]}{'...' if len(missing) > 5 else ''}")

    device = torch.device("cuda" if cfg["run"]["device"] != "cpu" and torch.cuda.is_available() else "cpu")
    model = GPT2LMHeadModel.from_pretrained(init, dtype=torch.float32).to(device)
    model.eval()  # dropout off (the run's is 0); gradients still flow
    if model.config.n_positions < T:
        fail(f"{init}: context {model.config.n_positions} shorter than the run's seq_len {T}")
    params = [q for q in model.parameters() if q.requires_grad]  # tied lm_head counted once
    decay = [q for q in params if q.dim() >= 2]
    no_decay = [q for q in params if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    clip = t["grad_clip"] if t["grad_clip"] > 0 else float("inf")
    vocab = model.config.vocab_size

    rtol_loss = args.rtol_loss if args.rtol_loss is not None else (2 ** -6 if bf16 else 1e-5)
    rtol_norm = args.rtol_norm if args.rtol_norm is not None else (2 ** -6 if bf16 else 1e-5)
    atol_w = args.atol_weights if args.atol_weights is not None else (steps * o["lr"] * 2 ** -6 if bf16 else 1e-4)

    rows, bad, clipped = [], [], 0
    BT = B * T
    for s in range(steps):
        lr = lr_at(s, o, steps)
        for g in opt.param_groups:
            g["lr"] = lr
        loss_accum = torch.zeros((), device=device)
        for micro in range(accum):
            i = s * accum + micro
            x = tokens[i * BT:(i + 1) * BT].view(B, T).to(device)
            y = tokens[i * BT + 1:(i + 1) * BT + 1].view(B, T).to(device)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(x).logits  # (B, T, V)
                loss = F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))
            loss = loss / accum
            loss_accum += loss.detach()
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ours = metrics[s + 1]
        ref = {"loss": loss_accum.item(), "grad_norm": norm.item(), "lr": lr}
        clipped += ref["grad_norm"] > clip
        d_loss = abs(ours["loss"] - ref["loss"]) / abs(ref["loss"])
        d_norm = abs(ours["grad_norm"] - ref["grad_norm"])
        d_lr = abs(ours["lr"] - lr) / max(lr, 1e-30)
        ok = (d_loss <= rtol_loss and d_norm <= rtol_norm * ref["grad_norm"] + 5e-6 and d_lr <= 1e-6)
        rows.append({"step": s + 1, "ours": {k: ours[k] for k in ("loss", "grad_norm", "lr")}, "torch": ref,
                     "loss_rel": d_loss, "norm_abs": d_norm, "lr_rel": d_lr, "ok": ok})
        if not ok:
            bad.append(rows[-1])

    final_dir = args.final
    tmp = None
    if not final_dir:
        tmp = tempfile.TemporaryDirectory(prefix="parity_train_")
        final_dir = tmp.name
        export_final(run_dir, args.pipeline, final_dir)
    final = load_file(os.path.join(final_dir, "model.safetensors"))
    state = model.state_dict()
    w_max, w_name, w_missing = 0.0, "", []
    for name, theirs in final.items():
        mine = state.get(name)
        if mine is None:
            w_missing.append(name)
            continue
        diff = (mine.detach().float().cpu() - theirs.float()).abs().max().item()
        if diff > w_max:
            w_max, w_name = diff, name
    weights_ok = w_max <= atol_w and not w_missing

    worst_loss = max(r["loss_rel"] for r in rows)
    worst_norm = max(r["norm_abs"] / max(r["torch"]["grad_norm"], 1e-30) for r in rows)
    print(f"parity_train: {steps} steps of {accum} x {B} x {T} tokens, {'bf16' if bf16 else 'fp32'} on {device.type}, "
          f"clipping at {t['grad_clip']} active in {clipped} steps")
    print(f"  loss:       worst relative difference {worst_loss:.2e} (tolerance {rtol_loss:.1e})")
    print(f"  grad norm:  worst relative difference {worst_norm:.2e} (tolerance {rtol_norm:.1e} + 5e-6 absolute)")
    print(f"  lr:         worst relative difference {max(r['lr_rel'] for r in rows):.2e} (tolerance 1e-6)")
    print(f"  weights:    largest |difference| {w_max:.2e} in {w_name or '-'} (tolerance {atol_w:.1e})"
          + (f"; missing from the replay: {w_missing[:3]}" if w_missing else ""))
    for r in bad[:5]:
        print(f"  step {r['step']} differs: ours {r['ours']}, torch {r['torch']}")
    verdict = not bad and weights_ok
    print("parity_train: " + ("the same trajectory" if verdict else
                              f"DIFFERENT: {len(bad)} of {steps} steps{', final weights' if not weights_ok else ''}"))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"steps": rows, "weights_max_abs": w_max, "weights_worst": w_name, "clipped_steps": clipped,
                       "tolerances": {"loss": rtol_loss, "grad_norm": rtol_norm, "weights": atol_w},
                       "ok": verdict}, f, indent=1)
    sys.exit(0 if verdict else 1)


if __name__ == "__main__":
    main()
