#!/usr/bin/env python3
"""GPU time per step by kind of kernel, from Chrome traces of the same training step.

Each argument is LABEL=TRACE.json[:STEPS]: a trace written by `bench_model --profile` or
`tools/eager_step.py --profile` (Kineto's Chrome trace format) and the number of steps it holds
(default 3). Prints, in Markdown:
  - per trace: the kernels' summed time per step, the GPU's busy time (the union of the kernels'
    intervals) and its span from first kernel to last, per step;
  - per kind of kernel (matmuls, attention forward and backward, LayerNorm, GELU, the loss,
    the optimizer, ...): ms per step and launches per step, one column per trace;
  - the kernels that take the most time in any trace, with their time in each.

    python3 tools/kernel_table.py pipeline=build/bench.json eager=build/eager.json:3

tools/gpu_report.sh profile writes both traces and this table on the GPU machine.
"""
import collections
import json
import re
import sys

# The first pattern that matches a kernel's name (lower case) names its kind.
KINDS = [
    ("attention backward", r"flash_bwd|fmha.*(bwd|backward)|attention.*backward|bprop|dot_do_o|convert_dq"),
    ("attention forward", r"flash_fwd|fmha|attention|fprop|sdpa"),
    ("optimizer (AdamW)", r"adam"),
    ("gradient norm and clip", r"norm.*foreach|foreach.*norm|lpnorm|multi_tensor_apply.*(scale|mul)"),
    ("loss (softmax, gather, scatter)", r"softmax|nll|cross_entropy|gather|scatter"),
    ("LayerNorm", r"layer_norm|layernorm"),
    ("GELU", r"gelu"),
    ("embedding", r"embedding|index"),
    ("matmul (GEMM)", r"gemm|cutlass|xmma|nvjet|cublas|sm\d+_|ampere|hopper|splitk|gemv"),
    ("reduction (sum, bias grad)", r"reduce"),
    ("copy and cast", r"copy|cast|convert"),
    ("fill and memset", r"fill|memset"),
    ("memcpy", r"memcpy"),
    ("elementwise (add, mul)", r"elementwise|vectorized|unrolled|foreach"),
]
KIND_RE = [(k, re.compile(p)) for k, p in KINDS]


def kind_of(name):
    low = name.lower()
    for k, rx in KIND_RE:
        if rx.search(low):
            return k
    return "other"


def load(spec):
    label, _, rest = spec.partition("=")
    if not rest:
        sys.exit(f"kernel_table: expected LABEL=TRACE.json[:STEPS], got {spec!r}")
    path, steps = rest, 3
    m = re.match(r"^(.*):(\d+)$", rest)
    if m:
        path, steps = m.group(1), int(m.group(2))
    try:
        with open(path) as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"kernel_table: cannot read {path}: {e}")
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    if not kernels:
        sys.exit(f"kernel_table: {path} holds no GPU kernels (was it recorded on CUDA?)")
    return label, steps, kernels


def busy_and_span(kernels):
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in kernels)
    busy, end = 0.0, spans[0][0]
    for s, e in spans:
        if e > end:
            busy += e - max(s, end)
            end = e
    return busy, spans[-1][1] - spans[0][0]


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    traces = [load(a) for a in argv]
    labels = [t[0] for t in traces]
    per_kind = collections.defaultdict(lambda: collections.defaultdict(lambda: [0.0, 0]))
    per_name = collections.defaultdict(lambda: collections.defaultdict(float))
    print("| trace | kernel time, ms/step | GPU busy, ms/step | first to last kernel, ms/step | launches/step |")
    print("| --- | --- | --- | --- | --- |")
    for label, steps, kernels in traces:
        total = sum(float(e.get("dur", 0)) for e in kernels) / 1e3 / steps
        busy, span = busy_and_span(kernels)
        print(f"| {label} | {total:.2f} | {busy / 1e3 / steps:.2f} | {span / 1e3 / steps:.2f} | {len(kernels) / steps:.0f} |")
        for e in kernels:
            ms = float(e.get("dur", 0)) / 1e3 / steps
            k = per_kind[kind_of(e["name"])][label]
            k[0] += ms
            k[1] += 1 / steps
            per_name[e["name"]][label] += ms
    print()
    print("| kind | " + " | ".join(f"{l} ms (launches)" for l in labels) + " |")
    print("| --- |" + " --- |" * len(labels))
    order = sorted(per_kind, key=lambda k: -max(v[0] for v in per_kind[k].values()))
    for k in order:
        cells = [f"{per_kind[k][l][0]:.2f} ({per_kind[k][l][1]:.0f})" if l in per_kind[k] else "-" for l in labels]
        print(f"| {k} | " + " | ".join(cells) + " |")
    print()
    print("| kernel | kind | " + " | ".join(f"{l} ms" for l in labels) + " |")
    print("| --- | --- |" + " --- |" * len(labels))
    top = sorted(per_name, key=lambda n: -max(per_name[n].values()))[:40]
    for n in top:
        short = n if len(n) <= 110 else n[:107] + "..."
        cells = [f"{per_name[n][l]:.2f}" if l in per_name[n] else "-" for l in labels]
        print(f"| `{short}` | {kind_of(n)} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
