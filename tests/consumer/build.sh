#!/usr/bin/env bash
# Configures, builds and runs the consumer project against this checkout (as a subproject).
set -euo pipefail
src=$1
build=$2
rm -rf "$build"
meson setup "$build" "$src" -Dpipeswap:tests=false -Dpipeswap:cuda=disabled >/dev/null
ninja -C "$build" >/dev/null
"$build/consumer"
