#!/usr/bin/env python3
"""PyTorch / HF transformers baseline on the GPU machine, measured in the same run as kiln.

Builds a random-weight Llama-3-8B-shape model in bf16 directly on the GPU and times prefill of
512 tokens and eager decode at batch 1 (CUDA events, median), the figures GPU.md quotes for
transformers. Prints one JSON line; --json writes it to a file.
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--decode-tokens", type=int, default=32)
    args = ap.parse_args()
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
