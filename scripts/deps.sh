#!/usr/bin/env bash
# Installs the Debian packages pipeswap builds with, when any is missing. Idempotent; uses apt only.
# Sourced or run by scripts/test.sh, scripts/run.sh and .ci/run.
set -euo pipefail
PIPESWAP_APT_PACKAGES=(meson ninja-build g++ cmake pkg-config python3 librange-v3-dev libboost-test-dev
  libbenchmark-dev nlohmann-json3-dev libcli11-dev clang clang-format libclang-rt-14-dev openmpi-bin libopenmpi-dev)
missing=()
for p in "${PIPESWAP_APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "pipeswap: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# nvcc is optional; make it visible to Meson when the toolkit sits in its usual place.
if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13/bin /opt/cuda/bin; do
    if [ -x "$d/nvcc" ]; then export PATH="$d:$PATH"; break; fi
  done
fi
