#!/usr/bin/env python3
"""An independent float64 forward pass of the default model, in NumPy, as a golden fixture.

kiln's CPU backend must reproduce it to fp32 rounding: unlike llama.cpp (which rounds activations
to 8 bits inside its quantized matrix products), this reference computes exactly the function
kiln's reference means to compute, from the same dequantized weights (the `gguf` package's own
dequantizer, not kiln's). Usage, from the repo root:

    .venv/bin/pip install numpy gguf
    .venv/bin/python python/make_reference_logits.py models/SmolLM2-135M-Instruct.Q4_1.gguf tests/data/golden/smollm2_numpy_fp64.json
"""
import json
import sys

import gguf
import numpy as np

PROMPT_IDS = {
    # "The capital of France is"
    "short_en": [504, 3575, 282, 4649, 314],
    # a ChatML turn with the special tokens
    "chat": [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182,
             2, 198, 1, 4093, 198, 1780, 314, 260, 16891, 1225, 282, 913, 418, 3426, 1106, 47, 2, 198, 1, 520, 9531, 198],
}
TOP = 32


def load(path):
    r = gguf.GGUFReader(path)
    f = {k: v for k, v in r.fields.items()}
    arch = f["general.architecture"].contents()
    cfg = {k: f[f"{arch}.{k}"].contents() for k in ["embedding_length", "block_count", "attention.head_count",
                                                    "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
                                                    "rope.freq_base"]}
    weights = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
               .reshape([int(x) for x in reversed(t.shape)]) for t in r.tensors}
    return cfg, weights


def forward(cfg, W, ids):
    hidden, n_layers = cfg["embedding_length"], cfg["block_count"]
    n_heads, n_kv = cfg["attention.head_count"], cfg["attention.head_count_kv"]
    eps, theta = cfg["attention.layer_norm_rms_epsilon"], cfg["rope.freq_base"]
    hd = hidden // n_heads
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rope(x):  # GGUF llama: Q/K rows permuted so that pairs (2i, 2i+1) rotate together
        inv = theta ** (-np.arange(0, hd, 2) / hd)
        ang = pos[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2].copy(), x[..., 1::2].copy()
        y = x.copy()
        y[..., 0::2], y[..., 1::2] = x0 * c - x1 * s, x0 * s + x1 * c
        return y

    x = W["token_embd.weight"][ids]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for layer in range(n_layers):
        p = f"blk.{layer}."
        h = rms(x, W[p + "attn_norm.weight"])
        q = rope((h @ W[p + "attn_q.weight"].T).reshape(n, n_heads, hd))
        k = rope((h @ W[p + "attn_k.weight"].T).reshape(n, n_kv, hd))
        v = (h @ W[p + "attn_v.weight"].T).reshape(n, n_kv, hd)
        out = np.zeros((n, n_heads, hd))
        for head in range(n_heads):
            kv = head // (n_heads // n_kv)
            s = q[:, head, :] @ k[:, kv, :].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(1, keepdims=True))
            out[:, head, :] = (s / s.sum(1, keepdims=True)) @ v[:, kv, :]
        x = x + out.reshape(n, -1) @ W[p + "attn_output.weight"].T
        h = rms(x, W[p + "ffn_norm.weight"])
        g, u = h @ W[p + "ffn_gate.weight"].T, h @ W[p + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "ffn_down.weight"].T
    head_w = W.get("output.weight", W["token_embd.weight"])
    return rms(x, W["output_norm.weight"]) @ head_w.T


def main(model_path, out_path):
    cfg, W = load(model_path)
    rng = np.random.default_rng(0)
    cases = []
    for name, ids in PROMPT_IDS.items():
        logits = forward(cfg, W, ids)
        probe = np.sort(rng.choice(logits.shape[1], TOP, replace=False))
        top = np.argsort(-logits, axis=1)[:, :TOP]
        idx = np.concatenate([top, np.broadcast_to(probe, (len(ids), TOP))], axis=1)
        cases.append({"name": name, "ids": ids, "probe_ids": idx.tolist(),
                      "probe_logits": np.take_along_axis(logits, idx, 1).round(6).tolist()})
    json.dump({"generator": "python/make_reference_logits.py", "cases": cases}, open(out_path, "w"),
              separators=(",", ":"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
