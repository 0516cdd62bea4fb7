#!/usr/bin/env python3
"""PyTorch eager CPU training of the benchmark GPT shape, for comparison with Trainyard's trainer.

Same model as `trainer/benches/train_speed.rs`: vocab 256, d_model 128, 4 layers, 4 heads,
d_ff 512, context 128, batch 16, f32, tanh-GELU MLP, LayerNorm with bias, learned positions,
tied embeddings, GPT-2 init (std 0.02, residual projections std 0.02/sqrt(2*layers)), AdamW
(betas 0.9/0.95, weight decay 0.1 on matrices only), global-norm clipping at 1.0.

Prints one JSON line with tokens/s. Usage:
    python3 bench/torch_gpt.py [--threads 2] [--steps 30] [--warmup 5] [--attention sdpa|manual]
        [--moe]    # 8 experts, top-2, in every block
"""

import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, D_MODEL, LAYERS, HEADS, D_FF, CONTEXT, BATCH = 256, 128, 4, 4, 512, 128, 16
EXPERTS, TOP_K = 8, 2


class Attention(nn.Module):
    def __init__(self, manual):
        super().__init__()
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.proj.residual = True
        self.manual = manual
        self.register_buffer("mask", torch.tril(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool)))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(D_MODEL, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        if self.manual:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(c // HEADS)
            att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
            y = att @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D_MODEL, D_FF)
        self.proj = nn.Linear(D_FF, D_MODEL)
        self.proj.residual = True

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Moe(nn.Module):
    """Top-k token routing over dense experts, dispatched by index (no capacity limit)."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(D_MODEL, EXPERTS, bias=False)
        self.experts = nn.ModuleList(Mlp() for _ in range(EXPERTS))

    def forward(self, x):
        b, t, c = x.shape
        flat = x.reshape(-1, c)
        probs = self.router(flat).softmax(dim=-1)
        weights, chosen = probs.topk(TOP_K, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel() > 0:
                out.index_add_(0, rows, expert(flat[rows]) * weights[rows, slot, None])
        # Switch load-balancing loss, as the Rust model adds it.
        frac = F.one_hot(chosen, EXPERTS).float().sum(dim=(0, 1)) / (flat.shape[0] * TOP_K)
        aux = EXPERTS * (frac * probs.mean(dim=0)).sum()
        return out.view(b, t, c), aux


class Block(nn.Module):
    def __init__(self, manual, moe):
        super().__init__()
        self.ln1 = nn.LayerNorm(D_MODEL)
        self.attn = Attention(manual)
        self.ln2 = nn.LayerNorm(D_MODEL)
        self.mlp = Moe() if moe else Mlp()

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        h = self.mlp(self.ln2(x))
        if isinstance(h, tuple):
            return x + h[0], h[1]
        return x + h, None


class Gpt(nn.Module):
    def __init__(self, manual, moe):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D_MODEL)
        self.wpe = nn.Embedding(CONTEXT, D_MODEL)
        self.blocks = nn.ModuleList(Block(manual, moe) for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            std = 0.02 / math.sqrt(2 * LAYERS) if getattr(m, "residual", False) else 0.02
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, targets):
        b, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t))
        aux_total = 0.0
        for block in self.blocks:
            x, aux = block(x)
            if aux is not None:
                aux_total = aux_total + 0.01 * aux
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied output embedding
        return F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1)) + aux_total


def optimizer(model):
    """AdamW; no decay on biases, norms and embeddings (as Trainyard's is_decayed)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        is_embedding = name.startswith("wte") or name.startswith("wpe")
        (decay if p.dim() >= 2 and not is_embedding else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95), eps=1e-8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--attention", choices=["sdpa", "manual"], default="sdpa")
    ap.add_argument("--moe", action="store_true")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    model = Gpt(args.attention == "manual", args.moe)
    opt = optimizer(model)
    data = torch.randint(0, VOCAB, (args.warmup + args.steps, BATCH, CONTEXT + 1))
    xs, ys = data[..., :-1].contiguous(), data[..., 1:].contiguous()

    def step(i):
        x, y = xs[i], ys[i]
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    for i in range(args.warmup):
        step(i)
    start = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        loss = step(i)
    elapsed = time.perf_counter() - start
    tokens = args.steps * BATCH * CONTEXT
    print(
        json.dumps(
            {
                "impl": "pytorch",
                "torch": torch.__version__,
                "shape": "moe" if args.moe else "dense",
                "attention": args.attention,
                "threads": torch.get_num_threads(),
                "params": sum(p.numel() for p in model.parameters()),
                "steps": args.steps,
                "step_ms": round(1000 * elapsed / args.steps, 2),
                "tokens_per_s": round(tokens / elapsed, 1),
                "final_loss": round(loss, 4),
            }
        )
    )


if __name__ == "__main__":
    main()
