#!/usr/bin/env python3
"""PyTorch / HF transformers baseline on the GPU machine, measured in the same run as kiln.

Builds a random-weight Llama-3-8B-shape model in bf16 directly on the GPU and times prefill of
512 tokens and eager decode at batch 1 (CUDA events, median), the figures GPU.md quotes for
transformers. Prints one JSON line; --json writes it to a file.

--sdpa: instead, PyTorch's scaled_dot_product_attention on the shapes of kiln's kernel lab (32 query
/ 8 KV heads, d 128, bf16): causal prefill at 4k and 16k tokens on the flash and cuDNN backends
(TFLOP/s counted as FlashAttention does: 4 S^2 H d / 2), and one-token decode at b=1 L=32k,
b=64 L=2k and b=1 L=8k (GB/s on the K/V bytes), each backend that accepts the shape. GQA through
enable_gqa=True where a backend takes it; otherwise K/V are expanded to 32 heads before timing
(marked "expanded": the timed kernel then reads 4x the K/V bytes the GB/s column counts).
"""
import argparse
import json
import statistics
import sys

import torch


def timed(fn, reps):
    times = []
    for i in range(reps + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        if i:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def sdpa_baseline():
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "sdpa": []}
    H, KVH, D = 32, 8, 128
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}

    def run_case(kind, shape, q, k, v, causal, work, unit):
        for name, be in backends.items():
            for gqa in (True, False):
                kk, vv = (k, v) if gqa else (k.repeat_interleave(H // KVH, 1), v.repeat_interleave(H // KVH, 1))
                fn = lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, enable_gqa=gqa)
                try:
                    with sdpa_kernel([be]):
                        fn()
                        torch.cuda.synchronize()
                        ms = timed(fn, 20 if kind == "prefill" else 50)
                except Exception as e:  # this backend does not take the shape (or GQA)
                    err = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
                    if not gqa:
                        out["sdpa"].append({"kind": kind, "shape": shape, "backend": name, "error": err})
                        print(f"{kind:8} {shape:22} {name:9} unsupported: {err}", flush=True)
                    continue
                rate = work / (ms * 1e-3) / (1e12 if unit == "TFLOP/s" else 1e9)
                rec = {"kind": kind, "shape": shape, "backend": name, "gqa": "native" if gqa else "expanded",
                       "us": ms * 1e3, unit: rate}
                out["sdpa"].append(rec)
                print(f"{kind:8} {shape:22} {name:9} {rec['gqa']:8} {ms * 1e3:10.1f} us {rate:8.1f} {unit}", flush=True)
                break

    torch.manual_seed(0)
    for n in (4096, 16384):
        q = torch.randn(1, H, n, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, KVH, n, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, KVH, n, D, device="cuda", dtype=torch.bfloat16)
        run_case("prefill", f"causal {n}", q, k, v, True, 4.0 * n * n / 2 * H * D, "TFLOP/s")
        del q, k, v
    for b, L in ((1, 32768), (64, 2048), (1, 8192)):
        q = torch.randn(b, H, 1, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, KVH, L, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, KVH, L, D, device="cuda", dtype=torch.bfloat16)
        run_case("decode", f"b={b} L={L}", q, k, v, False, 2.0 * b * L * KVH * D * 2, "GB/s")
        del q, k, v
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--sdpa", action="store_true", help="only PyTorch SDPA on the attention shapes")
    args = ap.parse_args()
    if args.sdpa:
        out = sdpa_baseline()
        print(json.dumps(out))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
        return 0
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0, max_position_embeddings=8192,
                      torch_dtype=torch.bfloat16)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    with torch.no_grad():
        ids = torch.randint(0, cfg.vocab_size, (1, 512), device="cuda")
        out["hf_prefill512_ms"] = timed(lambda: model(ids, use_cache=False), 5)

        def decode():
            past = None
            tok = ids[:, :1]
            for _ in range(args.decode_tokens):
                o = model(tok, past_key_values=past, use_cache=True)
                past = o.past_key_values
                tok = o.logits[:, -1:].argmax(-1)

        ms = timed(decode, 2)
        out["hf_eager_decode_tok_s"] = args.decode_tokens / (ms / 1e3)
        # cuBLAS GEMV (torch.matmul at M=1) on the same shapes kiln's lab measures.
        for name, (n, k) in {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                             "down": (4096, 14336), "lm_head": (128256, 4096)}.items():
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(max(1, 400_000_000 // (n * k * 2)))]
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            it = iter(range(10**9))
            ms = timed(lambda: [x @ w.T for w in ws], 10) / len(ws)
            out[f"torch_gemv_{name}_us"] = ms * 1e3
            out[f"torch_gemv_{name}_gbs"] = n * k * 2 / (ms * 1e-3) / 1e9
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
