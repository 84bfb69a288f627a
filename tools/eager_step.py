#!/usr/bin/env python3
"""The step of `pipeline run gpt2_synthetic.toml` as a PyTorch script, to compare with.

The same model and step as the pipeline trains (GPT-2 with tied head and a vocabulary padded to
50,304, fp32, AdamW with decay on matrices only, betas 0.9/0.95, weight decay 0.1, the gradient
norm clipped at 1.0), on random tokens, with the cross-entropy over the padded logits as nanoGPT
computes it. Prints one line: milliseconds per step over the timed steps, as the pipeline counts
them (their wall time over their number), and the median step.

    $HOME/.cache/pipeline/torch-2.11.0/bin/python tools/eager_step.py \\
        --preset small-cpu --batch 8 --seq 128 --threads 2 --steps 30 --warmup 5

tools/compare_cpu_step.sh runs it alternately with the pipeline (docs/figures.md). On a GPU,
as nanoGPT trains (TF32 matmuls, bf16 autocast, fused AdamW, optionally torch.compile):

    python tools/eager_step.py --device cuda --preset gpt2 --batch 16 --seq 1024 --dtype bf16 [--compile]

--profile TRACE.json records --profile-steps more steps after the timed ones with torch.profiler
(CPU ops and CUDA kernels) into a Chrome trace, for tools/kernel_table.py beside bench_model's.

--recompute takes bench_model's choices ([training] recompute, model/net/recompute.h): mlp recomputes
the LayerNorms' and the GELU's outputs in backward (two autograd Functions here, as the pipeline's),
block runs each block under torch.utils.checkpoint. On CUDA the line ends with the peak memory
(torch.cuda.max_memory_allocated over the timed steps).
"""
import contextlib
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

PRESETS = {  # n_layer, n_head, n_embd, block_size (model/net/gpt_config.cpp)
    "tiny": (2, 2, 64, 64),
    "small-cpu": (4, 4, 128, 128),
    "gpt2": (12, 12, 768, 1024),
    "gpt2-medium": (24, 16, 1024, 1024),
    "gpt2-large": (36, 20, 1280, 1024),
    "gpt2-xl": (48, 25, 1600, 1024),
}
VOCAB, PADDED_VOCAB = 50257, 50304


def _compute_dtype(x, weight):
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else weight.dtype


class LayerNormLinear(torch.autograd.Function):
    """linear(layer_norm(x)) keeping x, not the LayerNorm's output (recomputed in backward)."""

    @staticmethod
    def forward(ctx, x, ln_w, ln_b, w, b):
        dt = _compute_dtype(x, w)
        h = F.layer_norm(x, (x.shape[-1],), ln_w, ln_b, 1e-5)
        wc = w.to(dt)
        ctx.save_for_backward(x, ln_w, ln_b, wc)
        ctx.dtypes = (w.dtype, b.dtype)
        return F.linear(h.to(dt), wc, b.to(dt))

    @staticmethod
    def backward(ctx, g):
        x, ln_w, ln_b, wc = ctx.saved_tensors
        with torch.enable_grad():
            xd = x.detach().requires_grad_(True)
            h = F.layer_norm(xd, (x.shape[-1],), ln_w, ln_b, 1e-5)
        g2 = g.to(wc.dtype).reshape(-1, wc.shape[0])
        hc = h.detach().to(wc.dtype).reshape(-1, wc.shape[1])
        grad_h = (g2 @ wc).view(h.shape).to(h.dtype)
        gx, gw_ln, gb_ln = torch.autograd.grad(h, (xd, ln_w, ln_b), grad_h)
        return gx, gw_ln, gb_ln, (g2.t() @ hc).to(ctx.dtypes[0]), g2.sum(0).to(ctx.dtypes[1])


class GeluLinear(torch.autograd.Function):
    """linear(gelu_tanh(u)) keeping u, not the GELU's output (recomputed in backward)."""

    @staticmethod
    def forward(ctx, u, w, b):
        dt = _compute_dtype(u, w)
        wc = w.to(dt)
        ctx.save_for_backward(u, wc)
        ctx.dtypes = (w.dtype, b.dtype)
        return F.linear(F.gelu(u, approximate="tanh").to(dt), wc, b.to(dt))

    @staticmethod
    def backward(ctx, g):
        u, wc = ctx.saved_tensors
        with torch.enable_grad():
            ud = u.detach().requires_grad_(True)
            a = F.gelu(ud, approximate="tanh")
        g2 = g.to(wc.dtype).reshape(-1, wc.shape[0])
        grad_a = (g2 @ wc).view(a.shape).to(a.dtype)
        (gu,) = torch.autograd.grad(a, (ud,), grad_a)
        return gu, (g2.t() @ a.detach().to(wc.dtype).reshape(-1, wc.shape[1])).to(ctx.dtypes[0]), g2.sum(0).to(ctx.dtypes[1])


class Block(nn.Module):
    def __init__(self, n_head, n_embd, recompute="none"):
        super().__init__()
        self.n_head = n_head
        self.recompute = recompute
        self.ln_1 = nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.attn_proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        if self.recompute == "block" and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(self.layers, x, use_reentrant=False)
        return self.layers(x)

    def layers(self, x):
        B, T, C = x.shape
        mlp = self.recompute == "mlp" and self.training and torch.is_grad_enabled()
        if mlp:
            qkv = LayerNormLinear.apply(x, self.ln_1.weight, self.ln_1.bias, self.c_attn.weight, self.c_attn.bias)
        else:
            qkv = self.c_attn(self.ln_1(x))
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        if mlp:
            u = LayerNormLinear.apply(x, self.ln_2.weight, self.ln_2.bias, self.c_fc.weight, self.c_fc.bias)
            return x + GeluLinear.apply(u, self.mlp_proj.weight, self.mlp_proj.bias)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, recompute="none"):
        super().__init__()
        self.wte = nn.Embedding(PADDED_VOCAB, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_head, n_embd, recompute) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # (B, T, 50304), tied head


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small-cpu", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast of the forward")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--recompute", default="none", choices=["none", "mlp", "block"],
                    help="activations computed again in backward, as bench_model --recompute")
    ap.add_argument("--sdpa", default="auto", choices=["auto", "flash", "cudnn", "efficient", "math"],
                    help="only this attention kernel, as bench_model --sdpa (auto: PyTorch's choice)")
    ap.add_argument("--profile", help="Chrome trace of --profile-steps steps after the timed ones")
    ap.add_argument("--profile-steps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(7)
    cuda = a.device == "cuda"
    if cuda:
        torch.set_float32_matmul_precision("high")
    model = GPT(*PRESETS[a.preset], recompute=a.recompute).to(a.device)
    step_model = torch.compile(model) if a.compile else model
    autocast = (torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16) if a.dtype == "bf16"
                else contextlib.nullcontext())
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    windows = [torch.randint(0, VOCAB, (a.batch * a.seq + 1,), device=a.device) for _ in range(8)]  # as `synthetic` cycles 8
    times = []
    start = 0.0

    from torch.nn.attention import SDPBackend, sdpa_kernel
    kernels = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    only = sdpa_kernel([kernels[a.sdpa]]) if a.sdpa != "auto" else contextlib.nullcontext()
    only.__enter__()  # for the whole run, as bench_model sets it

    def train_step(step):
        w = windows[step % len(windows)]
        x, y = w[:-1].view(a.batch, a.seq), w[1:].view(a.batch, a.seq)
        with autocast:
            logits = step_model(x)
            loss = F.cross_entropy(logits.view(-1, PADDED_VOCAB).float(), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
        t0 = time.perf_counter()
        loss = train_step(step)
        if step >= a.warmup:
            times.append(1000 * (time.perf_counter() - t0))  # on CUDA: the host's issue time
    sync()
    per_step = 1000 * (time.perf_counter() - start) / a.steps
    if a.profile:  # after the timing, so the profiler's cost never enters ms/step
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities, record_shapes=True) as prof:
            for i in range(a.profile_steps):
                loss = train_step(a.warmup + a.steps + i)
            sync()
        prof.export_chrome_trace(a.profile)
    how = ("compiled" if a.compile else "eager") + f" {a.preset} {a.batch}x{a.seq} {a.dtype} on {a.device}"
    if a.recompute != "none":
        how += f", recompute {a.recompute}"
    if a.sdpa != "auto":
        how += f", attention {a.sdpa}"
    tokens = a.batch * a.seq / (per_step / 1000)
    memory = f", peak memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if cuda else ""
    print(f"{how}, {a.threads} threads: {per_step:.1f} ms/step, {tokens:,.0f} tokens/s over {a.steps} steps "
          f"(median step {statistics.median(times):.1f} ms, loss {loss.item():.3f}{memory})")


if __name__ == "__main__":
    main()
