#!/usr/bin/env python3
"""Cuts the quantization-quality corpus out of Debian's debian-reference-en package.

The text is /usr/share/debian-reference/debian-reference.en.txt.gz from debian-reference-en
(Debian 12 "bookworm", version 2.100), "Debian Reference" by Osamu Aoki: English prose about
administering Debian, with some command listings and tables. The title page, table of contents
and preface (everything before the "Chapter 1. GNU/Linux tutorials" heading) are dropped. The evaluation text is the first EVAL_CHARS
characters of the rest (about 115k SmolLM2 tokens); the calibration text for the AWQ search is taken
from the end of the book, disjoint from it. calib_long.txt is all of the book after the evaluation
text (about 95k tokens, calib.txt its last part): the larger calibration for GPTQ's Hessians.
tune.txt is calib_long.txt without calib.txt (about 80k tokens): text for the end-to-end grid tuning
(kiln quantize --tune-text) that GPTQ did not fit its codes to.

usage: quant_corpus.py DEBIAN_REFERENCE_TXT_GZ OUT_DIR
"""
import gzip
import pathlib
import sys

EVAL_CHARS = 440_000
CALIB_CHARS = 60_000


def main() -> None:
    src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    text = gzip.decompress(src.read_bytes()).decode("utf-8")
    body_start = text.find("Chapter\u00a01.\u00a0GNU/Linux tutorials")  # no-break spaces
    if body_start < 0:
        sys.exit(f"{src}: no 'Chapter 1. GNU/Linux tutorials' heading; is this debian-reference 2.100?")
    body = text[body_start:]
    if len(body) < EVAL_CHARS + CALIB_CHARS:
        sys.exit(f"{src}: the body has {len(body)} characters, fewer than {EVAL_CHARS + CALIB_CHARS}")
    out.mkdir(parents=True, exist_ok=True)
    # Cut at line ends so no word is split.
    eval_end = body.rfind("\n", 0, EVAL_CHARS) + 1
    calib_start = body.find("\n", len(body) - CALIB_CHARS) + 1
    (out / "eval.txt").write_text(body[:eval_end], encoding="utf-8")
    (out / "calib.txt").write_text(body[calib_start:], encoding="utf-8")
    (out / "calib_long.txt").write_text(body[eval_end:], encoding="utf-8")
    (out / "tune.txt").write_text(body[eval_end:calib_start], encoding="utf-8")
    print(f"eval.txt: {eval_end} characters; calib.txt: {len(body) - calib_start} characters; "
          f"calib_long.txt: {len(body) - eval_end} characters")


if __name__ == "__main__":
    main()
