#!/usr/bin/env bash
# Batch-1 decode on the GPU machine, the decode megakernel against the fused kernels
# (KILN_MEGAKERNEL=0), same binary, rounds interleaved so both see the same machine:
#   scripts/decode_ab.sh [BUNDLE_DIR] [ROUNDS]     (default gpu-bundle, 2)
# Llama-3-8B shape with random weights: bf16, int8 with an int8 head, int4 with an int4 head;
# tg128 from an empty cache and at 4096 cached positions. Logs under $OUT (default ./gpu-out);
# a table last: tok/s per round, on / off.
set -uo pipefail
BUNDLE="${1:-gpu-bundle}"
ROUNDS="${2:-2}"
source "$(dirname "$0")/gpu_env.sh" "$BUNDLE"
configs=("bf16::" "int8:int8:" "int4:int4:" "bf16::4096" "int4:int4:4096")
declare -A tps
for r in $(seq 1 "$ROUNDS"); do
  for cfg in "${configs[@]}"; do
    IFS=: read -r q h d <<<"$cfg"
    args=(bench --random llama3-8b -p 0 -n 128 -r 3)
    [ "$q" != bf16 ] && args+=(--quant "$q")
    [ -n "$h" ] && args+=(--quant-head "$h")
    [ -n "$d" ] && args+=(-d "$d")
    for mk in 1 0; do
      log="$OUT/decode_${q}${h:+_head_$h}${d:+_d$d}_mk${mk}_r$r.log"
      KILN_MEGAKERNEL=$mk "$K" "${args[@]}" >"$log" 2>&1
      v=$(grep -E "^\|\s+tg128" "$log" | awk -F'|' '{print $3}' | awk '{print $1}')
      tps["$cfg:$mk"]="${tps["$cfg:$mk"]:-} ${v:-ERR}"
    done
  done
done
echo "== tg128 tok/s, Llama-3-8B shape, batch 1 (rounds: $ROUNDS)"
printf "%-22s %-24s %-24s\n" "weights:head:depth" "megakernel" "fused kernels"
for cfg in "${configs[@]}"; do
  printf "%-22s %-24s %-24s\n" "$cfg" "${tps["$cfg:1"]}" "${tps["$cfg:0"]}"
done
grep -h "decode step:" "$OUT"/decode_*_mk1_r1.log | sort -u
