#!/usr/bin/env bash
# Installs what kiln builds with, from Debian 12's packages. Idempotent: a second run only checks.
set -euo pipefail
packages=(build-essential cmake ccache pkg-config git unzip python3 python3-venv python3-pip
          libgtest-dev libbenchmark-dev libboost-dev nlohmann-json3-dev libcli11-dev libfmt-dev libpcre2-dev libutf8proc-dev
          clang libclang-rt-14-dev
          chromium)  # chromium: the chat page test (tests/server/test_chat_page.py)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
