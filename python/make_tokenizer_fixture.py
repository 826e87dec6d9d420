#!/usr/bin/env python3
"""Records the token ids of ~2,300 varied strings for kiln's tokenizer parity test.

The reference is Hugging Face `tokenizers`, built from the GGUF's own vocabulary and merges the
way SmolLM2's tokenizer.json describes it (BPE; pre-tokenizer Sequence[Digits(individual_digits),
ByteLevel(add_prefix_space=False, use_regex=True)]; ByteLevel decoder; the control tokens added as
special tokens). Building it from the GGUF keeps the script offline and tests exactly the vocabulary
kiln reads; it is an independent implementation of the same algorithm, which is the point.

Usage:
  python python/make_tokenizer_fixture.py MODEL.gguf tests/data/tokenizer/smollm2_ids.json
Needs: gguf, numpy, tokenizers (pip install gguf tokenizers).
"""
import argparse
import json
import os
import random

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


def read_vocab(path):
    reader = GGUFReader(path)

    def strings(key):
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    def scalar_string(key):
        field = reader.fields[key]
        return bytes(field.parts[field.data[0]]).decode("utf-8")

    field = reader.fields["tokenizer.ggml.token_type"]
    types = [int(field.parts[i][0]) for i in field.data]
    model = scalar_string("tokenizer.ggml.model")
    pre = scalar_string("tokenizer.ggml.pre")
    if model != "gpt2" or pre != "smollm":
        raise SystemExit(f"this script models the smollm pre-tokenizer; the file has {model}/{pre}")
    return strings("tokenizer.ggml.tokens"), types, strings("tokenizer.ggml.merges")


def build_reference(tokens, types, merges):
    vocab = {text: i for i, text in enumerate(tokens)}
    # llama.cpp splits a merge at the first space after the first character; do the same.
    pairs = []
    for m in merges:
        cut = m.find(" ", 1)
        pairs.append((m[:cut], m[cut + 1:]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types) if ty == TOKEN_TYPE_CONTROL]
    added = [AddedToken(t, special=False, normalized=False)
             for t, ty in zip(tokens, types) if ty == TOKEN_TYPE_USER_DEFINED]
    tok.add_special_tokens(specials)
    if added:
        tok.add_tokens(added)
    return tok


HANDWRITTEN = [
    # empty and whitespace
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t\t\tx", "a  b", "a   b   c",
    "trailing space ", "trailing spaces   ", "   leading spaces", "\n\n\nthree newlines",
    "tab\tseparated\tvalues", "mixed \t \n whitespace", "line1\nline2\r\nline3\rline4",
    " \u00a0nbsp", "a\u00a0b", "ideographic\u3000space", "line\u2028separator", "next\u0085line",
    "en\u2002space", "thin\u2009space", "zero\u200bwidth", "mongolian\u180evowel", "bom\ufeffhere",
    "form\x0cfeed", "vertical\x0btab", "x" + " " * 17 + "y", "\n" * 12, " " * 40,
    # ASCII prose
    "Hello world", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times.",
    "Call me Ishmael. Some years ago—never mind how long precisely—having little money...",
    "To be, or not to be: that is the question.", "HELLO WORLD", "hElLo WoRlD",
    "A sentence with (parentheses), [brackets] and {braces}.", "Question? Exclamation! Ellipsis...",
    "semicolons; colons: dashes - and -- em—dashes", "quotes \"double\" and 'single'",
    "multiple!!! punctuation??? marks...", "e-mail me at someone@example.com", "#hashtag @mention",
    "https://www.example.com/path?query=1&other=two#frag", "C:\\Users\\name\\file.txt",
    "snake_case_name camelCaseName PascalCaseName kebab-case-name SCREAMING_CASE",
    # contractions
    "don't", "Don't", "DON'T", "I'm", "I'M", "you're", "YOU'RE", "we've", "WE'VE", "she'll",
    "SHE'LL", "he'd", "HE'D", "it's", "IT'S", "can't won't shouldn't", "y'all'd've",
    "'s 't 're 've 'm 'll 'd", "the dog's bone", "rock 'n' roll", "''quoted''", "'twas",
    "O'Neil's", "it\u2019s curly", "a'b'c'd", "'", "''", "' '", "x's'",
    # digits and numbers
    "0", "7", "42", "123", "1234", "12345", "1234567890", "3.14159", "-273.15", "1,000,000",
    "1e10", "0x1F", "2024-01-15", "12:30:45", "v1.2.3", "$100", "100%", "1st 2nd 3rd 4th",
    "abc123def", "123abc", "a1b2c3", " 1", "  2", " 12 34 ", "phone: +1 (555) 123-4567",
    "\u00b2\u00b3\u00b9", "\u2167 \u216b", "\u0661\u0662\u0663", "\uff11\uff12\uff13", "\u00bd \u00be",
    # code
    "def foo(x):\n    return x + 1\n",
    "int main(int argc, char** argv) {\n  printf(\"%d\\n\", argc);\n  return 0;\n}\n",
    "for (size_t i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "if x == 1 and y != 2 or not z:\n\tpass",
    "const auto& [key, value] = *it;",
    "std::vector<std::unique_ptr<Node>> nodes;",
    "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "{\"key\": \"value\", \"list\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "<div class=\"container\"><p>Hello</p></div>",
    "x = lambda a, b: a ** b // 2 % 3",
    "    indented four\n        indented eight\n\tindented tab",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "$ ls -la | grep '^d' > out.txt 2>&1",
    "a+=b; c-=d; e*=f; g/=h; i%=j; k<<=1; l>>=2; m&=n; o|=p; q^=r;",
    "/* block comment */ // line comment",
    "```python\nprint('hi')\n```",
    "x=1\ny=2\n\nz=3\n\n\n",
    "arr[0][1]->field.method()?.value ?? default",
    "~!@#$%^&*()_+`-=[]\\{}|;':\",./<>?",
    # unicode letters
    "caf\u00e9", "cafe\u0301", "na\u00efve r\u00e9sum\u00e9", "\u00c0 la carte", "Stra\u00dfe",
    "\u00c5ngstr\u00f6m", "Pok\u00e9mon", "fa\u00e7ade", "\u0141\u00f3d\u017a", "\u0130stanbul",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac", "\u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u044f\u0437\u044b\u043a",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "\u3053\u3093\u306b\u3061\u306f", "\u30ab\u30bf\u30ab\u30ca", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35", "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0",
    "\u0533\u0561\u0580\u0565\u0582", "\u1200\u1208\u1218", "Ti\u1ebfng Vi\u1ec7t",
    "mixed English \u4e2d\u6587 and \u0627\u0644\u0639\u0631\u0628\u064a\u0629 text",
    "\u202eright-to-left override\u202c", "\u200fRLM mark", "left\u200dzero\u200cjoin",
    "\U0001d518\U0001d52b\U0001d526", "\U00020000\U0002a6d6", "\u2160\u2161\u2162",
    "\u00ff\u0100\u0101", "\u02bc\u02bb\u02c8", "\u0300\u0301 combining alone", "a\u0308\u0301\u0323",
    # symbols and emoji
    "\U0001f600", "\U0001f600\U0001f601\U0001f602", "I \u2764\ufe0f NY", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
    "\U0001f1fa\U0001f1f8 \U0001f1ef\U0001f1f5", "\U0001f44d\U0001f3fd", "\u2603 \u2600 \u2601",
    "\u00a9 \u00ae \u2122", "\u20ac100 \u00a350 \u00a51000", "\u2192 \u2190 \u2194 \u21d2",
    "\u2200x \u2208 \u211d: x\u00b2 \u2265 0", "\u2211 \u220f \u222b \u221a \u221e", "\u00b1 \u00d7 \u00f7 \u2260 \u2248",
    "\u2022 bullet \u2023 point", "\u201cquoted\u201d \u2018single\u2019", "\u00abguillemets\u00bb",
    "\u2026", "\u2014\u2013", "\u266a\u266b", "\u2605\u2606", "\u25a0\u25a1\u25b2",
    # ChatML and other special tokens written in text
    "<|im_start|>", "<|im_end|>", "<|endoftext|>",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>assistant\nThe capital of France is Paris.<|im_end|>",
    "<|im_start|><|im_end|>", "<|im_end|><|im_start|>", "text<|endoftext|>more text",
    "<|im_start", "im_start|>", "<|im_start|", "<<|im_start|>>", "<|im_start|><|im_start|>",
    "< |im_start| >", "<|IM_START|>", " <|im_end|> ", "\n<|im_end|>\n",
    "<repo_name>kiln<file_sep>src/main.cpp", "<filename>a.py\n<gh_stars>100",
    "<jupyter_start><jupyter_code>print(1)<jupyter_output>1", "<issue_start>bug<issue_comment>fix<issue_closed>",
    "<empty_output>", "<|endoftext|><|endoftext|>", "a<|im_end|>b<|im_end|>c",
    # bytes SmolLM2 has no token for: Hugging Face drops them before merging (lossy)
    "!\x04!", "t\x04he", "\x04\x06", ":\x13:", "a\x1db", "a\U00040000b",
    # long-ish
    "The " * 30, "ab" * 50, "x" * 100, "!" * 30, "0123456789" * 5,
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt "
    "ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco.",
    # single pieces longer than 64 bytes (kiln merges those with a heap instead of a scan)
    " " * 100, "!@#$%^&*" * 12, "abcdefghij" * 9, "\u4e2d\u6587\u5b57\u7b26" * 8,
    "".join(random.Random(99).choice("etaoinshrdlucmfwyp") for _ in range(200)),
    "Donaudampfschifffahrtsgesellschaftskapit\u00e4nsm\u00fctzenabzeichenverleihungszeremonie",
    "antidisestablishmentarianism", "pneumonoultramicroscopicsilicovolcanoconiosis",
    "supercalifragilisticexpialidocious", "Donaudampfschifffahrtsgesellschaftskapit\u00e4n",
]

FRAGMENTS = [
    "the", "The", " cat", " sat", "on", " mat", "don't", "I'll", "42", "3.5", " 2024", "\n", "\n\n",
    "  ", "\t", " ", ".", ",", "!", "?", "...", "(", ")", "{", "}", "=>", "->", "::", "//", "#", "@",
    "caf\u00e9", "\u4e2d\u6587", "\u65e5\u672c", "\U0001f600", "\u0645\u0631\u062d\u0628\u0627",
    "\u05e9\u05dc\u05d5\u05dd", "\u00fc", "\u00df", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
    "user", "assistant", "def", " return", "x", "_", "1", "0", "'s", "'re", "\u2019", "\u2014",
    "\u00a0", "\u3000", "\r\n", "NaN", "HTTP", "json", "\\", "\"", "'", "`", "$", "%", "&",
]


def generated_strings(count, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        out.append("".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(2, 14))))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="SmolLM2 GGUF file")
    parser.add_argument("out", help="fixture JSON to write")
    parser.add_argument("--generated", type=int, default=70, help="random fragment mixes to add")
    parser.add_argument("--strings-from", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                                                               "tokenizer_json", "cases.json"),
                        help="also the 2,000 shared strings of the tokenizer.json fixtures")
    args = parser.parse_args()

    tokens, types, merges = read_vocab(args.model)
    reference = build_reference(tokens, types, merges)
    texts = HANDWRITTEN + generated_strings(args.generated, seed=1234)
    if args.strings_from:
        with open(args.strings_from, encoding="utf-8") as fh:
            texts += json.load(fh)["strings"]
    seen = set()
    cases = []
    for text in texts:
        if text in seen:
            continue
        seen.add(text)
        ids = reference.encode(text, add_special_tokens=False).ids
        case = {"text": text, "ids": ids}
        decoded = reference.decode(ids, skip_special_tokens=False)
        if decoded != text:
            # Only text with bytes the vocabulary lacks may lose them; record what decodes back.
            case["decoded"] = decoded
            print(f"note: {text!r} decodes to {decoded!r}")
        cases.append(case)
    with open(args.out, "w", encoding="utf-8") as f:
        # One case a line: diffs of a regenerated fixture stay readable.
        f.write("[\n")
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n]\n")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
