#!/usr/bin/env python3
"""Reference GPT-2 in PyTorch for the C++ parity test (tests/test_model.cpp).

Builds the `tiny` preset (2 layers, 2 heads, 64 wide, context 64) with a 100-token vocabulary
padded to 128, so the file stays small and the padding path is exercised. From a fixed seed and
batch it records the initial weights, the logits, the loss and the gradients of one
forward/backward pass, then the losses of 10 AdamW steps (weight decay on tensors with dim >= 2
only, gradient clipping at 1.0), exactly as model/ does them.

Output: tests/data/gpt2_tiny_reference.bin (committed). Regenerate with
    $HOME/.cache/pipeline/torch-2.11.0/bin/python tools/gpt2_reference.py [OUT]

File format, little-endian, version 1:
    magic b"GPT2REF\\0", u32 version, u32 tensor count, then per tensor:
    u32 name length, name (utf-8), u32 dtype (0 float32, 1 int64, 2 float64), u32 ndim,
    i64 dims[ndim], raw contiguous data.
Tensors: config (int64: n_layer n_head n_embd block_size vocab_size padded_vocab_size B T),
    adamw (float64: lr beta1 beta2 eps weight_decay grad_clip), idx, targets, logits, loss,
    param/<name>, grad/<name> (names as in model/net/gpt2.h), losses (the 10 step losses).
"""
import math
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

MAGIC = b"GPT2REF\0"
VERSION = 1

N_LAYER, N_HEAD, N_EMBD, BLOCK_SIZE = 2, 2, 64, 64
VOCAB, PADDED_VOCAB = 100, 128
BATCH, SEQ = 2, 32
SEED = 1234
LR, BETA1, BETA2, EPS, WEIGHT_DECAY, GRAD_CLIP = 1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0
STEPS = 10


class LayerNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(N_EMBD, 4 * N_EMBD)
        self.c_proj = nn.Linear(4 * N_EMBD, N_EMBD)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = LayerNorm(N_EMBD)
        self.attn = Attention()
        self.ln_2 = LayerNorm(N_EMBD)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(PADDED_VOCAB, N_EMBD)
        self.wpe = nn.Embedding(BLOCK_SIZE, N_EMBD)
        self.h = nn.ModuleList(Block() for _ in range(N_LAYER))
        self.ln_f = LayerNorm(N_EMBD)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * N_LAYER) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1])
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head

    @staticmethod
    def loss(logits, targets):
        # Padded columns are sliced off, as GPT::loss does in C++.
        return F.cross_entropy(logits[..., :VOCAB].reshape(-1, VOCAB), targets.reshape(-1))


def write_tensor(f, name, t):
    t = t.detach().contiguous()
    code = {torch.float32: 0, torch.int64: 1, torch.float64: 2}[t.dtype]
    raw = name.encode()
    f.write(struct.pack("<I", len(raw)) + raw + struct.pack("<II", code, t.dim()))
    f.write(struct.pack(f"<{t.dim()}q", *t.shape))
    f.write(t.numpy().tobytes())


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "data", "gpt2_tiny_reference.bin")
    torch.manual_seed(SEED)
    model = GPT()
    idx = torch.randint(0, VOCAB, (BATCH, SEQ))
    targets = torch.randint(0, VOCAB, (BATCH, SEQ))
    tensors = [
        ("config", torch.tensor([N_LAYER, N_HEAD, N_EMBD, BLOCK_SIZE, VOCAB, PADDED_VOCAB, BATCH, SEQ])),
        ("adamw", torch.tensor([LR, BETA1, BETA2, EPS, WEIGHT_DECAY, GRAD_CLIP], dtype=torch.float64)),
        ("idx", idx),
        ("targets", targets),
    ]
    tensors += [("param/" + n, p.detach().clone()) for n, p in model.named_parameters()]

    logits = model(idx)
    loss = GPT.loss(logits, targets)
    loss.backward()
    tensors += [("logits", logits), ("loss", loss)]
    tensors += [("grad/" + n, p.grad.clone()) for n, p in model.named_parameters()]
    model.zero_grad(set_to_none=True)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LR, betas=(BETA1, BETA2), eps=EPS, foreach=False, fused=False)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = GPT.loss(model(idx), targets)
        losses.append(loss.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
    tensors.append(("losses", torch.tensor(losses, dtype=torch.float32)))

    with open(out, "wb") as f:
        f.write(MAGIC + struct.pack("<II", VERSION, len(tensors)))
        for name, t in tensors:
            write_tensor(f, name, t)
    print(f"wrote {out}: {len(tensors)} tensors, loss {tensors[-1][1][0]:.6f} -> {losses[-1]:.6f}")


if __name__ == "__main__":
    main()
