#!/usr/bin/env bash
# Copies the binaries the GPU machine runs (the kiln CLI, the GPU tests, the kernel lab and the one
# shared library they load) from a build folder into gpu-bundle/, keeping the layout their
# $ORIGIN/../src rpath expects, strips their symbols, and packs the folder into gpu-bundle.tgz
# (~15 MB): a device run whose working tree plus gpu-bundle/ (~50 MB) would pass a 64 MB transfer
# limit carries the .tgz and unpacks it there (`tar xzf gpu-bundle.tgz`).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
rm -rf gpu-bundle
mkdir -p gpu-bundle/src gpu-bundle/tools gpu-bundle/tests gpu-bundle/bench
cp "$BUILD/src/libkiln_cuda.so" gpu-bundle/src/
cp "$BUILD/tools/kiln" gpu-bundle/tools/
cp "$BUILD/tests/kiln_gpu_tests" gpu-bundle/tests/
cp "$BUILD/bench/kernel_lab" gpu-bundle/bench/
# kiln profile times kernels with CUPTI, loaded with dlopen (4 MB); without it, it falls back to
# CUDA events. The GPU machine's toolkit may lack it or have another version.
CUPTI="$(find /usr/local/cuda/lib64/ /usr/local/cuda/lib/ -name 'libcupti.so.1*' 2>/dev/null | head -1)"
[ -n "$CUPTI" ] && cp -L "$CUPTI" gpu-bundle/src/
strip --strip-unneeded gpu-bundle/src/libkiln_cuda.so gpu-bundle/tools/kiln gpu-bundle/tests/kiln_gpu_tests \
  gpu-bundle/bench/kernel_lab
tar czf gpu-bundle.tgz gpu-bundle
du -sh gpu-bundle gpu-bundle.tgz
