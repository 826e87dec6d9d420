#!/usr/bin/env python3
"""Builds the tokenizer.json parity fixtures in tests/data/tokenizer_json/.

Trains small byte-level BPE vocabularies (about 2000 tokens) with Hugging Face `tokenizers` on text
found on this machine (licence texts, Python sources), in four pre-tokenizer forms:

  llama3  Sequence[Split(llama3 regex, isolated), ByteLevel(use_regex=False)], ignore_merges=True
  qwen2   Sequence[Split(qwen2 regex, isolated), ByteLevel(use_regex=False)] (no NFC normalizer)
  gpt2    ByteLevel(add_prefix_space=False, use_regex=True)
  smollm  Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)]

each with special added tokens and one non-special added token, then records the ids
`encode(s, add_special_tokens=False)` gives for a shared list of varied strings (cases.json).

Usage: /tmp/hfenv/bin/python python/make_tokenizer_json_fixture.py [out_dir]
"""
import glob
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
NON_SPECIAL = "<tool_call>"
STRIPPED = "<|mask|>"  # special, lstrip + rstrip (gpt2 only)


def corpus_files():
    files = sorted(glob.glob("/usr/share/common-licenses/*"))
    files += sorted(glob.glob("/usr/lib/python3*/json/*.py"))[:10]
    files += sorted(glob.glob("/usr/lib/python3*/email/*.py"))[:10]
    return [f for f in files if os.path.isfile(f)]


def read_corpus():
    texts = []
    for f in corpus_files():
        with open(f, encoding="utf-8", errors="replace") as fh:
            texts.append(fh.read())
    return texts


def pre_tokenizer_for(kind):
    if kind == "llama3":
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if kind == "qwen2":
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if kind == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if kind == "smollm":
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    raise ValueError(kind)


def build(kind, texts):
    tok = Tokenizer(models.BPE(ignore_merges=(kind == "llama3")))
    tok.pre_tokenizer = pre_tokenizer_for(kind)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=SPECIAL, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(NON_SPECIAL, special=False, normalized=False)])
    if kind == "gpt2":
        tok.add_special_tokens([AddedToken(STRIPPED, special=True, lstrip=True, rstrip=True)])
    return tok


FRAGMENTS = [
    "Hello, world!", "I'm", "don't", "WE'LL", "they've", "She'd", "it's", "'S", "IT'S", "you're", "'ll", "'ve",
    "12345", "3.14159", "1,000,000", "007", "٣٤٥", "①②③", "Ⅻ", "2024-06-01T12:00:00Z", "0x1F600",
    "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }", "#include <stdio.h>",
    "if __name__ == '__main__':", "    ", "\t\t", "\n\n\n", "  \n  ", " \r\n", "\r\n\r\n", "   x   ",
    "日本語のテキスト", "中文分词测试", "한국어 문장", "Привет, мир", "Γειά σου Κόσμε", "שלום עולם", "مرحبا بالعالم",
    "नमस्ते दुनिया", "ภาษาไทย", "Ünïcödé façade naïve café", "ſtraße", "İstanbul", "e\u0301", "a\u0308o\u0308",
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇩🇪🇫🇷", "❤️", "∑∫√∞≠≈", "€£¥₿", "—–…“”‘’", "\u00a0non-breaking\u00a0space",
    "\u3000ideographic space", "zero\u200bwidth", "<|endoftext|>", "<|im_start|>user\nhi<|im_end|>\n", "<tool_call>",
    "<|mask|>", " <|mask|> ", "<|im_end", "<|", "|>", "<<|im_start|>>", "GNU GENERAL PUBLIC LICENSE", "Version 3",
    "https://www.gnu.org/licenses/", "email@example.com", "$HOME/.config", "C:\\Users\\x", "```python\nprint(1)\n```",
    "!!!???", "...", "---", "***", "~~~", "a", "A", " ", "", "x" * 40, "ab" * 20, "123" * 10, " " * 17, "\n" * 5,
]


def make_strings(texts, n=2000, seed=1234):
    rng = random.Random(seed)
    out = list(dict.fromkeys(FRAGMENTS))
    big = "\n".join(texts)
    while len(out) < n:
        r = rng.random()
        if r < 0.35:
            start = rng.randrange(len(big) - 200)
            out.append(big[start:start + rng.randrange(1, 120)])
        elif r < 0.75:
            k = rng.randrange(1, 6)
            seps = ["", " ", "  ", "\n", "\t", " \n "]
            out.append("".join(rng.choice(FRAGMENTS) + rng.choice(seps) for _ in range(k)))
        else:
            # random code points from interesting ranges
            ranges = [(0x20, 0x7e), (0x09, 0x0d), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x4e00, 0x4fff),
                      (0x3040, 0x30ff), (0xac00, 0xacff), (0x1f300, 0x1f64f), (0x2000, 0x206f), (0x0600, 0x06ff),
                      (0x0900, 0x097f), (0x30, 0x39), (0x660, 0x669), (0xff00, 0xffef)]
            chars = []
            for _ in range(rng.randrange(1, 30)):
                lo, hi = rng.choice(ranges)
                chars.append(chr(rng.randint(lo, hi)))
            out.append("".join(chars))
    return out[:n]


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                                                                 "tokenizer_json")
    texts = read_corpus()
    strings = make_strings(texts)
    cases = {"strings": strings, "ids": {}}
    for kind in ["llama3", "qwen2", "gpt2", "smollm"]:
        tok = build(kind, texts)
        d = os.path.join(out_dir, kind)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
        cases["ids"][kind] = [tok.encode(s, add_special_tokens=False).ids for s in strings]
        for s, ids in zip(strings, cases["ids"][kind]):
            assert tok.decode(ids, skip_special_tokens=False) == s or STRIPPED in s, (kind, s)
    with open(os.path.join(out_dir, "llama3", "tokenizer_config.json"), "w") as fh:
        json.dump({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "add_bos_token": True}, fh)
    with open(os.path.join(out_dir, "cases.json"), "w", encoding="utf-8") as fh:
        json.dump(cases, fh, ensure_ascii=False, separators=(",", ":"))


if __name__ == "__main__":
    main()
