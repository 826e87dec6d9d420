"""scripts/ncu_table.py on a real raw export (session 41's call A3: layer 0's four int4 GEMVs of
`kiln profile --random llama3-8b --quant int4 --quant-head int4 -b 1 -c 1 --steps 1` on an H100,
twice, ncu flushing L2 before each launch; committed under bench/results/raw/) and on a small
export that carries the byte metrics session 41 added."""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ncu_table.py"
A3_BASE = ROOT / "bench" / "results" / "raw" / "2026-12-06_s41_callA3_h100_ncu_raw_base.csv"
A3_TABLE = ROOT / "bench" / "results" / "raw" / "2026-12-06_s41_callA3_h100_ncu_cacheflush.txt"


def run(csv_path, tmp_path):
    out = tmp_path / "table.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(csv_path), "--json", str(out)],
                          capture_output=True, text=True, check=True)
    return json.loads(out.read_text()), proc.stdout


def test_real_export_gives_the_committed_table(tmp_path):
    rows, text = run(A3_BASE, tmp_path)
    assert len(rows) == 8  # qkv, o, gate/up, down of layers 0 and 1
    o = rows[1]
    assert "StoreRows" in o["kernel"]
    assert round(o["us"], 1) == 10.8 and round(o["dram_pct"], 1) == 26.3 and round(o["l2_hit_pct"], 1) == 48.0
    assert o["registers"] == 119 and round(o["smem_kb"], 1) == 13.6
    assert o["top_stalls"][0][0] == "long_scoreboard"
    gate_up = rows[2]
    assert "SwiGluEpi" in gate_up["kernel"] and round(gate_up["dram_pct"], 1) == 64.0
    assert gate_up["dram_read_mb"] is None  # that run did not ask for the byte metrics
    # The same lines the session's inline table printed (its base half of the committed file).
    committed = A3_TABLE.read_text().split("== gu32")[0].strip().splitlines()
    assert text.strip().splitlines() == committed


def test_byte_metrics_become_megabytes(tmp_path):
    csv_path = tmp_path / "raw.csv"
    csv_path.write_text(
        "kiln's own output before the export\n"
        '"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum",'
        '"lts__t_sectors_srcunit_tex_op_read.sum","lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum"\n'
        '"","","ns","byte","sector","sector"\n'
        '"0","gemv_kernel<int4>","20,000","42,615,296","1,000,000","250,000"\n')
    (row,), text = run(csv_path, tmp_path)
    assert row["us"] == 20.0
    assert round(row["dram_read_mb"], 2) == 42.62
    assert row["l2_read_mb"] == 32.0 and row["l2_read_miss_mb"] == 8.0
    assert "DRAM MB" in text and "42.62" in text and row["dram_pct"] is None


def test_bytes_only_export(tmp_path):
    """Session 42's call B (`NCU_METRICS=bytes`, no cache flush, the weight loads at .L2::256B): only
    the duration and byte columns are there; the int4 gate/up GEMV read 77.58 MB from DRAM for its
    66.1 MB matrix (performance/qgemv-l2-span.md)."""
    csv_path = ROOT / "bench" / "results" / "raw" / "2026-12-07_s42_callB_h100_ncu_raw_int4_span256.csv"
    rows, text = run(csv_path, tmp_path)
    assert len(rows) == 4  # layer 0: qkv, o, gate/up, down
    gate_up = rows[2]
    assert "SwiGluEpi" in gate_up["kernel"]
    assert round(gate_up["dram_read_mb"], 2) == 77.58 and round(gate_up["l2_read_miss_mb"], 2) == 65.05
    assert gate_up["dram_pct"] is None and gate_up["l2_hit_pct"] is None and gate_up["top_stalls"] == []
    assert [round(r["dram_read_mb"], 2) for r in rows] == [16.67, 13.15, 77.58, 44.10]
    assert "DRAM MB" in text
