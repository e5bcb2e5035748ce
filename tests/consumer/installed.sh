#!/usr/bin/env bash
# Installs this build into a staging tree (meson install --destdir) and builds the consumer against
# it twice: a CMake project through find_package(pipeswap CONFIG), and a plain compiler command
# through pkg-config. Both programs must run.
#   installed.sh BUILD_DIR CONSUMER_SRC WORK_DIR CXX...
set -euo pipefail
build=$1 src=$2 work=$3
shift 3
rm -rf "$work"
mkdir -p "$work"
meson install -C "$build" --no-rebuild --quiet --destdir "$work/stage" >/dev/null
prefix=$(meson introspect "$build" --buildoptions |
  python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"))')
root="$work/stage$prefix"

# The library install holds no simulator (it is the pipeswap command's, installed only on request).
if [ -e "$root/include/pipeswap/sim.hpp" ] || [ -e "$root/include/pipeswap/sim" ]; then
  echo "the library install holds the simulator headers: $root/include/pipeswap/sim*" >&2
  exit 1
fi
test -f "$root/include/pipeswap/pipeswap.hpp"

echo "== CMake: find_package(pipeswap CONFIG) from $root"
cmake -S "$src/cmake" -B "$work/cmake-build" -G Ninja -DCMAKE_PREFIX_PATH="$root" \
  -DCMAKE_CXX_COMPILER="${!#}" -DCMAKE_BUILD_TYPE= >/dev/null
cmake --build "$work/cmake-build" >/dev/null
"$work/cmake-build/consumer"

echo "== pkg-config pipeswap from $root"
pcdir=$(dirname "$(find "$root" -name pipeswap.pc | head -n 1)")
flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --define-variable=prefix="$root" --cflags --libs pipeswap)
# The .pc file carries -std=c++20 itself: the consumer passes no -std of its own.
case " $flags " in *" -std=c++20 "*) ;; *) echo "pipeswap.pc lacks -std=c++20: $flags"; exit 1 ;; esac
# shellcheck disable=SC2086
"$@" "$src/main.cpp" $flags -o "$work/pkgconfig-consumer"
"$work/pkgconfig-consumer"
