"""Independent NumPy forward pass of a Hugging Face checkpoint directory, for trainer/tests/hf.rs.

Reads config.json and model.safetensors (through the `safetensors` package, as `transformers`
does) and computes the logits of the token ids given on the command line the way
`transformers` defines GPT2LMHeadModel, LlamaForCausalLM and MixtralForCausalLM: GPT-2's Conv1D
weights stored (in, out), Llama's rotate-half RoPE, Mixtral's softmax-top-k-renormalized router.
It shares no code with the trainer.

usage: python hf_forward.py DIR ID [ID ...]      prints {"logits": [[...], ...]} (T rows of V)
"""
import json
import math
import sys

import numpy as np
from safetensors import safe_open


def load(path):
    with safe_open(path, framework="np") as f:
        meta = f.metadata() or {}
        if meta.get("format") != "pt":
            raise SystemExit(f"{path}: metadata format is {meta.get('format')!r}, transformers wants 'pt'")
        return {k: f.get_tensor(k).astype(np.float64) for k in f.keys()}


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def attention(q, k, v):  # (H, T, hd) each
    t, hd = q.shape[1], q.shape[2]
    att = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
    att = np.where(np.tril(np.ones((t, t))) == 1, att, -np.inf)
    return softmax(att) @ v  # (H, T, hd)


def gpt2(c, w, ids):
    d, h = c["n_embd"], c["n_head"]
    eps = c.get("layer_norm_epsilon", 1e-5)
    g = lambda n: w[n] if n in w else w[n.removeprefix("transformer.")]

    def ln(x, n):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * g(n + ".weight") + g(n + ".bias")

    def conv1d(x, n):  # Conv1D: y = x @ W + b with W (in, out)
        return x @ g(n + ".weight") + g(n + ".bias")

    t = len(ids)
    x = g("transformer.wte.weight")[ids] + g("transformer.wpe.weight")[:t]
    for i in range(c["n_layer"]):
        p = f"transformer.h.{i}"
        qkv = conv1d(ln(x, p + ".ln_1"), p + ".attn.c_attn")
        q, k, v = (qkv[:, j * d:(j + 1) * d].reshape(t, h, d // h).transpose(1, 0, 2) for j in range(3))
        y = attention(q, k, v).transpose(1, 0, 2).reshape(t, d)
        x = x + conv1d(y, p + ".attn.c_proj")
        m = conv1d(ln(x, p + ".ln_2"), p + ".mlp.c_fc")
        m = 0.5 * m * (1 + np.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m ** 3)))  # gelu_new
        x = x + conv1d(m, p + ".mlp.c_proj")
    x = ln(x, "transformer.ln_f")
    head = w["lm_head.weight"] if not c.get("tie_word_embeddings", True) else g("transformer.wte.weight")
    return x @ head.T


def llama(c, w, ids):
    d, h = c["hidden_size"], c["num_attention_heads"]
    hd, eps, theta = d // h, c.get("rms_norm_eps", 1e-6), c.get("rope_theta", 10000.0)
    t = len(ids)
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    ang = np.arange(t)[:, None] * inv[None, :]
    cos, sin = np.concatenate([np.cos(ang)] * 2, -1), np.concatenate([np.sin(ang)] * 2, -1)

    def rope(x):  # (H, T, hd): x·cos + rotate_half(x)·sin
        rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * cos + rot * sin

    def rms(x, n):
        return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w[n + ".weight"]

    def lin(x, n):
        y = x @ w[n + ".weight"].T
        return y + w[n + ".bias"] if n + ".bias" in w else y

    silu = lambda z: z / (1 + np.exp(-z))
    x = w["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        a = rms(x, p + ".input_layernorm")
        heads = lambda n: lin(a, f"{p}.self_attn.{n}").reshape(t, h, hd).transpose(1, 0, 2)
        y = attention(rope(heads("q_proj")), rope(heads("k_proj")), heads("v_proj"))
        x = x + lin(y.transpose(1, 0, 2).reshape(t, d), p + ".self_attn.o_proj")
        a = rms(x, p + ".post_attention_layernorm")
        if c["model_type"] == "mixtral":
            m = p + ".block_sparse_moe"
            probs = softmax(a @ w[m + ".gate.weight"].T)  # (T, E)
            k = c["num_experts_per_tok"]
            out = np.zeros_like(a)
            for s in range(t):
                top = np.argsort(-probs[s], kind="stable")[:k]
                gates = probs[s, top] / probs[s, top].sum()
                for e, gate in zip(top, gates):
                    ex = f"{m}.experts.{e}"
                    hid = silu(a[s] @ w[ex + ".w1.weight"].T) * (a[s] @ w[ex + ".w3.weight"].T)
                    out[s] += gate * (hid @ w[ex + ".w2.weight"].T)
            x = x + out
        else:
            hid = silu(lin(a, p + ".mlp.gate_proj")) * lin(a, p + ".mlp.up_proj")
            x = x + lin(hid, p + ".mlp.down_proj")
    x = rms(x, "model.norm")
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
    return x @ head.T


def main():
    d, ids = sys.argv[1], [int(a) for a in sys.argv[2:]]
    with open(f"{d}/config.json") as f:
        c = json.load(f)
    w = load(f"{d}/model.safetensors")
    forward = gpt2 if c["model_type"] == "gpt2" else llama
    logits = forward(c, w, np.array(ids))
    print(json.dumps({"architecture": c["architectures"][0], "logits": logits.tolist()}))


main()
