#!/usr/bin/env bash
# The PyTorch part of the GPU check (bench/gpu/run.sh calls it; it also runs on its own):
#   1. builds the Python package pipeswap against the torch of `python3` (no network: meson-python
#      through pip --no-build-isolation when it is installed, else Meson and ninja directly), into a
#      staging directory put on PYTHONPATH;
#   2. runs tests/python on CUDA (PIPESWAP_TORCH_DEVICE=cuda): bit-identity over torch's OptimizerInfo
#      inputs including the CUDA-only ones (capturable, tensor betas) and the foreach/fused variants,
#      state dicts, errors, phases, the backend's rules (its self-test). The OptimizerInfo tests need
#      expecttest: it is taken from a wheel in bench/gpu/prebuilt/wheels (run.sh --prepare fetches
#      one) when python3 lacks it, else those tests are skipped with that reason;
#   3. FSDP2 with one rank and a DCP round trip on CUDA, bit-exact against torch.optim.AdamW
#      (bench/gpu/torch_fsdp_check.py: ~34 M parameters, MixedPrecisionPolicy, dcp.save/dcp.load
#      flattened, the device peak of the load beside the step's; about a minute);
#   4. times a ~1 B-parameter step: SwapAdamW (packed, swap_times 8 and 16, prefetch on) against a
#      resident torch.optim.AdamW(fused=True) (bench/gpu/torch_bench.py);
#   5. runs the activation offload example (examples/torch/activation_offload.py) on ~1 B parameters
#      (BF16, 18 layers of width 2048, 2048 tokens per micro-batch, rank 0's 1F1B order over 4 stages,
#      8 micro-batches): torch's peak allocated memory with and without offload, the step-time
#      ratio, bit-identity of the gradients, and `pipeswap simulate` on the same shape when the
#      command is in bench/gpu/prebuilt (run.sh --prepare puts it there) or on PATH.
#
#   bash bench/gpu/torch_check.sh [--quick] [--out DIR] [--no-tests] [--no-bench] [--cpu]
#
# --cpu runs steps 1 to 3 on the CPU and step 4 as torch_bench.py --cpu-smoke (a check of this
# script on a machine without a GPU).
# TORCH_CHECK_BUILD=meson skips meson-python and builds with Meson directly; PYTHON names the Python.
#
# Output in DIR (default bench/gpu/out): torch_build.log, torch_tests.log, torch_figures.json,
# torch_summary.md, torch_fsdp.{log,json}, torch_activation.{log,json}. Exit status: 0 passed; 1 a test or check failed; 2 the build failed; 77 no CUDA
# device or no torch.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/bench/gpu"
out="$here/out"
quick=0
tests=1
bench=1
device=cuda
while (($#)); do
  case "$1" in
    --quick) quick=1 ;;
    --out) shift; out=${1:?--out needs a directory} ;;
    --no-tests) tests=0 ;;
    --no-bench) bench=0 ;;
    --cpu) device=cpu ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "torch_check.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
py=${PYTHON:-python3}
if ! "$py" -c "import torch" 2>/dev/null; then
  echo "torch_check: $py has no torch; nothing to do"
  exit 77
fi
"$py" -c "import torch; print('torch_check: torch', torch.__version__, 'CUDA', torch.version.cuda, 'devices', torch.cuda.device_count())"

# 1. The package, staged (not installed into the system's Python).
stage="$here/build-torch/stage"
bdir="$here/build-torch/meson"
rm -rf "$stage"
mkdir -p "$stage" "$bdir"
t0=$(date +%s)
: >"$out/torch_build.log"
built=0
if [ "${TORCH_CHECK_BUILD:-}" != meson ] && "$py" -c "import mesonpy" 2>/dev/null; then
  "$py" -m pip install --no-build-isolation --no-deps --no-index --target "$stage" -Cbuild-dir="$bdir" "$root" \
    >>"$out/torch_build.log" 2>&1 && built=1
fi
if ((!built)); then
  # Meson and ninja directly, with the Meson of this Python when it has one (so that the extension is
  # built for this Python), then the package's files copied next to the extension.
  meson=(meson)
  "$py" -c "import mesonbuild" 2>/dev/null && meson=("$py" -m mesonbuild.mesonmain)
  rm -rf "$bdir" && mkdir -p "$bdir"
  if "${meson[@]}" setup "$bdir" "$root" -Dpython=enabled -Dtests=false -Dexamples=false -Dcli=false -Dbench=false \
       -Dcompile_checks=false -Dcuda=disabled -Dmpi=disabled -Ddebug=false -Doptimization=2 \
       --native-file <(printf "[binaries]\npython = '%s'\n" "$(command -v "$py")") >>"$out/torch_build.log" 2>&1 &&
     ninja -C "$bdir" >>"$out/torch_build.log" 2>&1; then
    cp -r "$root/python/pipeswap" "$stage/"
    # The generated _version.py beside the extension, and the metadata pip would write (so that
    # importlib.metadata finds the package as installed).
    if cp "$bdir"/python/_C*.so "$bdir"/python/_version.py "$stage/pipeswap/" &&
       ver=$("$py" -c "import runpy, sys; print(runpy.run_path(sys.argv[1])['version'])" "$stage/pipeswap/_version.py") &&
       mkdir -p "$stage/pipeswap-$ver.dist-info"; then
      printf 'Metadata-Version: 2.1\nName: pipeswap\nVersion: %s\n' "$ver" >"$stage/pipeswap-$ver.dist-info/METADATA" && built=1
    fi
  fi
fi
if ((!built)); then
  tail -40 "$out/torch_build.log"
  echo "torch_check: building the package failed (see $out/torch_build.log)"
  exit 2
fi
echo "torch_check: package built in $(($(date +%s) - t0)) s"
export PYTHONPATH="$stage${PYTHONPATH:+:$PYTHONPATH}"
if ! "$py" -c "import expecttest" 2>/dev/null; then
  whl=$(ls "$here"/prebuilt/wheels/expecttest-*.whl 2>/dev/null | head -1)
  if [ -n "$whl" ]; then
    export PYTHONPATH="$PYTHONPATH:$whl" # a pure-Python wheel imports from the zip
  else
    echo "torch_check: no expecttest (neither installed nor in bench/gpu/prebuilt/wheels): the OptimizerInfo tests skip"
  fi
fi
if [ $device = cuda ] && ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 77)"; then
  echo "torch_check: torch sees no CUDA device; nothing measured"
  exit 77
fi

failed=0
# 2. The tests on CUDA.
if ((tests)); then
  t0=$(date +%s)
  if ! "$py" -c "import pytest" 2>/dev/null; then
    echo "torch_check: no pytest here: tests skipped" | tee "$out/torch_tests.log"
  else
    # Lint and format are the CPU pass's (the GPU image has no ruff). Node ids are relative to the
    # project's root (pyproject.toml).
    args=(-q -p no:cacheprovider --deselect tests/python/test_package.py::test_ruff)
    ((quick)) && args+=(-k "not bitwise or packed-3")
    req=1
    [ $device = cpu ] && req=0
    (cd "$root/tests/python" && PIPESWAP_TORCH_DEVICE=$device PIPESWAP_REQUIRE_DEVICE=$req timeout 600 \
       "$py" -m pytest "${args[@]}" --junitxml="$out/torch_tests.xml") >"$out/torch_tests.log" 2>&1
    status=$?
    tail -3 "$out/torch_tests.log"
    if [ $status -eq 0 ]; then
      echo "torch_check: tests on $device passed ($(($(date +%s) - t0)) s)"
    else
      echo "torch_check: tests on $device FAILED with status $status ($(($(date +%s) - t0)) s; see torch_tests.log)"
      failed=1
    fi
  fi
fi

# 3. FSDP2 with one rank and a DCP round trip (torch's distributed package on this device).
fargs=(--json "$out/torch_fsdp.json")
[ $device = cpu ] && fargs+=(--cpu)
((quick)) && fargs+=(--quick)
t0=$(date +%s)
timeout 150 "$py" "$here/torch_fsdp_check.py" "${fargs[@]}" >"$out/torch_fsdp.log" 2>&1
status=$?
grep -v -i "warn" "$out/torch_fsdp.log" | tail -14
if [ $status -eq 0 ]; then
  echo "torch_check: FSDP2 + DCP on $device passed ($(($(date +%s) - t0)) s)"
else
  echo "torch_check: FSDP2 + DCP on $device FAILED with status $status ($(($(date +%s) - t0)) s; see torch_fsdp.log)"
  failed=1
fi

# 4. The 1 B-parameter step.
if ((bench)); then
  bargs=(--out "$out/torch_figures.json")
  ((quick)) && bargs+=(--quick)
  [ $device = cpu ] && bargs+=(--cpu-smoke)
  "$py" "$here/torch_bench.py" "${bargs[@]}" 2>&1 | tee "$out/torch_bench.log"
  status=${PIPESTATUS[0]}
  [ "$status" -eq 0 ] || failed=1
  sed -n '/^## SwapAdamW/,$p' "$out/torch_bench.log" >"$out/torch_summary.md"
  sed -n '/^## FSDP2/,$p' "$out/torch_fsdp.log" >>"$out/torch_summary.md"

  sim=$(command -v pipeswap || true)
  [ -x "$here/prebuilt/pipeswap" ] && sim="$here/prebuilt/pipeswap"
  aargs=(--json "$out/torch_activation.json" ${sim:+--simulate "$sim"})
  if [ $device = cuda ]; then
    aargs+=(--device cuda --vocab 32000 --dim 2048 --layers 18 --heads 16 --seq 2048 --batch 1 --micro 8
      --stages 4 --min-bytes 1048576)
    ((quick)) && aargs+=(--layers 6 --steps 2)
  else
    aargs+=(--steps 1)
  fi
  echo "## Activation offload (examples/torch/activation_offload.py)" | tee "$out/torch_activation.log"
  "$py" "$root/examples/torch/activation_offload.py" "${aargs[@]}" 2>&1 | tee -a "$out/torch_activation.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
  cat "$out/torch_activation.log" >>"$out/torch_summary.md"
fi
exit $failed
