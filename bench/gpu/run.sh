#!/usr/bin/env bash
# The GPU check: on a machine with one CUDA device (an H200 is what it is sized for), within about
# 8 minutes, builds what it needs, runs the CUDA test suite and bench/gpu/gpu_check (self-test,
# pinned bandwidth, optimizer-swap step times against the copy bound, bit-exactness against the
# no-swap run), and writes the figures. Then, when time is left (or alone with --torch-only), the
# PyTorch part, bench/gpu/torch_check.sh: the package built against the machine's torch, tests/python
# on CUDA, FSDP2 with one rank and a DCP round trip (bit-exact), SwapAdamW against
# torch.optim.AdamW(fused=True) on ~1 B parameters, and the activation offload example on ~1 B
# parameters next to `pipeswap simulate`'s prediction.
#
#   bash bench/gpu/run.sh [--quick] [--budget SECONDS] [--no-tests] [--no-torch | --torch-only]
#   bash bench/gpu/run.sh --prepare [BUILD_DIR]                          on the build machine
#
# --prepare (no GPU needed) fills bench/gpu/prebuilt/ (git-ignored) with stripped binaries that need
# only the driver, libc and libstdc++: gpu_check and cuda_adam_check (nvcc, static cudart) and the
# CUDA test executables of BUILD_DIR (default build/; static Boost.Test and cudart). Carry that
# folder to the GPU machine. There, prebuilt binaries are used when they run; otherwise gpu_check
# and cuda_adam_check are built with nvcc from the tree (no Boost, Meson or range-v3 needed) and the
# Boost test executables are skipped — gpu_check's self-test covers the kernels and the swap then.
#
# --prepare also fetches the expecttest wheel (pip download) into bench/gpu/prebuilt/wheels: torch's
# OptimizerInfo tests need it and the GPU machine has no network.
#
# Output: $OUT if set, else bench/gpu/out/: gpu_figures.json, gpu_check.log, tests.log, summary.md,
# and the PyTorch part's torch_*.{log,json,md}.
# Exit status: 0 everything passed; 1 a test or check failed; 77 no CUDA device; 2 setup problem.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/bench/gpu"
prebuilt="$here/prebuilt"
start=$(date +%s)
quick=0
budget=480
tests=1
prepare=0
torch_part=1
torch_only=0
build_dir="$root/build"

die() { echo "run.sh: $*" >&2; exit 2; }
left() { echo $((budget - ($(date +%s) - start))); }

while (($#)); do
  case "$1" in
    --quick) quick=1 ;;
    --budget) shift; budget=${1:?--budget needs seconds} ;;
    --no-tests) tests=0 ;;
    --no-torch) torch_part=0 ;;
    --torch-only) torch_only=1 ;;
    --prepare) prepare=1; if [ $# -gt 1 ] && [ "${2#--}" = "$2" ]; then shift; build_dir=$(cd "$1" && pwd); fi ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done

if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13/bin /opt/cuda/bin; do
    if [ -x "$d/nvcc" ]; then export PATH="$d:$PATH"; break; fi
  done
fi

nvcc_flags=(-std=c++20 -O2 '-gencode=arch=compute_90,code=[sm_90,compute_90]' -I"$root/include" -I"$root/tests"
  -Xcompiler=-pthread)

# gpu_check and cuda_adam_check with nvcc alone: two compilations in parallel, static cudart.
build_with_nvcc() {
  local out=$1
  command -v nvcc >/dev/null 2>&1 || die "nvcc not found (PATH, /usr/local/cuda/bin): cannot build gpu_check"
  mkdir -p "$out/obj"
  echo "run.sh: building gpu_check and cuda_adam_check with $(command -v nvcc) ..."
  local t0
  t0=$(date +%s)
  nvcc "${nvcc_flags[@]}" -c "$root/tests/cuda/adam_cuda.cu" -o "$out/obj/adam_cuda.o" &
  local p1=$!
  nvcc "${nvcc_flags[@]}" -c "$here/gpu_check.cpp" -o "$out/obj/gpu_check.o" &
  local p2=$!
  nvcc "${nvcc_flags[@]}" "$root/tests/optim/cuda_adam_check.cu" -o "$out/cuda_adam_check" &
  local p3=$!
  nvcc "${nvcc_flags[@]}" -c "$here/overlap_check.cpp" -o "$out/obj/overlap_check.o" &
  local p4=$!
  local ok=1
  wait $p1 || ok=0
  wait $p2 || ok=0
  wait $p3 || ok=0
  wait $p4 || ok=0
  ((ok)) || die "nvcc build failed"
  nvcc -Xcompiler=-pthread "$out/obj/gpu_check.o" "$out/obj/adam_cuda.o" -o "$out/gpu_check" || die "link of gpu_check failed"
  nvcc -Xcompiler=-pthread "$out/obj/overlap_check.o" "$out/obj/adam_cuda.o" -o "$out/overlap_check" || die "link of overlap_check failed"
  echo "run.sh: built in $(($(date +%s) - t0)) s"
}

cuda_tests=(test_cuda_adam_kernels test_cuda_adam_swap test_cuda_backend_rules test_cuda_backend test_cuda_errors
  test_cuda_checkpoint test_cuda_executor test_cuda_optimizer_swap)
# The programs that also hold mock-only cases run their CUDA ones (the filter of tests/meson.build).
test_args() {
  case $1 in
  test_cuda_checkpoint | test_cuda_executor) echo "--run_test=*cuda__backend>" ;;
  test_cuda_optimizer_swap) echo "--run_test=*cuda__backend>:phased/*cuda__backend>" ;;
  esac
}

if ((prepare)); then
  rm -rf "$prebuilt"
  mkdir -p "$prebuilt"
  build_with_nvcc "$prebuilt"
  rm -rf "$prebuilt/obj"
  if [ -f "$build_dir/build.ninja" ]; then
    targets=()
    for t in "${cuda_tests[@]}"; do targets+=("tests/$t"); done
    ninja -C "$build_dir" "${targets[@]}" || die "could not build the CUDA tests in $build_dir"
    for t in "${cuda_tests[@]}"; do strip -o "$prebuilt/$t" "$build_dir/tests/$t"; done
    # The command, for the activation example's comparison with `pipeswap simulate` (host code only).
    if ninja -C "$build_dir" examples/pipeswap/pipeswap; then
      strip -o "$prebuilt/pipeswap" "$build_dir/examples/pipeswap/pipeswap"
    fi
  else
    echo "run.sh: no Meson build in $build_dir: only gpu_check and cuda_adam_check are prebuilt"
  fi
  strip "$prebuilt/gpu_check" "$prebuilt/cuda_adam_check" "$prebuilt/overlap_check"
  if python3 -m pip download -q --no-deps --only-binary=:all: -d "$prebuilt/wheels" expecttest; then
    echo "run.sh: expecttest wheel in $prebuilt/wheels (for tests/python on the GPU machine)"
  else
    echo "run.sh: could not fetch the expecttest wheel; the GPU run skips torch's OptimizerInfo tests"
  fi
  du -sh "$prebuilt"
  echo "run.sh: carry bench/gpu/prebuilt to the GPU machine"
  exit 0
fi

out=${OUT:-$here/out}
mkdir -p "$out"

# The PyTorch part (bench/gpu/torch_check.sh). 77 from it (no torch, no device) is not a failure.
torch_check() {
  local targs=(--out "$out")
  ((quick)) && targs+=(--quick)
  set +e
  timeout "$1" bash "$here/torch_check.sh" "${targs[@]}"
  local st=$?
  set -e
  if [ $st -eq 77 ]; then echo "run.sh: PyTorch part skipped (see above)"; return 0; fi
  [ $st -eq 0 ] && echo "run.sh: PyTorch part passed" || echo "run.sh: PyTorch part FAILED with status $st"
  return $st
}
if ((torch_only)); then
  torch_check 600 && exit 0 || exit 1
fi
bin="$prebuilt"
if ! "$prebuilt/gpu_check" --version >/dev/null 2>&1 || [ ! -x "$prebuilt/cuda_adam_check" ]; then
  [ -d "$prebuilt" ] && echo "run.sh: the prebuilt binaries do not run here; building from the tree"
  bin="$here/build"
  build_with_nvcc "$bin"
fi

# The device first: without one, stop here with the reason.
set +e
"$bin/gpu_check" --probe
probe=$?
set -e
if [ $probe -eq 77 ]; then
  echo "run.sh: no CUDA device on this machine; nothing measured"
  exit 77
elif [ $probe -ne 0 ]; then
  die "gpu_check --probe failed with status $probe"
fi

failed=0
: > "$out/tests.log"
if ((tests)); then
  list=(cuda_adam_check "${cuda_tests[@]}")
  ((quick)) && list=(test_cuda_adam_kernels)
  for t in "${list[@]}"; do
    exe="$bin/$t"
    [ -x "$exe" ] || exe="$prebuilt/$t"
    if [ ! -x "$exe" ]; then
      echo "run.sh: $t: not available (needs --prepare on a machine with Boost); gpu_check's self-test stands in" | tee -a "$out/tests.log"
      continue
    fi
    if [ "${t#test_}" != "$t" ] && ! "$exe" --help >/dev/null 2>&1; then
      echo "run.sh: $t: does not run on this machine ($(ldd "$exe" 2>&1 | grep -m1 'not found' || echo 'see ldd')); gpu_check's self-test stands in" | tee -a "$out/tests.log"
      continue
    fi
    t0=$(date +%s)
    set +e
    # shellcheck disable=SC2046 # one argument or none
    PIPESWAP_REQUIRE_DEVICE=1 BOOST_TEST_COLOR_OUTPUT=no timeout 240 "$exe" $(test_args "$t") >>"$out/tests.log" 2>&1
    status=$?
    set -e
    if [ $status -eq 0 ]; then
      echo "run.sh: $t: passed ($(($(date +%s) - t0)) s)"
    else
      echo "run.sh: $t: FAILED with status $status ($(($(date +%s) - t0)) s; see tests.log)"
      failed=1
    fi
  done
fi

remaining=$(($(left) - 20))
((remaining > 30)) || remaining=30
args=(--out "$out/gpu_figures.json" --budget "$remaining")
((quick)) && args+=(--quick)
set +e
"$bin/gpu_check" "${args[@]}" 2>&1 | tee "$out/gpu_check.log"
status=${PIPESTATUS[0]}
set -e
[ "$status" -eq 0 ] || failed=1

# The overlapped optimizer step (#15): prefetch under a stand-in backward, deferred offload.
if [ -x "$bin/overlap_check" ] && (($(left) > 60)); then
  oargs=(--out "$out/overlap_figures.json")
  ((quick)) && oargs+=(--params 33554432)
  set +e
  "$bin/overlap_check" "${oargs[@]}" 2>&1 | tee "$out/overlap_check.log"
  status=${PIPESTATUS[0]}
  set -e
  [ "$status" -eq 0 ] || failed=1
fi

if ((torch_part)); then
  if (($(left) > 150)); then
    torch_check "$(left)" || failed=1
  else
    echo "run.sh: $(left) s left: no time for the PyTorch part; run it alone with bash bench/gpu/run.sh --torch-only"
  fi
fi

# The Markdown part of gpu_check's output, for the docs.
sed -n '/^## GPU figures/,$p' "$out/gpu_check.log" | grep -v '^gpu_check:' > "$out/summary.md" || true
echo "run.sh: $( ((failed)) && echo FAILED || echo passed ) in $(($(date +%s) - start)) s; output in $out"
exit $failed
