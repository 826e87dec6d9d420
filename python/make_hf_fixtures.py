#!/usr/bin/env python3
"""Tiny random-weight Hugging Face models and transformers' logits for kiln's golden tests.

Writes tests/data/hf/<name>/ (config.json, model.safetensors or shards, generation_config.json)
and tests/data/hf/<name>/logits.json: for 3 token sequences, transformers' float32 logits at every
position (eager attention, CPU), stored as base64 of little-endian float32 (exact and compact),
plus each position's argmax. Also writes tests/data/hf/llama_gqa4.gguf: the llama fixture converted
to GGUF (F32) with Q/K rows permuted the way llama.cpp's convert_hf_to_gguf.py does.

Usage:  python3 -m venv /tmp/hfenv && /tmp/hfenv/bin/pip install -r python/requirements-fixtures.txt
        /tmp/hfenv/bin/python python/make_hf_fixtures.py [--out tests/data/hf]
Deterministic for a given torch/transformers version (seeded).
"""
import argparse
import base64
import json
import os
import shutil

import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

# name -> (config kwargs, options). Each is tiny: 2 layers, hidden <= 256, vocab <= 1001.
FIXTURES = {
    # GQA 4 (4 query heads share 1 kv head), head_dim 64 given explicitly (!= hidden/heads = 32).
    "llama_gqa4": (dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=128,
                        intermediate_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                        vocab_size=128, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
                   dict(eos=2, gguf=True)),
    # Mistral-like: MHA (GQA 1), head_dim 80 (not a power of two); saved as two shards + index.
    "mistral_mha_hd80": (dict(architectures=["MistralForCausalLM"], model_type="mistral", hidden_size=160,
                              intermediate_size=64, num_attention_heads=2, num_key_value_heads=2, head_dim=80,
                              vocab_size=128, rope_theta=1000000.0, rms_norm_eps=1e-5, sliding_window=None,
                              tie_word_embeddings=False),
                         dict(eos=[2, 3], shard="400KB")),
    # Qwen2: q/k/v biases, GQA 7 (14 heads / 2 kv heads), head_dim 8.
    "qwen2_gqa7_bias": (dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=112,
                             intermediate_size=64, num_attention_heads=14, num_key_value_heads=2,
                             vocab_size=128, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                             use_sliding_window=False),
                        dict(eos=[5, 7])),
    # Llama 3.1 RoPE scaling with a tiny original context (32) so positions up to 47 go past it.
    "llama3_rope_scaling": (dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64,
                                 intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                                 vocab_size=128, rope_theta=10000.0, rms_norm_eps=1e-5,
                                 max_position_embeddings=256, tie_word_embeddings=False,
                                 rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                   high_freq_factor=4.0, original_max_position_embeddings=32)),
                            dict(eos=1)),
    # head_dim 128 with hidden 64: head_dim != hidden / heads (Qwen3/Gemma style).
    "llama_hd128": (dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64,
                         intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                         vocab_size=128, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
                    dict(eos=1)),
    # SmolLM2-like: vocabulary 1001 (not a multiple of 64), tied embeddings (no lm_head in the file).
    "llama_tied_v1001": (dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64,
                              intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                              vocab_size=1001, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
                         dict(eos=[0, 1000])),
    # BF16 weights in the file (transformers upcasts them to float32 for the reference).
    "llama_bf16": (dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64,
                        intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                        vocab_size=100, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
                   dict(eos=2, dtype="bfloat16")),
}

SEQ_LENGTHS = (5, 11, 48)


def randomize(model, seed):
    """transformers' init (std 0.02) gives near-uniform logits; spread them so argmax is decisive."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:  # (out, in) projections: unit-variance outputs for unit-variance inputs
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)


def b64_f32(a):
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode()


def make_fixture(out_dir, name, cfg_kwargs, opts, seed):
    d = os.path.join(out_dir, name)
    shutil.rmtree(d, ignore_errors=True)
    cfg_kwargs = dict(cfg_kwargs)
    model_type = cfg_kwargs.pop("model_type")
    cfg_kwargs.setdefault("max_position_embeddings", 128)
    cfg = AutoConfig.for_model(model_type, num_hidden_layers=2, **cfg_kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float()
    randomize(model, seed)
    if model.config.tie_word_embeddings:
        model.tie_weights()
    dtype = opts.get("dtype", "float32")
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    save_kwargs = {"safe_serialization": True}
    if "shard" in opts:
        save_kwargs["max_shard_size"] = opts["shard"]
    model.save_pretrained(d, **save_kwargs)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": opts["eos"]}, f, indent=2)

    # The reference: the saved directory reloaded, float32, eager attention.
    ref = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()
    vocab = cfg.vocab_size
    rng = np.random.default_rng(seed)
    cases = []
    min_gap = float("inf")
    for n in SEQ_LENGTHS:
        ids = rng.integers(0, vocab, size=n).tolist()
        ids[0] = 0
        ids[-1] = vocab - 1
        with torch.no_grad():
            logits = ref(torch.tensor([ids])).logits[0].float().numpy()  # (n, vocab)
        top2 = np.sort(logits, axis=1)[:, -2:]
        min_gap = min(min_gap, float((top2[:, 1] - top2[:, 0]).min()))
        cases.append({"ids": ids, "argmax": logits.argmax(axis=1).tolist(),
                      "logits_f32_b64": b64_f32(logits), "max_abs_logit": float(np.abs(logits).max())})
    with open(os.path.join(d, "logits.json"), "w") as f:
        json.dump({"name": name, "transformers": transformers.__version__, "torch": torch.__version__,
                   "vocab_size": vocab, "min_top2_gap": min_gap, "cases": cases}, f)
    print(f"{name}: {sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d)) / 1e3:.0f} KB, "
          f"min top-2 gap {min_gap:.3g}")
    if min_gap < 1e-3:
        print(f"  WARNING: {name} has a near-tie at some position; argmax checks may be fragile")
    return ref


def permute_qk(w, n_head):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: HF halves -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, path):
    import gguf
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("llama_gqa4")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    rope_theta = getattr(c, "rope_theta", None) or (getattr(c, "rope_parameters", None) or {}).get("rope_theta", 1e4)
    w.add_rope_freq_base(float(rope_theta))
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(c.vocab_size)
    # A minimal byte-level vocabulary of the right size (kiln's GGUF loader builds a tokenizer).
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([f"<t{i}>" for i in range(c.vocab_size)])
    w.add_token_types([1] * c.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    t = lambda name, a: w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
    t("token_embd.weight", sd["model.embed_tokens.weight"])
    for l in range(c.num_hidden_layers):
        p = f"model.layers.{l}."
        t(f"blk.{l}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        t(f"blk.{l}.attn_q.weight", permute_qk(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads))
        t(f"blk.{l}.attn_k.weight", permute_qk(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads))
        t(f"blk.{l}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        t(f"blk.{l}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        t(f"blk.{l}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        t(f"blk.{l}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        t(f"blk.{l}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        t(f"blk.{l}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    t("output_norm.weight", sd["model.norm.weight"])
    t("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{os.path.basename(path)}: {os.path.getsize(path) / 1e3:.0f} KB")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "hf"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(2)
    for i, (name, (cfg_kwargs, opts)) in enumerate(FIXTURES.items()):
        ref = make_fixture(args.out, name, cfg_kwargs, opts, seed=1000 + i)
        if opts.get("gguf"):
            write_gguf(ref, os.path.join(args.out, name + ".gguf"))
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(args.out) for f in fs)
    print(f"total {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
