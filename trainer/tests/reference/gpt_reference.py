"""Independent NumPy implementation of the Trainyard GPT forward pass and loss, for the
numeric check in tests/gpt_reference.rs. Run: python3 gpt_reference.py

Weights follow a fixed formula (no RNG) over the parameters in sorted-name order:
  t = index of the tensor in sorted order, j = flat index inside it
  bias:          0.05 * cos(0.9 * j + t)
  norm gain:     1 + 0.1 * sin(1.1 * j + t)
  anything else: 0.2 * sin(0.37 * j + 0.5 * t + 0.1)
Tokens: idx[b, s] = (3 + 7 * (b*T + s)) % V, targets[b, s] = (1 + 5 * (b*T + s)) % V.
"""
import math
import numpy as np

V, D, L, H, F, MAXT, B, T = 11, 8, 2, 2, 16, 8, 2, 6
HD = D // H
EPS = 1e-5


def shapes(variant):
    learned, bias, tied, swiglu = variant == "a", variant == "a", variant == "a", variant == "b"
    s = {"wte.weight": (V, D)}
    if learned:
        s["wpe.weight"] = (MAXT, D)
    if not tied:
        s["lm_head.weight"] = (V, D)
    lin = {"attn.c_attn": (3 * D, D), "attn.c_proj": (D, D),
           "mlp.c_fc": ((2 if swiglu else 1) * F, D), "mlp.c_proj": (D, F)}
    for i in range(L):
        for name, shp in lin.items():
            s[f"h.{i}.{name}.weight"] = shp
            if bias:
                s[f"h.{i}.{name}.bias"] = (shp[0],)
        for n in ("ln_1", "ln_2"):
            s[f"h.{i}.{n}.weight"] = (D,)
            if bias:
                s[f"h.{i}.{n}.bias"] = (D,)
    s["ln_f.weight"] = (D,)
    if bias:
        s["ln_f.bias"] = (D,)
    return s


def weights(variant):
    w = {}
    for t, name in enumerate(sorted(shapes(variant))):
        shp = shapes(variant)[name]
        j = np.arange(int(np.prod(shp)), dtype=np.float64)
        if name.endswith(".bias"):
            v = 0.05 * np.cos(0.9 * j + t)
        elif any(p.startswith("ln_") for p in name.split(".")):
            v = 1 + 0.1 * np.sin(1.1 * j + t)
        else:
            v = 0.2 * np.sin(0.37 * j + 0.5 * t + 0.1)
        w[name] = v.reshape(shp)
    return w


def linear(w, name, x):
    y = x @ w[name + ".weight"].T
    return y + w[name + ".bias"] if name + ".bias" in w else y


def norm(w, name, x, variant):
    if variant == "a":
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + EPS) * w[name + ".weight"] + w[name + ".bias"]
    ms = (x ** 2).mean(-1, keepdims=True)
    return x / np.sqrt(ms + EPS) * w[name + ".weight"]


def rope(x):  # x (B, H, T, HD), rotate-half convention
    half = HD // 2
    freq = 10000.0 ** (-2.0 * np.arange(half) / HD)
    ang = np.arange(T)[:, None] * freq[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(variant):
    w = weights(variant)
    n = np.arange(B * T).reshape(B, T)
    idx, tgt = (3 + 7 * n) % V, (1 + 5 * n) % V
    x = w["wte.weight"][idx]
    if variant == "a":
        x = x + w["wpe.weight"][:T]
    for i in range(L):
        h = norm(w, f"h.{i}.ln_1", x, variant)
        qkv = linear(w, f"h.{i}.attn.c_attn", h).reshape(B, T, 3, H, HD).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if variant == "b":
            q, k = rope(q), rope(k)
        att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(HD)
        att = np.where(np.tril(np.ones((T, T))) == 1, att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
        x = x + linear(w, f"h.{i}.attn.c_proj", y)
        h = linear(w, f"h.{i}.mlp.c_fc", norm(w, f"h.{i}.ln_2", x, variant))
        if variant == "a":
            h = gelu_tanh(h)
        else:
            gate, up = h[..., :F], h[..., F:]
            h = gate / (1 + np.exp(-gate)) * up
        x = x + linear(w, f"h.{i}.mlp.c_proj", h)
    x = norm(w, "ln_f", x, variant)
    head = w["wte.weight"] if variant == "a" else w["lm_head.weight"]
    logits = x @ head.T
    m = logits.max(-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    loss = -np.take_along_axis(logp, tgt[..., None], -1).mean()
    return loss, logits


for variant in ("a", "b"):
    loss, logits = forward(variant)
    print(f"variant {variant}: loss = {loss!r}")
    print(f"  logits[0,0,:3] = {[float(v) for v in logits[0, 0, :3]]}")
    print(f"  logits[1,5,-3:] = {[float(v) for v in logits[1, 5, -3:]]}")
