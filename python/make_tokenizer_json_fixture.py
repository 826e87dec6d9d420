#!/usr/bin/env python3
"""Builds the tokenizer.json parity fixtures in tests/data/tokenizer_json/.

Trains small byte-level BPE vocabularies (about 2000 tokens) with Hugging Face `tokenizers` on text
found on this machine (licence texts, Python sources), in four pre-tokenizer forms:

  llama3  Sequence[Split(llama3 regex, isolated), ByteLevel(use_regex=False)], ignore_merges=True
  qwen2   Sequence[Split(qwen2 regex, isolated), ByteLevel(use_regex=False)] (no NFC normalizer)
  gpt2    ByteLevel(add_prefix_space=False, use_regex=True)
  smollm  Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)]

each with special added tokens and one non-special added token, plus

  qwen2_nfc      the qwen2 form with Qwen2's NFC normalizer
  spm_legacy     SentencePiece BPE (trained with `sentencepiece`, byte_fallback, split digits) as
                 transformers' LlamaConverter writes it for Llama 2 / Mistral v0.1 (legacy):
                 normalizer Sequence[Prepend("▁"), Replace(" ", "▁")], no pre-tokenizer
  spm_metaspace  the same vocabulary in the non-legacy form: Metaspace(prepend_scheme="first",
                 split=False), no normalizer

then records the ids `encode(s, add_special_tokens=False)` gives for a shared list of varied strings
(cases.json). The SentencePiece model itself is kept (spm/m.model) for the GGUF fixture
(python/make_spm_gguf_fixture.py), which checks kiln's tokenizer.ggml.model=llama path against llama.cpp.

Usage: /tmp/hfenv/bin/python python/make_tokenizer_json_fixture.py [out_dir]
"""
import glob
import json
import os
import random
import sys

import sentencepiece as spm
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers.convert_slow_tokenizer import generate_merges

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


def train_sentencepiece(texts, out_dir):
    """Trains a Llama-2-like SentencePiece BPE model; returns its path."""
    os.makedirs(out_dir, exist_ok=True)
    corpus = os.path.join(out_dir, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as fh:
        fh.write("\n".join(texts))
    prefix = os.path.join(out_dir, "m")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=prefix, vocab_size=2000, model_type="bpe", byte_fallback=True, split_digits=True,
        character_coverage=0.9995, allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", user_defined_symbols=[NON_SPECIAL], max_sentence_length=1 << 20,
        minloglevel=2)
    os.remove(corpus)
    os.remove(prefix + ".vocab")
    return prefix + ".model"


def build_sentencepiece(kind, model_path):
    """What transformers' LlamaConverter builds from a SentencePiece BPE model (legacy or not)."""
    sp = spm.SentencePieceProcessor(model_file=model_path)
    pieces = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    vocab = {p: i for i, (p, _) in enumerate(pieces)}
    merges = generate_merges(vocab, dict(pieces))
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=sp.id_to_piece(sp.unk_id()), fuse_unk=True,
                               byte_fallback=True))
    if kind == "spm_legacy":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    added = []
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i):
            added.append(AddedToken(sp.id_to_piece(i), special=True, normalized=False))
        elif sp.id_to_piece(i) == NON_SPECIAL:
            added.append(AddedToken(NON_SPECIAL, special=False, normalized=False))
    tok.add_tokens(added)
    return tok


def build(kind, texts):
    if kind == "qwen2_nfc":
        tok = build("qwen2", texts)
        tok.normalizer = normalizers.NFC()
        return tok
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
    cases = {"strings": strings, "ids": {}, "decoded": {}}
    spm_model = train_sentencepiece(texts, os.path.join(out_dir, "spm"))
    for kind in ["llama3", "qwen2", "gpt2", "smollm", "qwen2_nfc", "spm_legacy", "spm_metaspace"]:
        tok = build_sentencepiece(kind, spm_model) if kind.startswith("spm") else build(kind, texts)
        d = os.path.join(out_dir, kind)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
        cases["ids"][kind] = [tok.encode(s, add_special_tokens=False).ids for s in strings]
        # What HF decodes the ids back to: kiln must give the same text. It is the input itself
        # except where the form changes text (NFC; lstrip/rstrip tokens; SentencePiece's leading
        # space, and the legacy form's "▁" after each added token).
        cases["decoded"][kind] = [tok.decode(ids, skip_special_tokens=False) for ids in cases["ids"][kind]]
        for s, text in zip(strings, cases["decoded"][kind]):
            if kind in ("llama3", "qwen2", "smollm") or (kind == "gpt2" and STRIPPED not in s):
                assert text == s, (kind, s)
    with open(os.path.join(out_dir, "llama3", "tokenizer_config.json"), "w") as fh:
        json.dump({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "add_bos_token": True}, fh)
    with open(os.path.join(out_dir, "cases.json"), "w", encoding="utf-8") as fh:
        json.dump(cases, fh, ensure_ascii=False, separators=(",", ":"))


if __name__ == "__main__":
    main()
