#!/usr/bin/env bash
# Configures and builds kiln in ./build (Release). CUDA code is built when nvcc is found
# (set KILN_CUDA=OFF to skip it). Incremental: a second run rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA="${KILN_CUDA:-AUTO}" > build.log 2>&1 || { cat build.log; exit 1; }
cmake --build build -j"$(nproc)" 2>&1 | tee -a build.log | grep -E "error|warning: " || true
test "${PIPESTATUS[0]}" -eq 0 || { tail -40 build.log; exit 1; }
echo "build: ok (build/tools/kiln)"
