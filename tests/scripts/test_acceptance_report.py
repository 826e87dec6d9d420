"""scripts/acceptance_report.py on real device runs: sessions 6's and 7's final runs, committed
under bench/results/raw/ (2026-11-30_s6_final_*, _s7_final_*), copied back under the names
gpu_suite.sh writes. The verdicts and figures asserted are the ones docs/BENCHMARKS.md quotes for
those runs."""
import json
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
RAW = ROOT / "bench" / "results" / "raw"
PREFIX = "2026-11-30_s6_final_"


def run_report(tmp_path, drop=(), prefix=PREFIX, files=None):
    """Copies a run's raw JSONs (prefix + NAME, as NAME), or `files` ({raw file name: NAME}), into
    tmp_path and reports on them."""
    for f in RAW.glob(prefix + "*.json") if files is None else (RAW / raw for raw in files):
        name = f.name[len(prefix):] if files is None else files[f.name]
        if name != "acceptance.json" and name not in drop:
            shutil.copy(f, tmp_path / name)
    out = tmp_path / "acceptance.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "acceptance_report.py"), str(tmp_path), "--json",
                           str(out)], capture_output=True, text=True, check=True)
    rows = json.loads(out.read_text())
    return {r["line"]: r for r in rows}, proc.stdout


def test_issue7_lines_pass_with_the_run_figures(tmp_path):
    rows, _ = run_report(tmp_path)
    assert rows["tg128 bf16 at 32k context"]["measured"] == "187.8"
    assert rows["pp16384 bf16"]["measured"] == "31,615.2"
    assert rows["prefill causal 4096 d128 GQA 32/8"]["measured"] == "488.2"
    assert rows["decode b=1 L=32768 >= 80% of copy"]["measured"] == "82.8%"
    issue7 = [r for r in rows.values() if r["issue"] == 7 and r["verdict"] != "-"]
    assert len(issue7) == 8 and all(r["verdict"] == "PASS" for r in issue7)


def test_gemv_lines_isolated_and_in_sequence(tmp_path):
    rows, _ = run_report(tmp_path)
    assert (rows["GEMV o M=1 >= 90% of copy"]["measured"], rows["GEMV o M=1 >= 90% of copy"]["verdict"]) == ("61.0%", "FAIL")
    seq = rows["GEMV o M=1 in sequence >= 90% of copy"]
    assert (seq["measured"], seq["verdict"]) == ("82.1%", "FAIL")
    assert rows["GEMV gate_up M=1 in sequence >= 90% of copy"]["verdict"] == "PASS"
    assert rows["throughput 2048 x 128/128 output tok/s (max-num-seqs 2048)"]["measured"] == "16,915.8"


def test_a_missing_output_is_unmeasured_not_failed(tmp_path):
    rows, _ = run_report(tmp_path, drop=("bench_tg_d32768.json",))
    r = rows["tg128 bf16 at 32k context"]
    assert (r["measured"], r["verdict"]) == ("-", "-")


def test_session7_gemm_line_and_the_gemvs_in_the_decode_step(tmp_path):
    rows, _ = run_report(tmp_path, prefix="2026-11-30_s7_final_")
    gemm = rows["prefill GEMM >= 90% of cuBLAS (15 shape/M)"]
    assert (gemm["measured"], gemm["verdict"]) == ("0.88x", "FAIL")
    step = {line.split(": ")[1]: r for line, r in rows.items() if "in the decode step" in line}
    assert set(step) == {f"{k}.gemv (CUPTI)" for k in ("gate_up+silu", "down", "qkv+rope", "o", "lm_head")}
    assert step["qkv+rope.gemv (CUPTI)"]["measured"] == "90.6%"
    assert all(r["verdict"] == "-" for r in step.values())  # context, not an acceptance line
    assert rows["throughput 2048 x 128/128 output tok/s (max-num-seqs 2048)"]["measured"] == "17,036.9"


def test_session8_quantized_heads(tmp_path):
    rows, _ = run_report(tmp_path, prefix="2026-11-30_s8_final_")
    assert rows["tg128 bf16 batch 1"]["measured"] == "248.5"
    assert rows["tg128 int8 / bf16"]["measured"] == "1.36x"
    heads = {line: r for line, r in rows.items() if " head / bf16" in line}
    assert {line: r["measured"] for line, r in heads.items()} == {
        "tg128 int8, int8 head / bf16": "1.41x", "tg128 int4, int8 head / bf16": "1.93x",
        "tg128 int4, int4 head / bf16": "1.97x"}
    assert all(r["verdict"] == "FAIL" for r in heads.values())


def test_runs_without_head_benches_report_no_head_lines(tmp_path):
    rows, _ = run_report(tmp_path, prefix="2026-11-30_s7_final_")
    assert not [line for line in rows if " head / bf16" in line]


def test_gemv_lines_carry_a_copy_of_the_same_bytes(tmp_path):
    # Session 31's lab on an H100 (2026-12-06_s31_call3_lab_*.json): qkv and o isolated run at the
    # rate a copy of their bytes runs, which is under the 90% line; the copy rows carry no verdict.
    rows, _ = run_report(tmp_path, prefix="2026-12-06_s31_call3_")
    assert (rows["GEMV qkv M=1 >= 90% of copy"]["measured"], rows["GEMV qkv M=1 >= 90% of copy"]["verdict"]) == (
        "84.2%", "FAIL")
    copies = {line: r for line, r in rows.items() if "  a copy of " in line}
    assert copies["  a copy of bf16 qkv's bytes, M=1"]["measured"] == "84.1%"
    assert copies["  a copy of bf16 o's bytes, M=1"]["measured"] == "76.9%"
    int4 = [r for r in copies.values() if r["issue"] == 10]
    assert len(int4) == 5 and min(float(r["measured"].rstrip("%")) for r in int4) == 45.8
    assert all(r["verdict"] == "-" for r in copies.values())


def test_session38_read_rows_beside_the_copy_rows(tmp_path):
    # H100, session 38 call A: the lab's read of a call's bytes (nothing written), context rows only.
    rows, _ = run_report(tmp_path, prefix="2026-12-06_s38_callA_h100_")
    assert rows["  a read of bf16 qkv's bytes, M=1"]["measured"] == "88.6%"
    assert rows["  a read of bf16 o's bytes, M=1"]["measured"] == "82.0%"
    assert rows["  a copy of bf16 o's bytes, M=1"]["measured"] == "76.3%"
    assert rows["  a read of int4 o's bytes, M=1"]["measured"] == "48.2%"
    assert all(r["verdict"] == "-" for line, r in rows.items() if line.startswith("  a read"))
    assert rows["GEMV gate_up M=1 faster than cuBLAS"]["measured"] == "0.99x"


def test_session39_the_most_any_kernel_reaches_as_one_call(tmp_path):
    # A timed call takes at least the lab's empty kernel plus its bytes at the HBM's datasheet rate: on
    # the H200 (session 10's lab, empty kernel 2.75 us, copy 3,986 GB/s; 4.8 TB/s HBM3e) o's bf16
    # bytes cannot reach issue #6's 90% of copy, and (session 32's lab) int4 qkv / o cannot reach
    # issue #10's 85%.
    rows, _ = run_report(tmp_path, prefix="2026-12-01_s10_final_")
    assert rows["  at most, any kernel on bf16 o's bytes as one call"]["measured"] == "86.4%"
    assert rows["  at most, any kernel on bf16 qkv's bytes as one call"]["measured"] == "95.4%"
    assert rows["  at most, any kernel on bf16 o's bytes as one call"]["verdict"] == "-"
    h200 = tmp_path / "h200"
    h200.mkdir()
    rows, _ = run_report(h200, files={"2026-12-06_s32_call4_lab_decode_h200.json": "lab_decode.json"})
    assert rows["  at most, any kernel on int4 qkv's bytes as one call"]["measured"] == "62.9%"
    assert rows["  at most, any kernel on int4 o's bytes as one call"]["measured"] == "50.7%"
    # Issue #10's GEMV line read as a layer's four GEMVs together (bytes over summed in-sequence time).
    assert rows["  a layer's int4 GEMVs together, in sequence"]["measured"] == "64.3%"
    # The H100 (session 39's lab: empty kernel 3.10 us, 3.35 TB/s HBM3): o's bound is under 90% there too.
    h100 = tmp_path / "h100"
    h100.mkdir()
    rows, _ = run_report(h100, prefix="2026-12-06_s39_callA_h100_")
    assert rows["  at most, any kernel on bf16 o's bytes as one call"]["measured"] == "89.7%"


def test_session40_h200_lines_and_bounds(tmp_path):
    # Session 40's H200 (call 1, the labs of fe9ad78): the figures docs/BENCHMARKS.md quotes. o's
    # one-call bound on this run's lab (empty kernel 2.69 us, copy 3,974 GB/s) stays under issue
    # #6's 90%; cuBLAS is ahead on gate_up on this card.
    rows, _ = run_report(tmp_path, files={"2026-12-06_s40_call1_h200_lab_gemv.json": "lab_gemv.json",
                                          "2026-12-06_s40_call1_h200_lab_decode.json": "lab_decode.json"})
    assert rows["GEMV o M=1 >= 90% of copy"]["measured"] == "67.3%"
    assert rows["GEMV o M=1 in sequence >= 90% of copy"]["measured"] == "86.6%"
    assert rows["  at most, any kernel on bf16 o's bytes as one call"]["measured"] == "87.2%"
    assert rows["  at most, any kernel on bf16 qkv's bytes as one call"]["measured"] == "96.1%"
    assert rows["GEMV gate_up M=1 faster than cuBLAS"]["verdict"] == "FAIL"
    assert rows["  at most, any kernel on int4 qkv's bytes as one call"]["measured"] == "63.8%"
    assert rows["  at most, any kernel on int4 o's bytes as one call"]["measured"] == "51.6%"
    assert rows["  a layer's int4 GEMVs together, in sequence"]["measured"] == "64.1%"
    assert rows["int4 decode GEMV >= 85% of copy (worst of 5 shapes)"]["measured"] == "24.1%"
