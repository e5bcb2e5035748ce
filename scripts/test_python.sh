#!/usr/bin/env bash
# The PyTorch pass: builds the Python package pipeswap against torch and runs tests/python (pytest)
# with it; prints pytest's summary and writes its JUnit XML for scripts/count_results.py.
#
#   bash scripts/test_python.sh            # scripts/test.sh runs it after the C++ suite
#
# torch lives in a virtual environment outside the clone, created on the first run (python3 -m venv;
# pip install torch, about 2 minutes and 3 GB) and reused afterwards:
#   PIPESWAP_VENV           the environment (default ~/.cache/pipeswap/venv); one with torch already
#                           installed is used as it is (only what is missing gets installed)
#   PIPESWAP_TORCH_VERSION  the torch installed into a new environment (default 2.15.0)
#   PYTHON_BUILD_DIR        meson-python's build directory, kept for incremental rebuilds
#                           (default build-python)
#   PIPESWAP_TORCH_DEVICE   cpu (default) or cuda: the device tests/python runs on
# Extra arguments go to pytest (e.g. -k bitwise, -x).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv=${PIPESWAP_VENV:-$HOME/.cache/pipeswap/venv}
torch_version=${PIPESWAP_TORCH_VERSION:-2.15.0}
build=${PYTHON_BUILD_DIR:-build-python}
case "$build" in /*) ;; *) build="$root/$build" ;; esac
py="$venv/bin/python"

if [ ! -x "$py" ]; then
  echo "pipeswap: creating the virtual environment $venv (torch $torch_version: about 2 minutes, 3 GB)"
  python3 -m venv "$venv" || { echo "pipeswap: python3 -m venv failed (Debian's python3 needs python3-venv)"; exit 1; }
fi
need=()
"$py" -c "import torch" 2>/dev/null || need+=("torch==$torch_version")
for m in expecttest pytest mesonpy:meson-python numpy ruff; do
  "$py" -c "import ${m%%:*}" 2>/dev/null || need+=("${m##*:}")
done
"$venv/bin/meson" --version >/dev/null 2>&1 || need+=(meson)
"$venv/bin/ninja" --version >/dev/null 2>&1 || need+=(ninja)
if ((${#need[@]})); then
  echo "pipeswap: installing ${need[*]} into $venv"
  t0=$SECONDS
  "$venv/bin/pip" install -q --disable-pip-version-check "${need[@]}"
  echo "pipeswap: installed in $((SECONDS - t0)) s"
fi
"$py" -c "import torch; print('pipeswap: torch', torch.__version__, '(CUDA available)' if torch.cuda.is_available() else '(no GPU)')"

# The training frameworks tests/python runs SwapAdamW in (test_torchtitan.py, test_hf_trainer.py,
# test_lightning.py, test_frameworks_dist.py), at the versions tested. Installed with torch pinned to
# the version in use on the same command line, so pip never replaces torch; on a fresh environment
# they take about 3 minutes (700 MB), so the install runs while the package builds below.
# PIPESWAP_FRAMEWORKS=0 skips the install (their tests then skip).
frameworks=(torchtitan:torchtitan==0.3.0 transformers:transformers==5.25.0 accelerate:accelerate==1.16.0
  pytorch_lightning:pytorch-lightning==2.6.6)
frameworks_pid=
if [ "${PIPESWAP_FRAMEWORKS:-1}" != 0 ]; then
  need=()
  for f in "${frameworks[@]}"; do
    "$py" -c "import ${f%%:*}" 2>/dev/null || need+=("${f#*:}")
  done
  if ((${#need[@]})); then
    # The public version (2.15.0, not 2.15.0+cu132: the index lists no local versions; the pin
    # matches the installed build either way).
    torch_now=$("$py" -c "import torch; print(torch.__version__.split('+')[0])")
    echo "pipeswap: installing ${need[*]} into $venv (torch stays $torch_now), beside the build"
    frameworks_log=$(mktemp)
    ( t0=$SECONDS
      "$venv/bin/pip" install -q --disable-pip-version-check "torch==$torch_now" "${need[@]}" &&
        echo "pipeswap: frameworks installed in $((SECONDS - t0)) s" ) >"$frameworks_log" 2>&1 &
    frameworks_pid=$!
  fi
fi

# The package, built against that torch (no build isolation: it must not fetch another torch).
t0=$SECONDS
mkdir -p "$build"
# The same build also compiles the Backend rules for the torch backend (-Dtorch_backend_tests=true).
# A build directory Meson cannot reconfigure (options added since, another torch) is made afresh once.
build_package() {
  PATH="$venv/bin:$PATH" "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
    -Cbuild-dir="$build" -Csetup-args=-Dtorch_backend_tests=true . >"$build/pip-install.log" 2>&1
}
fail() { cat "$build/pip-install.log"; echo "pipeswap: building the Python package failed (log: $build/pip-install.log)"; exit 1; }
if ! build_package; then
  grep -q "^ *FAILED: " "$build/pip-install.log" && fail # a compile error: building again would not help
  echo "pipeswap: Meson could not reuse $build; once more from an empty build directory"
  rm -rf "$build" && mkdir -p "$build"
  build_package || fail
fi
echo "pipeswap: package built and installed in $((SECONDS - t0)) s"
if [ -n "$frameworks_pid" ]; then
  if ! wait "$frameworks_pid"; then
    cat "$frameworks_log"
    echo "pipeswap: installing the frameworks failed (PIPESWAP_FRAMEWORKS=0 runs without them)"
    exit 1
  fi
  cat "$frameworks_log" && rm -f "$frameworks_log"
fi

rm -f "$build/pytest-junit.xml"
cd tests/python
# One intra-op thread: the tensors are small, and on a shared machine torch's thread pool only
# oversubscribes the cores (the pass took 9 s to 110 s with it, depending on the load).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PIPESWAP_TORCH_RULES_DIR="$build/python" "$py" -m pytest -q -p no:cacheprovider --junitxml="$build/pytest-junit.xml" "$@"
