#!/usr/bin/env python3
"""Writes tests/data/gguf/dequant_fixture.json: random quantized blocks and the floats that the
`gguf` Python package (llama.cpp's gguf-py) dequantizes them to. kiln's dequantize_row is checked
against these in tests/unit/gguf_dequant_test.cpp, so the reference is code kiln did not write.

    python3 -m venv /tmp/pyref && /tmp/pyref/bin/pip install gguf numpy
    /tmp/pyref/bin/python python/make_dequant_fixture.py
"""
import json
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

N_BLOCKS = 3  # per type: enough to check the block stride, small enough to keep the file tiny

# Byte offsets of the fp16 fields (scales, mins) in each block: random bytes there could be NaN or
# inf, so they get random finite values instead; every other byte stays random.
FP16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q8_0: [0],
    T.Q4_K: [0, 2],
    T.Q6_K: [208],
}


def make_blocks(rng, qtype):
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(N_BLOCKS, block_bytes), dtype=np.uint8)
    for at in FP16_FIELDS[qtype]:
        # Mixed signs and magnitudes, as real scales and mins have.
        values = (rng.standard_normal(N_BLOCKS) * 0.05).astype(np.float16)
        blocks[:, at:at + 2] = values.view(np.uint8).reshape(N_BLOCKS, 2)
    return blocks


def main():
    rng = np.random.default_rng(20240607)
    cases = []
    for qtype in FP16_FIELDS:
        blocks = make_blocks(rng, qtype)
        expected = quants.dequantize(blocks.reshape(-1), qtype).astype(np.float32).reshape(-1)
        assert np.all(np.isfinite(expected))
        cases.append({
            "type": qtype.name,
            "type_id": int(qtype.value),
            "n": int(expected.size),
            "hex": blocks.tobytes().hex(),
            # float(np.float32) is exact; repr round-trips, so the C++ side reads the same float.
            "expected": [float(x) for x in expected],
        })
    out = pathlib.Path(__file__).resolve().parent.parent / "tests/data/gguf/dequant_fixture.json"
    out.write_text(json.dumps({"generator": "python/make_dequant_fixture.py", "cases": cases}) + "\n")
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
