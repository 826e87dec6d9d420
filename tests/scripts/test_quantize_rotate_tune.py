"""`kiln quantize --rotate` and `--tune-epochs` on the default model (CPU), session 22. A rotated file is
an ordinary one with an untied head and gives the same next tokens as the unrotated one; the tuning's
options refuse what cannot work before any work. (A whole tuning run on the default model takes
minutes on two cores: the quality script's int4-gptq-tune row runs it; tests/unit/grid_tuning_test.cpp
and model_gradient_test.cpp check the algorithm and its gradients.)"""
from test_quantize_head import KILN, MODEL, kiln, needs_kiln  # noqa: F401 (a fixture)


def top_tokens(model):
    out = kiln("logits", "-m", model, "-p", "The capital of France is Paris, and the capital of Italy is",
               "--top", "1", "-t", "2")
    assert out.returncode == 0, out.stderr[-2000:]
    return [line.split()[2].split(":")[0] for line in out.stdout.splitlines() if line.strip()]


def test_rotated_model_predicts_the_same_tokens(needs_kiln, tmp_path):
    plain, rotated = tmp_path / "bf16.gguf", tmp_path / "rot.gguf"
    q = kiln("quantize", MODEL, plain, "--type", "bf16", "-t", "2")
    assert q.returncode == 0, q.stderr[-2000:]
    q = kiln("quantize", MODEL, rotated, "--type", "bf16", "--rotate", "-t", "2")
    assert q.returncode == 0, q.stderr[-2000:]
    assert "residual stream and values rotated" in q.stderr
    head = [line for line in q.stderr.splitlines() if " output.weight - " in line]
    assert head and "rotated apart from the embedding" in head[0]
    assert top_tokens(rotated) == top_tokens(plain)


def test_tuning_options_are_checked_first(needs_kiln, tmp_path):
    out = tmp_path / "never.gguf"
    no_text = kiln("quantize", MODEL, out, "--type", "int4", "--tune-epochs", "1")
    assert no_text.returncode != 0 and "--tune-epochs needs a text to tune on" in no_text.stderr
    not_int4 = kiln("quantize", MODEL, out, "--type", "int8", "--tune-epochs", "1", "--tune-text", MODEL)
    assert not_int4.returncode != 0 and "--type int4" in not_int4.stderr
    for args in (("--tune-epochs", "-1"), ("--tune-epochs", "65"), ("--tune-epochs", "1", "--tune-lr", "0"),
                 ("--tune-epochs", "1", "--tune-lr", "1")):
        q = kiln("quantize", MODEL, out, "--type", "int4", "--calib", MODEL, *args)
        assert q.returncode != 0 and args[-2] in q.stderr, (args, q.stderr[-500:])
    alone = kiln("quantize", MODEL, out, "--type", "int4", "--calib", MODEL, "--tune-text", MODEL)
    assert alone.returncode != 0 and "--tune-epochs" in alone.stderr
    assert not out.exists()


def test_an_int4_input_needs_a_teacher(needs_kiln, tmp_path):
    int4 = tmp_path / "int4.gguf"
    q = kiln("quantize", MODEL, int4, "--type", "int4", "-t", "2")
    assert q.returncode == 0, q.stderr[-2000:]
    out = tmp_path / "never.gguf"
    calib = tmp_path / "calib.txt"
    calib.write_text("The quick brown fox jumps over the lazy dog. " * 200)
    q = kiln("quantize", int4, out, "--type", "int4", "--calib", calib, "--tune-epochs", "1")
    assert q.returncode != 0 and "--tune-teacher" in q.stderr, q.stderr[-500:]
    q = kiln("quantize", int4, out, "--type", "int4", "--calib", calib, "--tune-epochs", "1", "--tune-teacher", MODEL,
             "--rotate")
    assert q.returncode != 0 and "--rotate do not apply" in q.stderr, q.stderr[-500:]
    assert not out.exists()


def test_tuning_an_int4_file_keeps_its_codes_and_records_it(needs_kiln, tmp_path):
    """The retune path on a small budget (2 windows of 64 tokens): the file's grids move, its codes and
    its awq key stay, and it records the tuning; the result loads and generates."""
    int4, tuned = tmp_path / "int4.gguf", tmp_path / "tuned.gguf"
    calib = tmp_path / "calib.txt"
    calib.write_text("The quick brown fox jumps over the lazy dog near the river bank. " * 100)
    q = kiln("quantize", MODEL, int4, "--type", "int4", "-t", "2")
    assert q.returncode == 0, q.stderr[-2000:]
    q = kiln("quantize", int4, tuned, "--type", "int4", "--calib", calib, "--calib-ctx", "64", "--calib-tokens", "128",
             "--tune-epochs", "1", "--tune-teacher", MODEL, "-t", "2")
    assert q.returncode == 0, q.stderr[-2000:]
    assert "2 windows of 64" in q.stderr and "tuning done" in q.stderr
    # On --tune-text, with the codes kept, nothing reads --calib (here a text too short to be one) and
    # --calib is not needed at all.
    short = tmp_path / "short.txt"
    short.write_text("Too short.")
    for calib_args in (("--calib", short), ()):
        again = kiln("quantize", int4, tmp_path / "tuned2.gguf", "--type", "int4", *calib_args, "--tune-text", calib,
                     "--calib-ctx", "64", "--tune-tokens", "128", "--tune-epochs", "1", "--tune-teacher", MODEL, "-t", "2")
        assert again.returncode == 0 and "2 windows of 64" in again.stderr, again.stderr[-2000:]
    assert "AWQ" not in q.stderr  # the codes are kept: no scale search, no GPTQ
    head = int4.read_bytes()[:4 << 20]
    tuned_head = tuned.read_bytes()[:4 << 20]
    assert b"kiln.quantization.tuned" in tuned_head and b"kiln.quantization.tuned" not in head
    assert b"kiln.quantization.awq" in tuned_head
    assert tuned.read_bytes() != int4.read_bytes()
    run = kiln("run", "-m", tuned, "-p", "The capital of France is", "-n", "4", "--temp", "0", "-t", "2")
    assert run.returncode == 0, run.stderr[-2000:]
