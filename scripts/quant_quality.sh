#!/usr/bin/env bash
# The quantization quality table (issue #10) on the CPU: perplexity and KL divergence from the bf16
# baseline for every weight format and KV-cache format, on the default model and an English corpus
# from a Debian package (python/quant_corpus.py says which text). Resumable: a configuration whose
# JSON exists is not run again. Writes bench/results/<date>_cpu_quant_quality.json and prints a table.
#
#   scripts/quant_quality.sh                       # all 198 windows of 512 (101k tokens)
#   KILN=build/tools/kiln WORK=build/quant-quality CHUNKS=198 THREADS=0 scripts/quant_quality.sh
#   ROWS="int8 int8-head" TAG=head CHUNKS=8 scripts/quant_quality.sh   # some rows, JSON ..._8chunks_head.json
#
# Needs ~5 GB in WORK for the baseline's stored log-probabilities.
set -euo pipefail
cd "$(dirname "$0")/.."
KILN=${KILN:-build/tools/kiln}
WORK=${WORK:-build/quant-quality}
CHUNKS=${CHUNKS:--1}
THREADS=${THREADS:-0}
CTX=${CTX:-512}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
PKG=debian-reference-en
PKG_VERSION=2.100
mkdir -p "$WORK"

# 1. The corpus: Debian's debian-reference-en package, fetched (no root needed) and unpacked.
# calib_long.txt: since session 13; tune.txt: since session 22
if [[ ! -f "$WORK/eval.txt" || ! -f "$WORK/calib_long.txt" || ! -f "$WORK/tune.txt" ]]; then
  deb=$(ls "$WORK"/${PKG}_*.deb 2>/dev/null | head -1 || true)
  if [[ -z "$deb" ]]; then
    (cd "$WORK" && apt-get download "$PKG=$PKG_VERSION")
    deb=$(ls "$WORK"/${PKG}_*.deb | head -1)
  fi
  dpkg-deb -x "$deb" "$WORK/pkg"
  python3 python/quant_corpus.py "$WORK/pkg/usr/share/debian-reference/debian-reference.en.txt.gz" "$WORK"
fi

# 2. The models: the bf16 baseline (the Q4_1 GGUF dequantized, rounded to bf16), then each format
#    quantized from it.
quantize() {  # name type [extra args]; SRC=file: quantize that file instead of the baseline
  local out="$WORK/$1.gguf"
  [[ -f "$out" ]] && return 0
  local src="${SRC:-$WORK/bf16.gguf}"
  [[ "$1" == bf16 ]] && src="$MODEL"
  "$KILN" quantize "$src" "$out" --type "$2" -t "$THREADS" "${@:3}" > "$WORK/$1.quantize.log" 2>&1
}

# 3. Perplexity of each configuration; the baseline stores its log-probs, the others compare.
ppl() {  # label model [args]
  local json="$WORK/$1.json"
  [[ -f "$json" ]] && return 0
  echo "== $1 ($(date -u +%H:%M:%S))"
  "$KILN" perplexity -m "$WORK/$2.gguf" -f "$WORK/eval.txt" -c "$CTX" --chunks "$CHUNKS" -t "$THREADS" \
      --device cpu --json "$json.tmp" "${@:3}" 2> "$WORK/$1.log" | tail -2
  mv "$json.tmp" "$json"
}

# ROWS="int8 int8-head ...": only these configurations (the baseline always runs); default: all.
want() { [[ -z "${ROWS:-}" || " $ROWS " == *" $1 "* ]]; }
quantize bf16 bf16
ppl bf16 bf16 --save-logits "$WORK/bf16.klb"
want int8 && quantize int8 int8 && ppl int8 int8 --kl-base "$WORK/bf16.klb"
want int4 && quantize int4 int4 && ppl int4 int4 --kl-base "$WORK/bf16.klb"
want int4-awq && quantize int4-awq int4 --calib "$WORK/calib.txt" && ppl int4-awq int4-awq --kl-base "$WORK/bf16.klb"
# The AWQ scales without the clipping search (what --calib did through session 8).
want int4-awq-noclip && quantize int4-awq-noclip int4 --calib "$WORK/calib.txt" --no-clip &&
  ppl int4-awq-noclip int4-awq-noclip --kl-base "$WORK/bf16.klb"
# The AWQ scales and clipping on the whole calibration text (14,848 tokens), then the codes through
# GPTQ instead of round-to-nearest; and the same calibration with round-to-nearest codes (the control).
want int4-awq-16k && quantize int4-awq-16k int4 --calib "$WORK/calib.txt" --calib-tokens 16384 &&
  ppl int4-awq-16k int4-awq-16k --kl-base "$WORK/bf16.klb"
want int4-awq-gptq && quantize int4-awq-gptq int4 --calib "$WORK/calib.txt" --calib-tokens 16384 --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-refit 0 --gptq-clip \
  --no-gptq-act-order --no-gptq-mse-grid && ppl int4-awq-gptq int4-awq-gptq --kl-base "$WORK/bf16.klb"
# Session 11: GPTQ with act-order (static group grids) and / or the MSE-chosen group range (both the
# default with --gptq since session 12).
want int4-awq-gptq-ao && quantize int4-awq-gptq-ao int4 --calib "$WORK/calib.txt" --calib-tokens 16384 --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-refit 0 --gptq-clip \
  --no-gptq-mse-grid && ppl int4-awq-gptq-ao int4-awq-gptq-ao --kl-base "$WORK/bf16.klb"
want int4-awq-gptq-mse && quantize int4-awq-gptq-mse int4 --calib "$WORK/calib.txt" --calib-tokens 16384 --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-refit 0 --gptq-clip \
  --no-gptq-act-order && ppl int4-awq-gptq-mse int4-awq-gptq-mse --kl-base "$WORK/bf16.klb"
want int4-awq-gptq-ao-mse && quantize int4-awq-gptq-ao-mse int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-refit 0 --gptq-clip && ppl int4-awq-gptq-ao-mse int4-awq-gptq-ao-mse --kl-base "$WORK/bf16.klb"
# Session 13: the same calibrated on 49,152 tokens of the longer calibration text (all of the book
# after the evaluation text), the AWQ search and GPTQ's Hessians (summed as the rows pass) alike.
want int4-awq-gptq-long && quantize int4-awq-gptq-long int4 --calib "$WORK/calib_long.txt" --calib-tokens 49152 \
  --gptq-samples 49152 --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-refit 0 --gptq-clip && ppl int4-awq-gptq-long int4-awq-gptq-long --kl-base "$WORK/bf16.klb"
# Session 13: GPTQ (act-order, MSE ranges) after the AWQ scales without the clipping search.
want int4-awq-noclip-gptq && quantize int4-awq-noclip-gptq int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --no-clip --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-refit 0 && ppl int4-awq-noclip-gptq int4-awq-noclip-gptq --kl-base "$WORK/bf16.klb"
# Session 14: the same, each group's scale and min then refit to GPTQ's codes (least squares in the
# output error); refit3: refit, GPTQ again on the refit grids, twice, then a last refit (--gptq's
# default since session 14, so the rows above pass --gptq-refit 0 to keep their meaning).
want int4-gptq-refit1 && quantize int4-gptq-refit1 int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-refit 1 && ppl int4-gptq-refit1 int4-gptq-refit1 --kl-base "$WORK/bf16.klb"
want int4-gptq-refit3 && quantize int4-gptq-refit3 int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-refit 3 && ppl int4-gptq-refit3 int4-gptq-refit3 --kl-base "$WORK/bf16.klb"
# Session 14: GPTQ in the forward's order (--gptq-sequential), without and with one refit.
want int4-gptq-seq && quantize int4-gptq-seq int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-sequential --gptq-refit 0 && ppl int4-gptq-seq int4-gptq-seq --kl-base "$WORK/bf16.klb"
want int4-gptq-seq-refit1 && quantize int4-gptq-seq-refit1 int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-sequential --gptq-refit 1 && ppl int4-gptq-seq-refit1 int4-gptq-seq-refit1 --kl-base "$WORK/bf16.klb"
# Session 14: five rounds (each row keeping its best).
want int4-gptq-refit5 && quantize int4-gptq-refit5 int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-refit 5 && ppl int4-gptq-refit5 int4-gptq-refit5 --kl-base "$WORK/bf16.klb"
# Session 14: less and more damping of H, with one refit.
want int4-gptq-refit1-damp001 && quantize int4-gptq-refit1-damp001 int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-refit 1 --gptq-damp 0.001 && ppl int4-gptq-refit1-damp001 int4-gptq-refit1-damp001 --kl-base "$WORK/bf16.klb"
want int4-gptq-refit1-damp1 && quantize int4-gptq-refit1-damp1 int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-refit 1 --gptq-damp 0.1 && ppl int4-gptq-refit1-damp1 int4-gptq-refit1-damp1 --kl-base "$WORK/bf16.klb"
# Session 15: more damping with --gptq's defaults (three refits): 3% and 10% of the mean diagonal.
want int4-gptq-damp03 && quantize int4-gptq-damp03 int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-damp 0.03 && ppl int4-gptq-damp03 int4-gptq-damp03 --kl-base "$WORK/bf16.klb"
want int4-gptq-damp1 && quantize int4-gptq-damp1 int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-damp 0.1 && ppl int4-gptq-damp1 int4-gptq-damp1 --kl-base "$WORK/bf16.klb"
# Session 18: GPTQ (--gptq's defaults) on the unscaled weights, without the AWQ scale search.
want int4-gptq-noawq && quantize int4-gptq-noawq int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-no-awq && ppl int4-gptq-noawq int4-gptq-noawq --kl-base "$WORK/bf16.klb"
# Session 20: coordinate descent on the codes after the refit rounds (two rounds of descent + refit;
# --gptq's default since session 20, so the GPTQ rows above pass --gptq-descent 0 to keep their
# meaning), and GPTQ in sequence with asymmetric calibration (each matrix fit to the
# unquantized model's outputs; run without descent).
want int4-gptq-descent && quantize int4-gptq-descent int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq --gptq-fit-damp 0 --gptq-descent 2 && ppl int4-gptq-descent int4-gptq-descent --kl-base "$WORK/bf16.klb"
want int4-gptq-asym && quantize int4-gptq-asym int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq --gptq-fit-damp 0 --gptq-descent 0 --gptq-asymmetric && ppl int4-gptq-asym int4-gptq-asym --kl-base "$WORK/bf16.klb"
want int4-gptq-gainfit && quantize int4-gptq-gainfit int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq --gptq-fit-damp 0 --gptq-descent 2 --gain-fit && ppl int4-gptq-gainfit int4-gptq-gainfit --kl-base "$WORK/bf16.klb"
# Session 21: the refit and descent on H damped by 1% and by 10% (--gptq's default since session 21,
# so the GPTQ rows above pass --gptq-fit-damp 0 to keep their meaning).
want int4-gptq-fitdamp && quantize int4-gptq-fitdamp int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq --gptq-descent 2 --gptq-fit-damp 0.01 && ppl int4-gptq-fitdamp int4-gptq-fitdamp --kl-base "$WORK/bf16.klb"
want int4-gptq-fitdamp10 && quantize int4-gptq-fitdamp10 int4 --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq --gptq-descent 2 --gptq-fit-damp 0.1 && ppl int4-gptq-fitdamp10 int4-gptq-fitdamp10 --kl-base "$WORK/bf16.klb"
# Session 22: the residual stream and values rotated first (--rotate): alone in bf16 (what the rotation
# itself costs), then with round-to-nearest int4 and with the default --gptq.
want rot-bf16 && quantize rot-bf16 bf16 --rotate && ppl rot-bf16 rot-bf16 --kl-base "$WORK/bf16.klb"
want int4-rot && quantize int4-rot int4 --rotate && ppl int4-rot int4-rot --kl-base "$WORK/bf16.klb"
want int4-gptq-rot && quantize int4-gptq-rot int4 --rotate --calib "$WORK/calib.txt" --calib-tokens 16384 \
  --gptq && ppl int4-gptq-rot int4-gptq-rot --kl-base "$WORK/bf16.klb"
# Session 22: the default --gptq file's grids tuned end to end against the baseline (--tune-epochs), on
# text GPTQ did not see (tune.txt), one gain a row or every group's scale and min.
gptq_default() {
  quantize int4-gptq-fitdamp10 int4 --calib "$WORK/calib.txt" --calib-tokens 16384 --gptq --gptq-descent 2 --gptq-fit-damp 0.1
}
tune() {  # name [extra args]
  gptq_default && SRC="$WORK/int4-gptq-fitdamp10.gguf" quantize "$1" int4 --calib "$WORK/calib.txt" \
    --tune-epochs 1 --tune-text "$WORK/tune.txt" --tune-tokens 16384 --tune-teacher "$WORK/bf16.gguf" "${@:2}" &&
    ppl "$1" "$1" --kl-base "$WORK/bf16.klb"
}
want int4-gptq-tune-rows && tune int4-gptq-tune-rows --tune-rows --tune-lr 1e-3
want int4-gptq-tune && tune int4-gptq-tune --tune-lr 3e-4
want int4-gptq-tune6 && tune int4-gptq-tune6 --tune-lr 6e-4
want int4-gptq-tune64 && tune int4-gptq-tune64 --tune-lr 3e-4 --tune-tokens 32768
want fp8 && quantize fp8 fp8 && ppl fp8 fp8 --kl-base "$WORK/bf16.klb"
want kv-int8 && ppl kv-int8 bf16 --kv-cache int8 --kl-base "$WORK/bf16.klb"
want kv-fp8 && ppl kv-fp8 bf16 --kv-cache fp8 --kl-base "$WORK/bf16.klb"
# int4 with the GGUF Q4 kernels' group of 32 (the default model's weights are Q4_1 g32 already).
want int4-g32 && quantize int4-g32 int4 --group 32 && ppl int4-g32 int4-g32 --kl-base "$WORK/bf16.klb"
# The output head quantized too (--head; the default model's head is its embedding: a quantized copy).
want int8-head && quantize int8-head int8 --head && ppl int8-head int8-head --kl-base "$WORK/bf16.klb"
want int4-g32-head && quantize int4-g32-head int4 --group 32 --head &&
  ppl int4-g32-head int4-g32-head --kl-base "$WORK/bf16.klb"
want fp8-head && quantize fp8-head fp8 --head && ppl fp8-head fp8-head --kl-base "$WORK/bf16.klb"
want int4-g32-head8 && quantize int4-g32-head8 int4 --group 32 --head-type int8 &&
  ppl int4-g32-head8 int4-g32-head8 --kl-base "$WORK/bf16.klb"

# 4. One JSON with every row, and the table.
python3 - "$WORK" "$PKG" "$PKG_VERSION" "$CHUNKS" "$CTX" "${TAG:-}" <<'PY'
import datetime, json, pathlib, platform, subprocess, sys
work, pkg, version, chunks, ctx, tag = pathlib.Path(sys.argv[1]), *sys.argv[2:]
rows = []
labels = [("bf16", "BF16 weights (baseline)"), ("int8", "INT8 weights (per channel)"),
          ("int4", "INT4 weights (g128/g64, RTN)"), ("int4-awq", "INT4 weights (g128/g64) + AWQ scales and clipping"),
          ("int4-awq-noclip", "INT4 weights (g128/g64) + AWQ scales, no clipping"),
          ("int4-awq-16k", "INT4 weights (g128/g64) + AWQ scales and clipping, 14,848 calibration tokens"),
          ("int4-awq-gptq", "INT4 weights (g128/g64) + AWQ scales and clipping, 14,848 tokens, GPTQ codes"),
          ("int4-awq-gptq-ao", "INT4 (g128/g64) + AWQ, 14,848 tokens, GPTQ with act-order"),
          ("int4-awq-gptq-mse", "INT4 (g128/g64) + AWQ, 14,848 tokens, GPTQ with MSE group ranges"),
          ("int4-awq-gptq-ao-mse", "INT4 (g128/g64) + AWQ, 14,848 tokens, GPTQ with act-order and MSE ranges"),
          ("int4-awq-noclip-gptq", "INT4 (g128/g64) + AWQ scales without clipping, 14,848 tokens, GPTQ (act-order, MSE ranges)"),
          ("int4-awq-gptq-long", "INT4 (g128/g64) + AWQ and GPTQ (act-order, MSE ranges) on 49,152 tokens of calib_long"),
          ("int4-gptq-refit1", "INT4 (g128/g64) + AWQ scales, 14,848 tokens, GPTQ, grids refit to the codes"),
          ("int4-gptq-refit3", "INT4 (g128/g64) + AWQ scales, 14,848 tokens, GPTQ and grid refit alternated (3 refits)"),
          ("int4-gptq-seq", "INT4 (g128/g64) + AWQ scales, 14,848 tokens, GPTQ in sequence"),
          ("int4-gptq-seq-refit1", "INT4 (g128/g64) + AWQ scales, 14,848 tokens, GPTQ in sequence, grids refit"),
          ("int4-gptq-refit5", "INT4 (g128/g64) + AWQ scales, 14,848 tokens, GPTQ and grid refit alternated (5 refits, best per row)"),
          ("int4-gptq-refit1-damp001", "INT4 (g128/g64) + AWQ scales, 14,848 tokens, GPTQ damped 0.1%, grids refit"),
          ("int4-gptq-refit1-damp1", "INT4 (g128/g64) + AWQ scales, 14,848 tokens, GPTQ damped 10%, grids refit"),
          ("int4-gptq-damp03", "INT4 (g128/g64) + AWQ scales, 14,848 tokens, GPTQ damped 3%, grids refit 3 rounds"),
          ("int4-gptq-damp1", "INT4 (g128/g64) + AWQ scales, 14,848 tokens, GPTQ damped 10%, grids refit 3 rounds"),
          ("int4-gptq-noawq", "INT4 (g128/g64), no AWQ scales, 14,848 tokens, GPTQ and grid refit alternated (3 refits)"),
          ("int4-gptq-descent", "INT4 (g128/g64) + AWQ scales, 14,848 tokens, GPTQ, 3 refits, 2 rounds of code descent + refit"),
          ("int4-gptq-asym", "INT4 (g128/g64) + AWQ scales, 14,848 tokens, GPTQ in sequence with asymmetric calibration, 3 refits"),
          ("int4-gptq-gainfit", "INT4 (g128/g64), the default --gptq, then input-channel gains fitted to the unquantized model"),
          ("int4-gptq-fitdamp", "INT4 (g128/g64), the default --gptq with the refit and descent on H damped by 1%"),
          ("int4-gptq-fitdamp10", "INT4 (g128/g64), the default --gptq with the refit and descent on H damped by 10%"),
          ("rot-bf16", "BF16 weights, residual stream and values rotated (--rotate)"),
          ("int4-rot", "INT4 weights (g128/g64, RTN), rotated first"),
          ("int4-gptq-rot", "INT4 (g128/g64), rotated first, then the default --gptq"),
          ("int4-gptq-tune-rows", "INT4 (g128/g64), the default --gptq, then one gain a row tuned end to end (KL to BF16)"),
          ("int4-gptq-tune", "INT4 (g128/g64), the default --gptq, then every group's scale and min tuned end to end (KL to BF16)"),
          ("int4-gptq-tune6", "INT4 (g128/g64), the default --gptq, then every group's scale and min tuned end to end, rate 6e-4"),
          ("int4-gptq-tune64", "INT4 (g128/g64), the default --gptq, then every group's scale and min tuned end to end on 64 windows"),
          ("int4-g32", "INT4 weights (g32, RTN)"),
          ("fp8", "FP8 E4M3 W8A8"), ("kv-int8", "BF16 weights, INT8 KV cache"),
          ("kv-fp8", "BF16 weights, FP8 KV cache"), ("int8-head", "INT8 weights and head"),
          ("int4-g32-head", "INT4 weights and head (g32, RTN)"),
          ("int4-g32-head8", "INT4 weights (g32, RTN), INT8 head"), ("fp8-head", "FP8 E4M3 W8A8, head too")]
for key, label in labels:
    f = work / f"{key}.json"
    if not f.exists():
        continue
    r = json.loads(f.read_text())
    size = (work / f"{'bf16' if key.startswith('kv') else key}.gguf").stat().st_size
    rows.append({"config": key, "label": label, "file_mib": round(size / 2**20, 2), **r})
base = next((r["ppl"] for r in rows if r["config"] == "bf16"), None)
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
out = {"date": datetime.date.today().isoformat(), "machine": f"{cpu}, {len(open('/proc/cpuinfo').read().split('processor')) - 1} cores",
       "commit": commit, "command": f"scripts/quant_quality.sh (CHUNKS={chunks}, CTX={ctx})",
       "corpus": f"{pkg} {version}: /usr/share/debian-reference/debian-reference.en.txt.gz, cut by python/quant_corpus.py",
       "model": "SmolLM2-135M-Instruct (Q4_1 GGUF dequantized, rounded to bf16 = baseline)", "rows": rows}
suffix = "" if chunks == "-1" else f"_{chunks}chunks"  # a shortened run is not the acceptance table
suffix += f"_{tag}" if tag else ""  # TAG: a run of some ROWS, kept apart from the full table
dest = pathlib.Path("bench/results") / f"{out['date']}_cpu_quant_quality{suffix}.json"
dest.write_text(json.dumps(out, indent=2) + "\n")
print(f"| configuration | file MiB | PPL | vs BF16 | mean KL | p99 KL | same top-1 |")
print(f"|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    rel = f"{100 * (r['ppl'] / base - 1):+.2f}%" if base else "-"
    kl = (f"{r['kl_mean']:.5f} | {r['kl_p99']:.4f} | {100 * r['same_top1']:.2f}%" if "kl_mean" in r else "- | - | -")
    print(f"| {r['label']} | {r['file_mib']} | {r['ppl']:.4f} ± {r['ppl_err']:.4f} | {rel} | {kl} |")
print(f"wrote {dest}")
PY
