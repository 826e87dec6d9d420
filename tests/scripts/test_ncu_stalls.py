"""scripts/ncu_stalls.py on real Nsight Compute source-page exports: session 15's run 3 (layer 0's
int4 gate_up + SwiGLU and o + norm GEMVs on the H200, committed under bench/results/raw/). The
shares asserted are the ones docs/performance/quantization.md quotes for that run."""
import csv
import gzip
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
RAW = ROOT / "bench" / "results" / "raw"
SCRIPT = ROOT / "scripts" / "ncu_stalls.py"
GATE_UP = RAW / "2026-12-03_s15_run3_ncu_source_int4_gate_up.csv.gz"
O_NORM = RAW / "2026-12-03_s15_run3_ncu_source_int4_o_norm.csv.gz"


def reduce(path, tmp_path, top=8):
    out = tmp_path / "stalls.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(path), "--top", str(top), "--json", str(out)],
                          capture_output=True, text=True, check=True)
    return json.loads(out.read_text()), proc.stdout


def test_gate_up_stall_shares_and_hottest_instructions(tmp_path):
    (k,), text = reduce(GATE_UP, tmp_path)
    assert "SwiGluEpi" in k["kernel"]
    assert k["samples"] == 2591
    share = k["stall_share_pct"]
    assert list(share)[:3] == ["long_sb", "wait", "barrier"]
    assert round(share["long_sb"], 1) == 24.0 and round(share["barrier"], 1) == 15.9
    first, second = k["hottest"][:2]
    assert "BRA" in first["sass"] and round(first["share"], 1) == 14.5 and first["reasons"]["barrier"] == 370
    assert "LDG.E.128" in second["sass"] and round(second["share"], 1) == 13.2
    assert "2591 warp-state samples" in text


def test_o_norm_waits_at_the_x_staging_load(tmp_path):
    (k,), _ = reduce(O_NORM, tmp_path, top=1)
    assert "AddNormRows" in k["kernel"] and k["samples"] == 867
    (hot,) = k["hottest"]
    assert "LDG.E.128" in hot["sass"] and round(hot["share"], 1) == 29.4 and hot["reasons"] == {"long_sb": 254, "wait": 1}


def test_an_export_of_two_kernels_gives_two_reductions(tmp_path):
    both = tmp_path / "both.csv"
    with both.open("w", newline="") as f:
        w = csv.writer(f)
        for path in (GATE_UP, O_NORM):
            with gzip.open(path, "rt", newline="") as g:
                w.writerows(r for r in csv.reader(g) if r)
    kernels, _ = reduce(both, tmp_path, top=2)
    assert [k["samples"] for k in kernels] == [2591, 867]


def test_an_export_without_the_sampling_column_is_refused(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text('"Kernel Name","k"\n"Address","Source"\n"0x0","NOP"\n')
    proc = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True)
    assert proc.returncode != 0 and "SourceCounters" in proc.stderr
