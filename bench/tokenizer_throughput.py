#!/usr/bin/env python3
"""Tokenization throughput: kiln vs Hugging Face `tokenizers` on the same 10 MB of text.

The text is built deterministically from files every Debian machine has (licence texts and the
Python standard library's sources), so both sides and every rerun see the same bytes. For each
tokenizer both sides read the same definition: the default model's vocabulary (kiln reads the GGUF;
`tokenizers` gets the same vocabulary and merges, as python/make_tokenizer_fixture.py builds it) and
three of the tokenizer.json fixtures (llama3-form, qwen2 with NFC, SentencePiece legacy).

kiln's time is its encode call alone (`kiln tokenize --timing`, one thread); `tokenizers` is timed
around `encode` of the whole text (one thread) and around `encode_batch` of its lines (all cores,
its normal bulk path). Token counts are compared as a sanity check.

Usage: /tmp/hfenv/bin/python bench/tokenizer_throughput.py [--kiln build/tools/kiln] [--mb 10] [--json OUT]
Needs: tokenizers, gguf (python/requirements-fixtures.txt).
"""
import argparse
import datetime
import glob
import json
import os
import platform
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from make_tokenizer_fixture import build_reference, read_vocab  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def corpus(n_bytes):
    files = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob("/usr/lib/python3*/**/*.py",
                                                                                  recursive=True))
    parts, size = [], 0
    for f in files:
        if not os.path.isfile(f):
            continue
        with open(f, encoding="utf-8", errors="replace") as fh:
            t = fh.read()
        parts.append(t)
        size += len(t.encode("utf-8"))
        if size >= n_bytes:
            break
    text = "\n".join(parts).encode("utf-8")[:n_bytes].decode("utf-8", errors="ignore")
    return text


def time_kiln(kiln, model, path):
    out = subprocess.run([kiln, "tokenize", "-m", model, "-f", path, "--format", "count", "--bos", "no", "--timing"],
                         capture_output=True, text=True, check=True)
    count = int(out.stdout.strip())
    # "kiln: N bytes -> M tokens in S s (X MB/s)"
    seconds = float(out.stderr.split(" in ")[1].split(" s")[0])
    return count, seconds


def best_of(f, reps=3):
    best, result = None, None
    for _ in range(reps):
        t0 = time.perf_counter()
        result = f()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return result, best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "tools", "kiln"))
    ap.add_argument("--mb", type=float, default=10)
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    text = corpus(int(args.mb * 1e6))
    path = "/tmp/kiln_tokenizer_bench.txt"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    n_bytes = len(text.encode("utf-8"))
    lines = text.splitlines(keepends=True)

    gguf_path = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    data = os.path.join(ROOT, "tests", "data", "tokenizer_json")
    cases = [("SmolLM2 (default model, GGUF)", gguf_path, lambda: build_reference(*read_vocab(gguf_path)))]
    for kind in ["llama3", "qwen2_nfc", "spm_legacy"]:
        p = os.path.join(data, kind, "tokenizer.json")
        cases.append((f"{kind} tokenizer.json", p, lambda p=p: Tokenizer.from_file(p)))

    rows = []
    print(f"{n_bytes / 1e6:.1f} MB of text, {len(lines)} lines, {os.cpu_count()} cores")
    print(f"{'tokenizer':34} {'kiln MB/s':>10} {'HF 1-thread':>12} {'HF batch':>10} {'kiln/HF1':>9} {'kiln/HFb':>9}"
          f" {'tokens':>9}")
    for name, model, make in cases:
        hf = make()
        kiln_count, kiln_s = min((time_kiln(args.kiln, model, path) for _ in range(3)), key=lambda r: r[1])
        enc, hf_s = best_of(lambda: hf.encode(text, add_special_tokens=False))
        batch, hfb_s = best_of(lambda: hf.encode_batch(lines, add_special_tokens=False))
        hf_count = len(enc.ids)
        row = {"tokenizer": name, "bytes": n_bytes, "kiln_s": kiln_s, "hf_encode_s": hf_s, "hf_batch_s": hfb_s,
               "kiln_tokens": kiln_count, "hf_tokens": hf_count, "hf_batch_tokens": sum(len(e.ids) for e in batch)}
        rows.append(row)
        mbs = lambda s: n_bytes / 1e6 / s  # noqa: E731
        print(f"{name:34} {mbs(kiln_s):10.1f} {mbs(hf_s):12.1f} {mbs(hfb_s):10.1f} {hf_s / kiln_s:9.2f}"
              f" {hfb_s / kiln_s:9.2f} {kiln_count:9d}{'' if kiln_count == hf_count else f' (HF {hf_count})'}")
    if args.json:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        import tokenizers
        with open(args.json, "w") as fh:
            json.dump({"date": datetime.date.today().isoformat(), "machine": platform.node(), "cpus": os.cpu_count(),
                       "commit": commit, "command": " ".join(sys.argv), "tokenizers_version": tokenizers.__version__,
                       "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
