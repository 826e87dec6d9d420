#!/usr/bin/env bash
# Runs on the GPU machine: kiln bench throughput over a list of configurations, each with a step
# trace, and prints a per-phase summary of each trace (decode-only steps vs steps with prefill).
#   scripts/throughput_sweep.sh BUNDLE CONFIG_FILE      (BUNDLE: what scripts/gpu_bundle.sh makes)
# CONFIG_FILE lines: tag|ENV=VALUE ...|extra `kiln bench throughput` arguments, e.g.
#   base_s2048|KILN_PREFILL_VARLEN=0 KILN_GEMM_ADD_BATCHED=0 KILN_ROPE_VEC=0|--max-num-seqs 2048
# Every run: NP (default 2048) prompts of 128 in / 128 out, greedy (docs/BENCHMARKS.md, session 5).
# Logs, JSON and traces go to $OUT/logs (default ./gpu-out/logs).
set -uo pipefail
B="$1"; CFG="$2"
OUT="${OUT:-./gpu-out}"
export LD_LIBRARY_PATH="$PWD/$B/src:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
mkdir -p "$OUT/logs"
while IFS='|' read -r tag envs args; do
  [ -z "$tag" ] && continue
  env $envs timeout 120 "$B/tools/kiln" bench throughput --random llama3-8b --num-prompts "${NP:-2048}" \
    --input-len 128 --output-len 128 --temperature 0 $args --json "$OUT/logs/$tag.json" \
    --step-trace "$OUT/logs/$tag.csv" >"$OUT/logs/$tag.log" 2>&1
  echo "== $tag [$envs] [$args] prompts ${NP:-2048} rc=$?"
  grep -E "Throughput|Engine|rror" "$OUT/logs/$tag.log"
  awk -F, 'NR > 1 { k = ($4 > 0) ? "mixed" : "decode"; n[k]++; f[k] += $9; h[k] += $6 + $7 + $8 + $10 + $11 + $12;
                    t[k] += $3 + $4 }
    END { for (k in n) printf "  %-6s steps %5d  tokens %7d  forward %8.1f ms (%.2f ms/step, %.0f tok/s)  host %7.1f ms\n",
          k, n[k], t[k], f[k], f[k] / n[k], 1000 * t[k] / f[k], h[k] }' "$OUT/logs/$tag.csv"
done <"$CFG"
