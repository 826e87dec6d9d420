#!/usr/bin/env bash
# The whole CPU test suite: the libFuzzer targets for a bounded time (scripts/fuzz.sh), then every ctest test:
# unit, golden (default model vs llama.cpp fixtures), GPU tests (they skip without a GPU); then
# the HTTP server tests (tests/server, pytest + the official openai client against a real
# `kiln serve` on the default model, CPU) and the device-run report's tests (tests/scripts, on
# committed run outputs), in a venv under build/pyenv made on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fuzz.sh "${KILN_FUZZ_SECONDS:-60}"
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900

PYENV=build/pyenv
REQS=tests/server/requirements.txt
if [ ! -x "$PYENV/bin/pytest" ] || ! cmp -s "$REQS" "$PYENV/requirements.installed"; then
  python3 -m venv "$PYENV"
  "$PYENV/bin/pip" install -q --disable-pip-version-check -r "$REQS"
  cp "$REQS" "$PYENV/requirements.installed"
fi
"$PYENV/bin/pytest" -q -p no:cacheprovider tests/server tests/scripts
