#!/usr/bin/env python3
"""PyTorch eager CPU training of the `tiny-hybrid` profile, for comparison with
`trainer/benches/hybrid_speed.rs` (the trainer running that profile as it is).

The same layers and shapes: vocab 256, d_model 64, context 64, batch 8, learned positions,
tied embeddings, RMSNorm (no biases anywhere), tanh-GELU MLPs with d_ff 256, and the blocks
MF ME AF ME: Mamba-2 + dense MLP, Mamba-2 + MoE, attention (4 heads) + dense MLP, Mamba-2 +
MoE. Mamba-2: expand 2, head_dim 16, d_state 16, d_conv 4, chunk 32, computed with the same
chunked scan as the trainer (masked quadratic form within chunks, states passed between
chunks). MoE: 4 experts, top-2, with the load-balancing (0.01) and z (0.001) losses. AdamW
(betas 0.9/0.95, weight decay 0.1 on matrices only), global-norm clipping at 1.0, f32.

Prints one JSON line with tokens/s. Usage:
    python3 bench/torch_hybrid.py [--threads 2] [--steps 20] [--warmup 3]
"""

import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, D, CONTEXT, BATCH, HEADS, D_FF = 256, 64, 64, 8, 4, 256
PATTERN = [("M", "F"), ("M", "E"), ("A", "F"), ("M", "E")]
EXPAND, HEAD_DIM, D_STATE, D_CONV, CHUNK = 2, 16, 16, 4, 32
EXPERTS, TOP_K, AUX_W, Z_W = 4, 2, 0.01, 0.001
EPS = 1e-5


class RmsNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D, bias=False)
        self.proj = nn.Linear(D, D, bias=False)
        self.proj.residual = True

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D_FF, bias=False)
        self.proj = nn.Linear(D_FF, D, bias=False)
        self.proj.residual = True

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Moe(nn.Module):
    """Top-k token routing over dense experts, dispatched by index (no capacity limit)."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(D, EXPERTS, bias=False)
        self.experts = nn.ModuleList(Mlp() for _ in range(EXPERTS))

    def forward(self, x):
        b, t, c = x.shape
        flat = x.reshape(-1, c)
        logits = self.router(flat)
        probs = logits.softmax(dim=-1)
        weights, chosen = probs.topk(TOP_K, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel() > 0:
                out.index_add_(0, rows, expert(flat[rows]) * weights[rows, slot, None])
        frac = F.one_hot(chosen, EXPERTS).float().sum(dim=(0, 1)) / (flat.shape[0] * TOP_K)
        aux = EXPERTS * (frac * probs.mean(dim=0)).sum()
        z = torch.logsumexp(logits, dim=-1).pow(2).mean()
        return out.view(b, t, c), AUX_W * aux + Z_W * z


def ssd_chunked(x, dt, a, bm, cm):
    """x (B,T,H,P), dt (B,T,H), a (H,), bm/cm (B,T,N) -> y (B,T,H,P); the trainer's algorithm."""
    bs, t, h, p = x.shape
    n = bm.shape[-1]
    l = min(CHUNK, t)
    nc = -(-t // l)
    pad = nc * l - t
    if pad:
        x, dt, bm, cm = (F.pad(v, (0, 0) * (v.dim() - 2) + (0, pad)) for v in (x, dt, bm, cm))
    xc = x.view(bs, nc, l, h, p).permute(0, 1, 3, 2, 4)  # (B,c,H,L,P)
    dtc = dt.view(bs, nc, l, h).permute(0, 1, 3, 2)  # (B,c,H,L)
    bc, cc = bm.view(bs, nc, l, n), cm.view(bs, nc, l, n)
    cum = torch.cumsum(dtc * a.view(1, 1, h, 1), dim=-1)  # (B,c,H,L)
    causal = torch.full((l, l), float("-inf")).triu(1)
    decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2) + causal).exp()  # (B,c,H,L,L)
    scores = cc @ bc.transpose(-1, -2)  # (B,c,L,L)
    y_diag = (decay * scores.unsqueeze(2) * dtc.unsqueeze(3)) @ xc
    last = cum[..., -1:]
    to_end = (last - cum).exp() * dtc
    local = (xc * to_end.unsqueeze(-1)).transpose(3, 4).reshape(bs, nc, h * p, l) @ bc
    local = local.view(bs, nc, h, p, n)
    chunk_decay = last.squeeze(-1).exp()  # (B,c,H)
    state = torch.zeros(bs, h, p, n)
    entering = []
    for k in range(nc):
        entering.append(state)
        state = state * chunk_decay[:, k].view(bs, h, 1, 1) + local[:, k]
    entering = torch.stack(entering, 1)
    y_off = (entering.view(bs, nc, h * p, n) @ cc.transpose(-1, -2)).view(bs, nc, h, p, l)
    y_off = (y_off * cum.exp().unsqueeze(3)).transpose(3, 4)
    y = (y_diag + y_off).permute(0, 1, 3, 2, 4).reshape(bs, nc * l, h, p)
    return y[:, :t]


class Mamba2(nn.Module):
    def __init__(self):
        super().__init__()
        self.di = EXPAND * D
        self.h = self.di // HEAD_DIM
        conv_dim = self.di + 2 * D_STATE
        self.in_proj = nn.Linear(D, 2 * self.di + 2 * D_STATE + self.h, bias=False)
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, D_CONV, groups=conv_dim, padding=D_CONV - 1)
        dt = torch.exp(torch.rand(self.h) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.h).uniform_(1, 16)))
        self.D = nn.Parameter(torch.ones(self.h))
        self.norm = RmsNorm(self.di)
        self.out_proj = nn.Linear(self.di, D, bias=False)
        self.out_proj.residual = True

    def forward(self, u):
        b, t, _ = u.shape
        di, n, h = self.di, D_STATE, self.h
        z, xbc, dt = self.in_proj(u).split([di, di + 2 * n, h], dim=-1)
        xbc = F.silu(self.conv1d(xbc.transpose(1, 2))[..., :t].transpose(1, 2))
        x, bm, cm = xbc.split([di, n, n], dim=-1)
        x = x.reshape(b, t, h, HEAD_DIM)
        dt = F.softplus(dt + self.dt_bias)
        y = ssd_chunked(x, dt, -torch.exp(self.A_log), bm, cm) + x * self.D.view(1, 1, h, 1)
        y = self.norm(y.reshape(b, t, di) * F.silu(z))
        return self.out_proj(y)


class Block(nn.Module):
    def __init__(self, mixer, mlp):
        super().__init__()
        self.ln_1 = RmsNorm(D)
        self.mixer = Mamba2() if mixer == "M" else Attention()
        self.ln_2 = RmsNorm(D)
        self.mlp = Moe() if mlp == "E" else Mlp()

    def forward(self, x):
        x = x + self.mixer(self.ln_1(x))
        h = self.mlp(self.ln_2(x))
        if isinstance(h, tuple):
            return x + h[0], h[1]
        return x + h, None


class Hybrid(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D)
        self.wpe = nn.Embedding(CONTEXT, D)
        self.blocks = nn.ModuleList(Block(m, f) for m, f in PATTERN)
        self.ln_f = RmsNorm(D)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            std = 0.02 / math.sqrt(2 * len(PATTERN)) if getattr(m, "residual", False) else 0.02
            nn.init.normal_(m.weight, 0.0, std)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, targets):
        b, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t))
        aux_total = 0.0
        for block in self.blocks:
            x, aux = block(x)
            if aux is not None:
                aux_total = aux_total + aux
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied output embedding
        return F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1)) + aux_total


def optimizer(model):
    """AdamW; decay on matrices only (not embeddings, norms, biases, A_log, D, dt_bias)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        is_embedding = name.startswith("wte") or name.startswith("wpe")
        (decay if p.dim() >= 2 and not is_embedding else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95), eps=1e-8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    model = Hybrid()
    opt = optimizer(model)
    data = torch.randint(0, VOCAB, (args.warmup + args.steps, BATCH, CONTEXT + 1))
    xs, ys = data[..., :-1].contiguous(), data[..., 1:].contiguous()

    def step(i):
        loss = model(xs[i], ys[i])
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
                "shape": "tiny-hybrid",
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
