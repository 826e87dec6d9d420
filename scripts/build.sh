#!/usr/bin/env bash
# Configures and builds kiln in ./build (Release). CUDA code is built when nvcc is found
# (set KILN_CUDA=OFF to skip it). Incremental: a second run rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA="${KILN_CUDA:-AUTO}" > build.log 2>&1 || { cat build.log; exit 1; }
# The full log goes to build.log; errors and warnings are echoed. A failed build must fail this
# script, so the exit status is taken from cmake itself, not from the filter.
if ! cmake --build build -j"$(nproc)" >> build.log 2>&1; then
  grep -E "error" build.log | head -40
  tail -20 build.log
  exit 1
fi
grep -E "warning: " build.log | sort -u | head -20 || true
echo "build: ok (build/tools/kiln)"
