#!/usr/bin/env python3
"""An independent check of `kiln perplexity`: llama-perplexity's method on a float64 NumPy forward
pass (python/make_reference_logits.py's, over the `gguf` package's own dequantization) with
llama.cpp's tokenizer (llama-cpp-python, vocab only). Prints the perplexity of the first CHUNKS
windows; kiln's on the same file and text must agree to fp32 rounding.

    python perplexity_reference.py MODEL.gguf TEXT [N_CTX=512] [CHUNKS=2]
"""
import math
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from make_reference_logits import forward, load  # noqa: E402


def main() -> None:
    model, text_path = sys.argv[1], sys.argv[2]
    n_ctx = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    chunks = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    from llama_cpp import Llama

    vocab = Llama(model_path=model, vocab_only=True, verbose=False)
    add_bos = vocab.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"
    tokens = vocab.tokenize(pathlib.Path(text_path).read_bytes(), add_bos=add_bos, special=False)
    print(f"{len(tokens)} tokens, add_bos={add_bos}")
    cfg, weights = load(model)
    first = n_ctx // 2
    nll, count = 0.0, 0
    for c in range(chunks):
        window = list(tokens[c * n_ctx:(c + 1) * n_ctx])
        if add_bos:
            window[0] = vocab.token_bos()
        logits = forward(cfg, weights, window)
        for j in range(first, n_ctx - 1):
            row = logits[j]
            mx = row.max()
            lse = mx + math.log(np.exp(row - mx).sum())
            nll += lse - row[window[j + 1]]
            count += 1
        print(f"[{c + 1}] ppl {math.exp(nll / count):.6f}")


if __name__ == "__main__":
    main()
