#!/usr/bin/env bash
# The first device call of a session that inherits GPU code no device has run yet (session 23 left
# the int8 slice decode attention's byte conversion and the 16-byte quantizing K/V write): runs on
# the GPU machine from a carried bundle, ~4 minutes, and prints a table last.
#   scripts/gpu_pending.sh [BUNDLE]     (default gpu-bundle; made by scripts/gpu_bundle.sh)
# 1. The GPU tests of the pending kernels and of everything their dispatch touches (8-bit KV,
#    decode attention, the batch engine), with every other test skipped.
# 2. The 2048 x 128/128 throughput (issue #8) with bf16, fp8 and int8 KV caches, fp8 and int8 again
#    with KILN_ROPE_QUANT_VEC=1, and int8 with KILN_ATTN_Q8_SLICES=2 (the slice kernel for int8 too),
#    rounds interleaved.
# 3. Where the fp8 run's time goes: a full 2048-row decode step at 192 cached positions and the
#    run's admission step (1024 decode rows + 64 prompts of 128), each with the vec write off / on.
# Decide from the table: int8 slices by default when (1) passes and (2) is not slower
# (attention_decode_q8.cu `slices_default`); the vec write by default when it is faster.
set -uo pipefail
BUNDLE="${1:-gpu-bundle}"
source "$(dirname "$0")/gpu_env.sh" "$BUNDLE"

echo "== GPU tests of the pending kernels"
KILN_TEST_DATA_DIR="$PWD/tests/data" timeout 300 "$BUNDLE/tests/kiln_gpu_tests" \
  --gtest_filter='GpuKvQuant*:*Slice*:*Decode*:*Paged*:*Batch*:*Engine*' >"$OUT/pending_tests.log" 2>&1
tests_rc=$?
grep -E "^\[  FAILED  \]|Failure" "$OUT/pending_tests.log" | head -20
echo "rc=$tests_rc: $(grep -c '^\[       OK \]' "$OUT/pending_tests.log") ok"

throughput() {  # tag, kv cache, env...
  local tag=$1 kv=$2
  shift 2
  env "$@" "$K" bench throughput --random llama3-8b --num-prompts 2048 --input-len 128 --output-len 128 \
    --max-num-seqs 2048 --max-num-batched-tokens 8192 --temperature 0 --kv-cache "$kv" >"$OUT/tp_$tag.log" 2>&1
  grep -h "^Throughput" "$OUT/tp_$tag.log" | sed 's/.*, \([0-9.]*\) output tokens\/s/\1/'
}
declare -A tp
configs=("bf16 bf16" "fp8 fp8" "fp8_vec fp8 KILN_ROPE_QUANT_VEC=1" "int8 int8" "int8_vec int8 KILN_ROPE_QUANT_VEC=1"
         "int8_slices int8 KILN_ATTN_Q8_SLICES=2")
# KILN_PENDING_SHORT=1 (a device call with less time left): no int8 + vec run, no profiles.
SHORT="${KILN_PENDING_SHORT:-0}"
[ "$SHORT" = 1 ] && configs=("bf16 bf16" "fp8 fp8" "fp8_vec fp8 KILN_ROPE_QUANT_VEC=1" "int8 int8"
                             "int8_slices int8 KILN_ATTN_Q8_SLICES=2")
for r in 1 2; do
  for c in "${configs[@]}"; do
    read -r tag kv envs <<<"$c"
    tp[$tag]="${tp[$tag]:-} $(throughput "${tag}_r$r" "$kv" ${envs:-KILN_NOTHING=0})"
  done
done

profile() {  # tag, args...
  local tag=$1
  shift
  "$K" profile --random llama3-8b --kv-cache fp8 "$@" >"$OUT/profile_$tag.log" 2>&1
  KILN_ROPE_QUANT_VEC=1 "$K" profile --random llama3-8b --kv-cache fp8 "$@" >"$OUT/profile_${tag}_vec.log" 2>&1
}
if [ "$SHORT" != 1 ]; then
  profile decode_b2048 -b 2048 -c 192
  profile admission -b 1024 -c 160 --prompts 64 --prompt-len 128
fi

echo
echo "== summary"
echo "pending GPU tests rc=$tests_rc"
echo "2048 x 128/128 output tok/s (rounds 1 2):"
for c in "${configs[@]}"; do
  read -r tag _ envs <<<"$c"
  printf "  %-12s %-20s %s\n" "$tag" "${envs:-}" "${tp[$tag]}"
done
for f in decode_b2048 decode_b2048_vec admission admission_vec; do
  [ -f "$OUT/profile_$f.log" ] || continue
  echo "profile $f: $(grep -h 'sum of kernels' "$OUT/profile_$f.log" | sed 's/ (.*//')"
  grep -hE "^\| (rope_qkv|attention.decode|attention.prefill|kv_dequantize) " "$OUT/profile_$f.log" |
    awk -F'|' '{printf "    %-20s %10s us\n", $2, $4}'
done
