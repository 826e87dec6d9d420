#!/usr/bin/env bash
# Batch-1 decode (tg128) under several environment settings, same binary, rounds interleaved so
# every setting sees the same machine; for switches that change how a decode step's kernels start
# or release each other, where only the end-to-end step tells.
#   scripts/tg_env_ab.sh BUNDLE ROUNDS NAME=ENV[,ENV...] ...      e.g. base=KILN_NOTHING=0 off=KILN_ATTN_EARLY_ROWS=0
# Llama-3-8B shape with random weights: bf16, int8 with an int8 head, int4 with an int4 head
# (KILN_TG_FORMATS to choose: "bf16 int8 int4"; KILN_TG_ARGS adds bench flags, e.g. "-d 4096").
# Logs under $OUT (default ./gpu-out); a line a run, then a table.
set -uo pipefail
BUNDLE="$1"
ROUNDS="$2"
shift 2
source "$(dirname "$0")/gpu_env.sh" "$BUNDLE"
read -r -a formats <<<"${KILN_TG_FORMATS:-bf16 int8 int4}"
declare -A tps
names=()
for setting in "$@"; do names+=("${setting%%=*}"); done
for r in $(seq 1 "$ROUNDS"); do
  for f in "${formats[@]}"; do
    args=(bench --random llama3-8b -p 0 -n 128 -r 3)
    [ "$f" != bf16 ] && args+=(--quant "$f" --quant-head "$f")
    read -r -a extra <<<"${KILN_TG_ARGS:-}"
    args+=("${extra[@]}")
    for setting in "$@"; do
      name="${setting%%=*}"
      IFS=, read -r -a envs <<<"${setting#*=}"
      log="$OUT/tg_${f}_${name}_r$r.log"
      env "${envs[@]}" "$K" "${args[@]}" >"$log" 2>&1
      v=$(grep -E "^\|\s+tg128" "$log" | awk -F'|' '{print $3}' | awk '{print $1}')
      tps["$f:$name"]="${tps["$f:$name"]:-} ${v:-ERR}"
      echo "$f $name round $r: ${v:-ERR} tok/s"
    done
  done
done
echo "== tg128 tok/s, Llama-3-8B shape, batch 1 (rounds: $ROUNDS)"
printf "%-8s" "format"
for n in "${names[@]}"; do printf " %-22s" "$n"; done
echo
for f in "${formats[@]}"; do
  printf "%-8s" "$f"
  for n in "${names[@]}"; do printf " %-22s" "${tps["$f:$n"]}"; done
  echo
done
