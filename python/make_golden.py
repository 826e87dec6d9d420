#!/usr/bin/env python3
"""Records llama.cpp's view of the default model as golden fixtures for kiln's tests.

For each prompt: llama.cpp's token ids, the top-k logits at every position, and a 64-token greedy
continuation. Run from the repo root after scripts/fetch_model.sh:

    python3 -m venv .venv && .venv/bin/pip install numpy llama-cpp-python
    .venv/bin/python python/make_golden.py models/SmolLM2-135M-Instruct.Q4_1.gguf tests/data/golden/smollm2_llamacpp.json
"""
import hashlib
import json
import sys

import llama_cpp
import numpy as np

TOP_K = 16
GREEDY_TOKENS = 64

LONG_TEXT = " ".join([
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined",
    "movable metal type, oil-based inks and a wooden press adapted from those used to make wine.",
    "Within fifty years presses were running in more than two hundred European cities, and the price of",
    "books fell so far that ordinary merchants could own a small library. Scholars argue about how much",
    "of the Reformation, the scientific revolution and the rise of vernacular literature can be traced",
    "to this single technology, but few doubt that it changed how ideas travelled.",
] * 6)

CODE = '''def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    seq = [0, 1]
    while len(seq) < n:
        seq.append(seq[-1] + seq[-2])
    return seq[:n]


if __name__ == "__main__":
    print(fibonacci(10))  # [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]
'''

PROMPTS = [
    ("short_en", "The capital of France is", False),
    ("long_en", LONG_TEXT, False),
    ("code_python", CODE, False),
    ("french", "Il était une fois, dans un petit village au bord de la mer, une vieille femme qui", False),
    ("chinese", "人工智能是计算机科学的一个分支，它试图理解智能的本质，并", False),
    ("russian_emoji", "Привет, мир! 🌍 Сегодня мы поговорим о том, как", False),
    ("numbers_whitespace", "Order #12345 shipped on 2024-03-07:\n\t- 3 x widgets @ $19.99\n\t- 12 x gadgets   @ $4.50\nTotal:", False),
    ("chat", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
             "<|im_start|>user\nWhat is the boiling point of water at sea level?<|im_end|>\n<|im_start|>assistant\n", True),
    ("chat_multiturn", "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n<|im_start|>user\nName a prime number.<|im_end|>\n"
                       "<|im_start|>assistant\n7<|im_end|>\n<|im_start|>user\nAnother one, larger than 100.<|im_end|>\n<|im_start|>assistant\n", True),
]


def main(model_path: str, out_path: str) -> None:
    sha = hashlib.sha256(open(model_path, "rb").read()).hexdigest()
    # An fp32 KV cache and no flash attention (whose CPU path accumulates V in fp16) keep llama.cpp's
    # own rounding to what its quantized matrix products need; kiln computes in fp32 throughout.
    llm = llama_cpp.Llama(model_path=model_path, n_ctx=2048, n_batch=2048, logits_all=True, n_threads=2,
                          verbose=False, seed=0, flash_attn=False, type_k=0, type_v=0)
    cases = []
    for name, text, special in PROMPTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
        llm.reset()
        llm.eval(ids)
        scores = np.array(llm.scores[: len(ids)], dtype=np.float32)
        top_ids = np.argsort(-scores, axis=1, kind="stable")[:, :TOP_K]
        top_logits = np.take_along_axis(scores, top_ids, axis=1)
        greedy, greedy_gap = [], []
        for _ in range(GREEDY_TOKENS):
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            tok = int(np.argmax(row))
            top2 = np.sort(row)[-2:]
            greedy.append(tok)
            greedy_gap.append(round(float(top2[1] - top2[0]), 5))
            llm.eval([tok])
        # The gap between the best and second-best logit: where it is tiny, a rounding
        # difference may legitimately flip the argmax; the test reports such positions.
        sorted_scores = np.sort(scores, axis=1)
        cases.append({
            "name": name,
            "text": text,
            "parse_special": special,
            "ids": [int(i) for i in ids],
            "top_ids": top_ids.tolist(),
            "top_logits": [[round(float(v), 5) for v in row] for row in top_logits],
            "top1_gap": [round(float(v), 5) for v in (sorted_scores[:, -1] - sorted_scores[:, -2])],
            "greedy": greedy,
            "greedy_gap": greedy_gap,
        })
        print(f"{name}: {len(ids)} tokens, greedy {llm.detokenize(greedy)[:60]!r}", file=sys.stderr)
    out = {
        "generator": "python/make_golden.py",
        "llama_cpp_python": llama_cpp.__version__,
        "model": model_path.split("/")[-1],
        "model_sha256": sha,
        "top_k": TOP_K,
        "cases": cases,
    }
    with open(out_path, "w") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
