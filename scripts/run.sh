#!/usr/bin/env bash
# The main job: builds pipeswap (installing missing Debian packages first) and runs the mock-device
# swap example, which writes a Perfetto trace. Extra arguments go to the program.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
build=${BUILD_DIR:-build}
[ -f "$build/build.ninja" ] || meson setup "$build" >/dev/null
ninja -C "$build" examples/mock_trace >/dev/null
exec "$build/examples/mock_trace" "$@"
