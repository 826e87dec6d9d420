#!/usr/bin/env python3
"""One line a profiled launch from Nsight Compute's raw CSV page (scripts/ncu_kernels.sh writes it).

    scripts/ncu_table.py NCU_RAW_CSV [--json PATH]

Columns: duration, DRAM and SM throughput (% of peak), achieved occupancy, registers, shared memory,
L2 hit rate, the top three warp stalls (cycles per issue) and, where the CSV has them (session 41
added them to ncu_kernels.sh), the bytes the launch read from DRAM, the bytes its SMs asked of L2
and the part of those that missed: a kernel whose DRAM bytes exceed its operands' bytes fetches
some of them twice, and the L2 columns say whether it asked twice (requests) or lost lines
between request and use (misses).
"""
import argparse
import csv
import json
import sys

STALL_PREFIX = "smsp__average_warps_issue_stalled_"
SECTOR_BYTES = 32


def read_rows(path):
    """Header and data rows of a `ncu --csv --page raw --print-units base` export; anything the
    profiled program printed before the header (kiln's own table) is skipped, and the row after the
    header holds the units."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    start = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    return rows[start], rows[start + 2:]


def launches(path):
    head, data = read_rows(path)
    col = {name: i for i, name in enumerate(head)}

    def num(r, name):
        i = col.get(name)
        if i is None or i >= len(r):
            return None
        try:
            return float(r[i].replace(",", ""))
        except ValueError:
            return None

    def mb(r, name, scale=1.0):
        v = num(r, name)
        return None if v is None else v * scale / 1e6

    stall_cols = [c for c in head if c.startswith(STALL_PREFIX)]
    out = []
    for r in data:
        named = ((num(r, c), c[len(STALL_PREFIX):].replace("_per_issue_active.ratio", "")) for c in stall_cols)
        stalls = sorted((s for s in named if s[0] is not None), reverse=True)[:3]
        smem = [num(r, "launch__shared_mem_per_block_dynamic"), num(r, "launch__shared_mem_per_block_static")]
        out.append({
            "kernel": r[col["Kernel Name"]].replace("(anonymous namespace)::", ""),
            "us": (num(r, "gpu__time_duration.sum") or 0.0) / 1e3,
            "dram_pct": num(r, "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            "sm_pct": num(r, "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
            "occupancy_pct": num(r, "sm__warps_active.avg.pct_of_peak_sustained_active"),
            "registers": num(r, "launch__registers_per_thread"),
            "smem_kb": None if None in smem else sum(smem) / 1024,
            "l2_hit_pct": num(r, "lts__t_sector_hit_rate.pct"),
            "dram_read_mb": mb(r, "dram__bytes_read.sum"),
            "l2_read_mb": mb(r, "lts__t_sectors_srcunit_tex_op_read.sum", SECTOR_BYTES),
            "l2_read_miss_mb": mb(r, "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum", SECTOR_BYTES),
            "top_stalls": [[name, value] for value, name in stalls],
        })
    return out


def fmt(v, spec, width):
    return f"{'-':>{width}}" if v is None else f"{v:{width}{spec}}"


def table(rows):
    bytes_cols = any(r["dram_read_mb"] is not None for r in rows)
    head = (f"{'kernel':48} {'us':>8} {'DRAM%':>6} {'SM%':>6} {'occ%':>5} {'regs':>5} {'smem KB':>8} {'L2 hit%':>7}"
            + (f" {'DRAM MB':>8} {'L2 rd MB':>8} {'miss MB':>8}" if bytes_cols else "")
            + "  top stalls (cycles per issue)")
    lines = [head]
    for r in rows:
        line = (f"{r['kernel'][:48]:48} {r['us']:8.1f} {fmt(r['dram_pct'], '.1f', 6)} {fmt(r['sm_pct'], '.1f', 6)}"
                f" {fmt(r['occupancy_pct'], '.1f', 5)} {fmt(r['registers'], '.0f', 5)} {fmt(r['smem_kb'], '.1f', 8)}"
                f" {fmt(r['l2_hit_pct'], '.1f', 7)}")
        if bytes_cols:
            line += (f" {fmt(r['dram_read_mb'], '.2f', 8)} {fmt(r['l2_read_mb'], '.2f', 8)}"
                     f" {fmt(r['l2_read_miss_mb'], '.2f', 8)}")
        line += "  " + ", ".join(f"{n} {v:.1f}" for n, v in r["top_stalls"])
        lines.append(line)
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = launches(args.csv)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
