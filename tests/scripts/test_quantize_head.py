"""`kiln quantize --head / --head-type` on the default model (CPU): the head of a model that ties it to
its embedding becomes a quantized output.weight of its own, the file loads and generates, and bad
combinations are refused with a message instead of a file. The first version of --head wrote freed
memory when it copied a tied head and crashed at the write (session 8)."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
KILN = pathlib.Path(os.environ.get("KILN_BIN", ROOT / "build" / "tools" / "kiln"))


def kiln(*args):
    return subprocess.run([str(KILN), *map(str, args)], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def needs_kiln():
    if not KILN.exists():
        pytest.fail(f"{KILN} not found: build kiln first (scripts/build.sh)")
    if not MODEL.exists():
        pytest.fail(f"{MODEL} not found: run scripts/fetch_model.sh")


def test_int4_layers_with_an_int8_head_load_and_generate(needs_kiln, tmp_path):
    out = tmp_path / "int4_head8.gguf"
    q = kiln("quantize", MODEL, out, "--type", "int4", "--group", "32", "--head-type", "int8", "-t", "2")
    assert q.returncode == 0, q.stderr[-2000:]
    copy = [line for line in q.stderr.splitlines() if " output.weight - " in line]
    assert copy and "a copy of token_embd.weight (tied head)" in copy[0] and "kiln_int8" in copy[0]
    run = kiln("run", "-m", out, "-p", "The capital of France is", "-n", "6", "--temp", "0", "-t", "2")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "generated" in run.stderr


def test_bad_head_options_are_refused(needs_kiln, tmp_path):
    out = tmp_path / "never.gguf"
    bf16_head = kiln("quantize", MODEL, out, "--type", "int8", "--head-type", "bf16")
    assert bf16_head.returncode != 0 and "--head-type" in bf16_head.stderr
    rounded = kiln("quantize", MODEL, out, "--type", "bf16", "--head")
    assert rounded.returncode != 0 and "--head applies to int8, int4 and fp8" in rounded.stderr
    assert not out.exists()


def test_gptq_needs_a_calibration_text(needs_kiln, tmp_path):
    """--gptq without --calib is refused before any work. (A whole --gptq run on the default model
    takes minutes on two cores: the quality script's int4-awq-gptq row runs it; tests/unit/gptq_test.cpp
    checks the algorithm.)"""
    out = tmp_path / "never.gguf"
    q = kiln("quantize", MODEL, out, "--type", "int4", "--gptq")
    assert q.returncode != 0 and "--gptq needs a calibration text" in q.stderr
    assert not out.exists()


def test_gptq_refinements_need_gptq(needs_kiln, tmp_path):
    """act-order and the MSE group ranges are on by default with --gptq (session 12); their flags, on
    or off, refine --gptq and are refused without it."""
    out = tmp_path / "never.gguf"
    for flag in ("--gptq-act-order", "--no-gptq-mse-grid", "--gptq-clip", "--gptq-sequential", "--gptq-no-awq",
                 "--gptq-asymmetric", "--gain-fit"):
        q = kiln("quantize", MODEL, out, "--type", "int4", flag)
        assert q.returncode != 0 and "--gptq" in q.stderr, (flag, q.stderr[-500:])
    for flag, value in (("--gptq-refit", "1"), ("--gptq-damp", "0.01"), ("--gptq-descent", "2"),
                        ("--gptq-fit-damp", "0.1")):
        q = kiln("quantize", MODEL, out, "--type", "int4", flag, value)
        assert q.returncode != 0 and "--gptq" in q.stderr, (flag, q.stderr[-500:])
    assert not out.exists()


def test_gptq_option_ranges(needs_kiln, tmp_path):
    """Session 14's, 20's and 21's options refuse impossible values before any work: refit and descent
    rounds 0..8, a damping share in (0, 1], a fit damping in [0, 1], a gain-fit ridge >= 0 (and only
    with --gain-fit)."""
    out = tmp_path / "never.gguf"
    for args in (("--gptq-refit", "9"), ("--gptq-refit", "-1"), ("--gptq-damp", "0"), ("--gptq-damp", "2"),
                 ("--gptq-descent", "9"), ("--gptq-descent", "-1"), ("--gptq-fit-damp", "-0.1"),
                 ("--gptq-fit-damp", "2"), ("--gain-fit-ridge", "1")):
        q = kiln("quantize", MODEL, out, "--type", "int4", "--calib", MODEL, "--gptq", *args)
        assert q.returncode != 0, (args, q.stderr[-500:])
        assert args[0] in q.stderr, (args, q.stderr[-500:])
    assert not out.exists()


def test_gptq_without_awq_refuses_the_clipping_search(needs_kiln, tmp_path):
    """--gptq-no-awq skips the AWQ search, and the clipping search is part of it: asking for both is
    refused before any work (session 18)."""
    out = tmp_path / "never.gguf"
    q = kiln("quantize", MODEL, out, "--type", "int4", "--calib", MODEL, "--gptq", "--gptq-no-awq", "--gptq-clip")
    assert q.returncode != 0 and "--gptq-no-awq" in q.stderr, q.stderr[-500:]
    assert not out.exists()
