#!/usr/bin/env python3
"""Where a kernel's warps wait, instruction by instruction: reduces Nsight Compute's source page
(`ncu -i REPORT --page source --csv --print-source sass`, from a run with --section SourceCounters
and --section WarpStateStats; scripts/ncu_kernels.sh does both with NCU_SOURCE=1) to the share of
warp-state samples per stall reason and the instructions holding the most samples, each with its
top reasons. A kernel's time is where its warps stand; this says which instruction they stand at.

    scripts/ncu_stalls.py EXPORT.csv[.gz] [--top 8] [--json OUT]

An export may hold several kernels (each block starts with a "Kernel Name" row). Standard library
only: it runs on the GPU machine and here alike."""
import argparse
import csv
import gzip
import json
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def read_rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        return [r for r in csv.reader(f) if r]


def split_kernels(rows):
    """[(kernel name, header, data rows)] for each "Kernel Name" block of the export."""
    kernels, i = [], 0
    while i < len(rows):
        if rows[i][0] != "Kernel Name":
            i += 1
            continue
        name, header = rows[i][1] if len(rows[i]) > 1 else "", rows[i + 1]
        j = i + 2
        while j < len(rows) and rows[j][0] != "Kernel Name":
            j += 1
        kernels.append((name, header, rows[i + 2:j]))
        i = j
    return kernels


def as_int(text):
    try:
        return int(float(text.replace(",", ""))) if text else 0
    except ValueError:
        return 0


def reduce_kernel(name, header, data, top):
    col = {h: k for k, h in enumerate(header)}
    if SAMPLES not in col:
        raise SystemExit(f"no '{SAMPLES}' column: was the report taken with --section SourceCounters?")
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    totals = {h: 0 for h in reasons}
    total, hot = 0, []
    cell = lambda r, h: as_int(r[col[h]]) if col[h] < len(r) else 0  # short rows: missing cells are 0
    for r in data:
        s = cell(r, SAMPLES)
        total += s
        per = {}
        for h in reasons:
            v = cell(r, h)
            totals[h] += v
            if v:
                per[h[len("stall_"):]] = v
        if s:
            hot.append({"address": r[col["Address"]], "sass": r[col["Source"]].strip(), "samples": s,
                        "reasons": dict(sorted(per.items(), key=lambda kv: -kv[1])[:3])})
    hot.sort(key=lambda h: -h["samples"])
    share = {h[len("stall_"):]: 100.0 * v / total for h, v in sorted(totals.items(), key=lambda kv: -kv[1]) if v}
    for h in hot:
        h["share"] = 100.0 * h["samples"] / total
    return {"kernel": name, "samples": total, "stall_share_pct": share, "hottest": hot[:top]}


def print_kernel(k):
    print(f"== {k['kernel'][:120]}\n   {k['samples']} warp-state samples")
    for reason, pct in list(k["stall_share_pct"].items())[:10]:
        print(f"   {reason:20} {pct:5.1f}%")
    print("   the instructions with the most samples:")
    for h in k["hottest"]:
        why = " ".join(f"{r}={n}" for r, n in h["reasons"].items())
        print(f"   {h['share']:5.1f}%  {h['sass'][:52]:52} {why}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export", help="ncu --page source --csv export (.csv or .csv.gz)")
    ap.add_argument("--top", type=int, default=8, help="instructions to list per kernel")
    ap.add_argument("--json", help="write the reduction here too")
    a = ap.parse_args()
    kernels = [reduce_kernel(n, h, d, a.top) for n, h, d in split_kernels(read_rows(a.export))]
    if not kernels:
        sys.exit(f"{a.export}: no kernel in the export (expected a 'Kernel Name' row)")
    for k in kernels:
        print_kernel(k)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(kernels, f, indent=1)


if __name__ == "__main__":
    main()
