#!/usr/bin/env python3
"""PyTorch reference for Trainyard's GPU speed comparison (issue: GPU training).

Builds the same GPT shape as a Trainyard profile (configs/*.yaml: pre-norm LayerNorm, GELU MLP,
learned positions, tied embeddings, GPT-2 init with residual projections scaled by
1/sqrt(2*n_layers), optional top-k MoE MLPs), trains it on random tokens with AdamW
(no decay on biases/norms/embeddings) and global-norm clipping, and prints one JSON line with
tokens/s, MFU and peak memory.

usage: python3 bench/torch_gpu.py --profile RUN_DIR/config.yaml (a resolved config) [--mode eager|compile]
           [--precision bf16|f32|tf32] [--batch-size 8] [--seq-len 1024] [--steps 30]
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

# Dense bf16 tensor-core peak used for MFU (vendor datasheets, no sparsity), matched in order
# against the device name; the same table as trainer/src/train/mfu.rs.
PEAK_BF16_FLOPS = {"H100 PCIe": 756.5e12, "H100 NVL": 835.5e12, "H200 NVL": 835.5e12,
                   "H200": 989.4e12, "H100": 989.4e12, "A100": 312e12}


def peak_flops(name):
    for key, value in PEAK_BF16_FLOPS.items():
        if key in name:
            return value
    return float("nan")


class Attention(nn.Module):
    def __init__(self, d, heads, bias):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(d, 3 * d, bias=bias)
        self.c_proj = nn.Linear(d, d, bias=bias)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # flash kernel on Hopper
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class Mlp(nn.Module):
    def __init__(self, d, ff, bias):
        super().__init__()
        self.c_fc = nn.Linear(d, ff, bias=bias)
        self.c_proj = nn.Linear(ff, d, bias=bias)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Moe(nn.Module):
    """Top-k softmax router; tokens grouped per expert; Switch load-balancing loss."""

    def __init__(self, d, ff, bias, experts, top_k, aux_weight):
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(Mlp(d, ff, bias) for _ in range(experts))
        self.top_k, self.aux_weight = top_k, aux_weight

    def forward(self, x):
        b, t, d = x.shape
        flat = x.view(-1, d)
        probs = F.softmax(self.router(flat).float(), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if token.numel():
                out.index_add_(0, token, expert(flat[token]) * weights[token, slot, None].to(flat.dtype))
        frac = F.one_hot(chosen, len(self.experts)).float().sum((0, 1)) / chosen.numel()
        aux = len(self.experts) * (frac * probs.mean(0)).sum() * self.aux_weight
        return out.view(b, t, d), aux


class Block(nn.Module):
    def __init__(self, m, use_moe):
        super().__init__()
        d, bias = m["d_model"], m.get("bias", True)
        self.ln_1 = nn.LayerNorm(d, bias=bias)
        self.attn = Attention(d, m["n_heads"], bias)
        self.ln_2 = nn.LayerNorm(d, bias=bias)
        moe = m.get("moe") or {}
        if use_moe:
            self.mlp = Moe(d, m["d_ff"], bias, moe.get("num_experts", 8), moe.get("top_k", 2),
                           moe.get("aux_loss_weight", 0.01))
        else:
            self.mlp = Mlp(d, m["d_ff"], bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        out = self.mlp(self.ln_2(x))
        if isinstance(out, tuple):
            return x + out[0], out[1]
        return x + out, None


class Gpt(nn.Module):
    def __init__(self, m):
        super().__init__()
        moe = m.get("moe")
        every = (moe or {}).get("every_n_layers", 1)
        self.wte = nn.Embedding(m["vocab_size"], m["d_model"])
        self.wpe = nn.Embedding(m["max_seq_len"], m["d_model"])
        self.h = nn.ModuleList(Block(m, bool(moe) and (i + 1) % every == 0) for i in range(m["n_layers"]))
        self.ln_f = nn.LayerNorm(m["d_model"], bias=m.get("bias", True))
        std = m.get("init_std", 0.02)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                scale = 1 / math.sqrt(2 * m["n_layers"]) if name.endswith("c_proj.weight") else 1.0
                nn.init.normal_(p, 0.0, std * scale)
            elif "ln" in name and name.endswith("weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        aux_total = 0.0
        for block in self.h:
            x, aux = block(x)
            if aux is not None:
                aux_total = aux_total + aux
        logits = self.ln_f(x) @ self.wte.weight.T  # tied output embedding
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1)) + aux_total


def active_params(model, m):
    """Parameters a token touches (MoE: top_k of num_experts expert MLPs), excluding wpe."""
    total = 0
    for name, p in model.named_parameters():
        if name.startswith("wpe"):
            continue
        if ".experts." in name:
            moe = m["moe"]
            total += p.numel() * moe.get("top_k", 2) / moe.get("num_experts", 8)
        else:
            total += p.numel()
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", required=True)
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--precision", choices=["bf16", "f32", "tf32"], default="bf16")
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()

    cfg = yaml.safe_load(open(args.profile))
    m, tr = cfg["model"], cfg.get("training", {})
    b = args.batch_size or tr.get("batch_size", 8)
    t = args.seq_len or tr.get("seq_len", m["max_seq_len"])
    torch.manual_seed(tr.get("seed", 1337))
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    dev = "cuda"

    model = Gpt(m).to(dev)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith(("wte", "wpe"))]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() == 2 and not n.startswith(("wte", "wpe")))]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tr.get("weight_decay", 0.1)}, {"params": no_decay, "weight_decay": 0.0}],
        lr=tr.get("learning_rate", 6e-4), betas=(tr.get("beta1", 0.9), tr.get("beta2", 0.95)), fused=True)
    step_model = torch.compile(model) if args.mode == "compile" else model
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def step():
        x = torch.randint(0, m["vocab_size"], (b, t), device=dev)
        y = torch.randint(0, m["vocab_size"], (b, t), device=dev)
        with autocast:
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tr.get("grad_clip", 1.0))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    loss.item()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start

    tokens_per_s = args.steps * b * t / elapsed
    n = active_params(model, m)
    # 6N per token for the matmuls plus the attention score/value products (nanoGPT's estimate).
    flops_per_token = 6 * n + 12 * m["n_layers"] * m["d_model"] * t
    name = torch.cuda.get_device_name()
    print(json.dumps({
        "impl": f"pytorch-{args.mode}", "profile": args.profile, "precision": args.precision,
        "device": name, "batch_size": b, "seq_len": t, "steps": args.steps,
        "tokens_per_s": round(tokens_per_s, 1),
        "mfu": round(tokens_per_s * flops_per_token / peak_flops(name), 4),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
        "final_loss": round(float(loss), 4), "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
