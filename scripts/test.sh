#!/usr/bin/env bash
# The whole CPU test suite: the GGUF parser fuzzer for a bounded time, then every ctest test:
# unit, golden (default model vs llama.cpp fixtures), GPU tests (they skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fuzz.sh "${KILN_FUZZ_SECONDS:-60}"
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
