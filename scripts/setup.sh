#!/usr/bin/env bash
# Everything a fresh machine needs before kiln runs: packages, the build, the default model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
scripts/fetch_model.sh
