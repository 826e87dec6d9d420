#!/usr/bin/env bash
# Nsight Compute on chosen kernels of a `kiln profile` run (on the GPU machine), reduced to the
# figures that explain a kernel: duration, DRAM and SM throughput (% of peak), achieved
# occupancy, registers, shared memory, L2 hit rate and the top warp-stall reasons. Clocks are
# left alone (--clock-control none), as the device notes ask. docs/PERFORMANCE.md cites these tables.
#   [NCU_SKIP=N] scripts/ncu_kernels.sh BUNDLE_DIR [KERNEL_REGEX] [LAUNCH_COUNT] [-- kiln profile args...]
# e.g. scripts/ncu_kernels.sh gpu-bundle 'gemm|gemv' 8 -- --random llama3-8b -b 64 -c 512 --steps 1
# NCU_CACHE=none keeps L2 between the profiled launches (ncu flushes it before each by default: "all"),
# so a kernel meets the L2 its predecessors left, as in the step (session 41's L2-ahead run).
# NCU_METRICS=bytes asks only for the duration and the byte counters (DRAM read, L2 read requests and
# misses): one replay pass, so with NCU_CACHE=none each launch meets the L2 the step left, not the
# one ncu's save / restore between passes leaves (session 42's question of the int4 GEMVs' bytes).
# NCU_SKIP skips that many matching launches first (e.g. the prefill that fills the cache before a
# decode profile: 64 sequences x 512 tokens = 16 steps x 32 layers x 4 GEMMs = 2048).
# NCU_SOURCE=1: instead of the table, per-instruction warp-state sampling (SourceCounters,
# WarpStateStats) of the matching launches, saved as $OUT/ncu_source.ncu-rep, exported as
# $OUT/ncu_source.csv and reduced by scripts/ncu_stalls.py (which instruction the warps wait at, and
# why; session 15's run 3 is the example, performance/quantization.md).
set -euo pipefail
BUNDLE="${1:-gpu-bundle}"
REGEX="${2:-gemv|gemm|attention|rmsnorm|rope}"
COUNT="${3:-8}"
shift $(( $# < 3 ? $# : 3 ))
[ "${1:-}" = "--" ] && shift
PROFILE_ARGS=("$@")
[ ${#PROFILE_ARGS[@]} -eq 0 ] && PROFILE_ARGS=(--random llama3-8b -b 1 -c 512 --steps 1)
OUTDIR="${OUT:-.}"
# Which launches both modes profile, with the clocks left alone.
SELECT=(--clock-control none --cache-control "${NCU_CACHE:-all}" --kernel-name "regex:$REGEX"
        --launch-skip "${NCU_SKIP:-0}" --launch-count "$COUNT")
if [ "${NCU_SOURCE:-0}" = 1 ]; then
  ncu "${SELECT[@]}" --section SourceCounters --section WarpStateStats --section SpeedOfLight --section Occupancy --section LaunchStats \
    -f -o "$OUTDIR/ncu_source" "$BUNDLE/tools/kiln" profile "${PROFILE_ARGS[@]}" >"$OUTDIR/ncu.log" 2>&1 || {
    echo "ncu failed; see $OUTDIR/ncu.log"; tail -5 "$OUTDIR/ncu.log"; exit 1; }
  ncu -i "$OUTDIR/ncu_source.ncu-rep" --page source --csv --print-source sass >"$OUTDIR/ncu_source.csv"
  python3 "$(dirname "$0")/ncu_stalls.py" "$OUTDIR/ncu_source.csv" --json "$OUTDIR/ncu_stalls.json" |
    tee "$OUTDIR/ncu_stalls.txt"
  exit 0
fi
STALLS=(long_scoreboard short_scoreboard barrier mio_throttle lg_throttle math_pipe_throttle wait not_selected
        dispatch_stall drain membar no_instruction branch_resolving imc_miss sleeping tex_throttle)
METRICS=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
METRICS+=,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
METRICS+=,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,launch__shared_mem_per_block_static
METRICS+=,lts__t_sector_hit_rate.pct,launch__grid_size,launch__block_size
# Bytes: read from DRAM, asked of L2 by the SMs, and the part of those that missed (ncu_table.py).
BYTES=dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum
METRICS+=,$BYTES
for s in "${STALLS[@]}"; do METRICS+=",smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"; done
[ "${NCU_METRICS:-all}" = bytes ] && METRICS=gpu__time_duration.sum,launch__grid_size,$BYTES
ncu "${SELECT[@]}" --csv --page raw --print-units base \
  --metrics "$METRICS" "$BUNDLE/tools/kiln" profile "${PROFILE_ARGS[@]}" >"$OUTDIR/ncu_raw.csv" 2>"$OUTDIR/ncu.log" || {
  echo "ncu failed; see $OUTDIR/ncu.log"; tail -5 "$OUTDIR/ncu.log"; exit 1; }
python3 "$(dirname "$0")/ncu_table.py" "$OUTDIR/ncu_raw.csv" --json "$OUTDIR/ncu_table.json" |
  tee "$OUTDIR/ncu_table.txt"
