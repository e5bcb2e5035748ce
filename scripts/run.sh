#!/usr/bin/env bash
# The main job: builds the pipeswap command (installing missing Debian packages first) and simulates
# one training step of the built-in scenario — a 70B-class decoder on 8 H200-like pipeline ranks —
# without swap, with activation swap, with optimizer-state swap and with both. It prints the per-rank
# report and writes pipeswap_trace.json (Perfetto) and pipeswap_memory.svg. Extra arguments go to
# `pipeswap simulate` (for example --scenario FILE; see docs/cli.md).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
build=${BUILD_DIR:-build}
[ -f "$build/build.ninja" ] || meson setup "$build" >/dev/null
ninja -C "$build" examples/pipeswap/pipeswap >/dev/null
exec "$build/examples/pipeswap/pipeswap" simulate "$@"
