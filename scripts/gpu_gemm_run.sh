#!/usr/bin/env bash
# One device run of the GEMM work (session 4): GEMM / split-K / quant GPU tests, the kernel lab's GEMM
# table (--gemm), and prefill end to end with GEMM v4 and the default. Runs from gpu-bundle-gm/ (made by
# scripts/gpu_bundle.sh build-gm gpu-bundle-gm); logs to $OUT. Usage: gpu_gemm_run.sh [full]
B=gpu-bundle-gm
export LD_LIBRARY_PATH=$PWD/$B/src:/usr/local/cuda/lib64
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $O/smi.txt 2>&1
filter='GpuMatmul.Gemm*:GpuMatmul.SplitK*:GpuQuant*:*QuantBackend*:GpuAttention.*Prefill*'
[ "$1" = full ] && filter='*'
timeout 240 $B/tests/kiln_gpu_tests --gtest_filter="$filter" > $O/tests.log 2>&1; echo "tests rc=$?"
grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran" $O/tests.log | head -20
timeout 200 $B/bench/kernel_lab --gemm --json $O/lab.json > $O/lab.log 2>&1; echo "lab rc=$?"
grep -E "VALIDATION" $O/lab.log | head
for v in 4 0; do
  if [ $v = 0 ]; then unset KILN_GEMM_VERSION; else export KILN_GEMM_VERSION=$v; fi
  timeout 120 $B/tools/kiln bench --random llama3-8b -p 512 2048 -n 0 -r 3 > $O/bench_v$v.log 2>&1; echo "bench v$v rc=$?"
  grep -E "pp[0-9]" $O/bench_v$v.log
done
unset KILN_GEMM_VERSION
if [ "$1" = full ]; then
  timeout 100 $B/tools/kiln profile --random llama3-8b --prefill 2048 > $O/profile_pp2048.log 2>&1; echo "profile rc=$?"
  grep -E "gemm|total" $O/profile_pp2048.log | head -20
fi
grep -E "gemm-skinny" $O/lab.log | cut -c20-70
sed -n '/^gemm (TFLOP/,$p' $O/lab.log
