#!/usr/bin/env bash
# Runs on the GPU machine, from an already-built build folder (nothing is compiled here):
#   scripts/gpu_suite.sh [BUILD_DIR]      (default: build)
# Writes full logs under $OUT (default ./gpu-out) and prints a compact table last.
set -uo pipefail
BUILD="${1:-build}"
source "$(dirname "$0")/gpu_env.sh" "$BUILD"
status=0

echo "== nvidia-smi"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 || true

echo "== GPU tests ($BUILD/tests/kiln_gpu_tests)"
if [ -x "$BUILD/tests/kiln_gpu_tests" ]; then
  # The HF-fixture test reads tests/data from this checkout, wherever the build was made.
  KILN_TEST_DATA_DIR="${KILN_TEST_DATA_DIR:-$PWD/tests/data}" \
    timeout "${KILN_GPU_TEST_TIMEOUT:-300}" "$BUILD/tests/kiln_gpu_tests" >"$OUT/gpu_tests.log" 2>&1
  tests_rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|Failure|error" "$OUT/gpu_tests.log" | head -60
  [ $tests_rc -ne 0 ] && status=1
else
  echo "missing $BUILD/tests/kiln_gpu_tests"; tests_rc=127; status=1
fi

echo "== kernel lab ($BUILD/bench/kernel_lab)"
# KILN_SUITE_LAB: 1 (default) every bench of the lab; accept: what the acceptance report reads
# (decode GEMVs, attention, quantized decode GEMVs, the prefill GEMMs against cuBLAS), the
# residual-add GEMMs (--gemm-add) and the fp8 prefill GEMMs against cuBLASLt fp8 (--fp8-gemm;
# ~5 minutes in all); 0: none.
if [ "${KILN_SUITE_LAB:-1}" = 0 ]; then
  echo "skipped (KILN_SUITE_LAB=0)"; lab_rc=0
elif [ "${KILN_SUITE_LAB:-1}" = accept ] && [ -x "$BUILD/bench/kernel_lab" ]; then
  lab_rc=0
  for part in gemv attention decode gemm gemm-add fp8-gemm; do
    "$BUILD/bench/kernel_lab" --$part --json "$OUT/lab_$part.json" >"$OUT/lab_$part.log" 2>&1 || lab_rc=1
  done
  [ $lab_rc -ne 0 ] && status=1
  echo "lab_{gemv,attention,decode,gemm,gemm-add,fp8-gemm}.log rc=$lab_rc"
elif [ -x "$BUILD/bench/kernel_lab" ]; then
  "$BUILD/bench/kernel_lab" --json "$OUT/kernel_lab.json" 2>&1 | tee "$OUT/kernel_lab.log"
  lab_rc=${PIPESTATUS[0]}
  [ $lab_rc -ne 0 ] && status=1
else
  echo "missing $BUILD/bench/kernel_lab"; lab_rc=127; status=1
fi

echo "== engine and profile (Llama-3-8B shape, random bf16 weights)"
"$K" profile --calibrate >"$OUT/profile_calibrate.log" 2>&1 || status=1
for b in 1 64 256; do
  "$K" profile --random llama3-8b -b $b -c 512 --json "$OUT/profile_b$b.json" --svg "$OUT/roofline_b$b.svg" \
    >"$OUT/profile_b$b.log" 2>&1 || status=1
done
"$K" profile --random llama3-8b --prefill 2048 --json "$OUT/profile_pp2048.json" --svg "$OUT/roofline_pp2048.svg" \
  >"$OUT/profile_pp2048.log" 2>&1 || status=1
"$K" bench throughput --random llama3-8b --num-prompts 2048 --input-len 128 --output-len 128 --max-num-seqs 2048 \
  --max-num-batched-tokens 8192 --temperature 0 --json "$OUT/throughput.json" >"$OUT/throughput.log" 2>&1 || status=1
# The same with 8-bit KV caches (the 8-bit slice decode attention and the 16-byte quantizing K/V
# write, both default since session 26).
for kv in fp8 int8; do
  "$K" bench throughput --random llama3-8b --num-prompts 2048 --input-len 128 --output-len 128 --max-num-seqs 2048 \
    --max-num-batched-tokens 8192 --temperature 0 --kv-cache $kv --json "$OUT/throughput_kv_$kv.json" \
    >"$OUT/throughput_kv_$kv.log" 2>&1 || status=1
done
"$K" bench --random llama3-8b -p 512,2048 -n 128 -r 3 --json "$OUT/bench.json" >"$OUT/bench.log" 2>&1 || status=1
# Quantized projections (issue #10): the same shape with random int8 / int4 / fp8 weights.
for q in int8 int4 fp8; do
  "$K" bench --random llama3-8b --quant $q -p 2048 -n 128 -r 3 --json "$OUT/bench_$q.json" >"$OUT/bench_$q.log" 2>&1 ||
    status=1
done
# The head quantized too (--quant-head): int8 layers with an int8 head (llama.cpp's Q8_0), int4 with
# an int8 head (what `kiln quantize --head-type int8` writes) and with an int4 head.
for qh in int8:int8 int4:int8 int4:int4; do
  q=${qh%:*} h=${qh#*:}
  "$K" bench --random llama3-8b --quant $q --quant-head $h -p 0 -n 128 -r 3 --json "$OUT/bench_${q}_head_$h.json" \
    >"$OUT/bench_${q}_head_$h.log" 2>&1 || status=1
done
# Long context (issue #7): prefill of 16k tokens, decode with 32k tokens cached.
"$K" bench --random llama3-8b -p 16384 -n 0 -r 2 --json "$OUT/bench_pp16384.json" >"$OUT/bench_pp16384.log" 2>&1 ||
  status=1
"$K" bench --random llama3-8b -p 0 -n 128 -d 32768 -r 2 --json "$OUT/bench_tg_d32768.json" \
  >"$OUT/bench_tg_d32768.log" 2>&1 || status=1
# PyTorch SDPA on the kernel lab's attention shapes, the same-run baseline (where torch is installed;
# KILN_SUITE_SDPA=0 skips it, ~1 minute).
if [ "${KILN_SUITE_SDPA:-1}" != 0 ] && python3 -c "import torch" 2>/dev/null; then
  python3 bench/torch_baseline.py --sdpa --json "$OUT/torch_sdpa.json" >"$OUT/torch_sdpa.log" 2>&1 || status=1
fi

# Hook for more whole-model runs: add commands to KILN_BENCH_CMDS, one per line. Each one's
# output goes to $OUT/kiln_bench_N.log.
n=0
while IFS= read -r cmd; do
  [ -z "$cmd" ] && continue
  n=$((n + 1))
  echo "== kiln bench $n: $cmd"
  bash -c "$cmd" >"$OUT/kiln_bench_$n.log" 2>&1 || status=1
  tail -20 "$OUT/kiln_bench_$n.log"
done <<<"${KILN_BENCH_CMDS:-}"

echo
echo "== summary"
echo "gpu tests rc=$tests_rc: $(grep -cE '^\[       OK \]' "$OUT/gpu_tests.log" 2>/dev/null || true) ok," \
     "$(grep -cE '^\[  FAILED  \] [A-Za-z]' "$OUT/gpu_tests.log" 2>/dev/null || true) failed lines," \
     "$(grep -cE '^\[  SKIPPED \] [A-Za-z]' "$OUT/gpu_tests.log" 2>/dev/null || true) skipped lines"
if [ -f "$OUT/kernel_lab.json" ] && command -v python3 >/dev/null; then
  python3 - "$OUT/kernel_lab.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"copy ceiling {d['copy_gbs']:.0f} GB/s, peak {d['peak_tflops']} TFLOP/s ({d['device']})")
print(f"{'kernel':10} {'shape':28} {'ver':7} {'us':>9} {'GB/s':>7} {'%copy':>6} {'TFLOP/s':>8} {'%peak':>6}")
for r in d['results']:
    if r['kernel'] == 'copy': continue
    print(f"{r['kernel']:10} {r['shape']:28} {r['version']:7} {r['us']:9.1f} {r['gbs']:7.0f} {r['pct_copy']:6.1f} {r['tflops']:8.1f} {r['pct_peak']:6.1f}")
PY
fi
echo
echo "== end to end (Llama-3-8B shape, bf16)"
tail -1 "$OUT/profile_calibrate.log" 2>/dev/null
grep -h "sum of kernels" "$OUT"/profile_*.log 2>/dev/null
grep -h "^Throughput" "$OUT/throughput.log" 2>/dev/null
for f in throughput_kv_fp8 throughput_kv_int8; do
  echo "$f: $(grep -h "^Throughput" "$OUT/$f.log" 2>/dev/null)"
done
grep -hE "^\|\s+(pp|tg)" "$OUT/bench.log" 2>/dev/null
for q in int8 int4 fp8; do grep -hE "^\|\s+(pp|tg)" "$OUT/bench_$q.log" 2>/dev/null | sed "s/^/$q /"; done
for f in "$OUT"/bench_*_head_*.log; do
  [ -f "$f" ] && grep -hE "^\|\s+tg" "$f" | sed "s/^/$(basename "$f" .log | sed 's/^bench_//') /"
done
echo "lab rc=$lab_rc; logs in $OUT"
echo
echo "== acceptance lines of the open issues, this run only"
python3 "$(dirname "$0")/acceptance_report.py" "$OUT" --json "$OUT/acceptance.json" || status=1
exit $status
