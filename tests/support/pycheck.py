"""Shared set-up of the Python cross-checks (tests/io/python_crosscheck.py,
tests/checkpoint/python_check.py): the packages they need, the tool they drive, and how they count
failures.

The checks need numpy and the `safetensors` package, the reference implementation of the format.
Debian 12 packages numpy but not safetensors; as the checkpoint issue asks, a missing package is
installed with pip into the user's site (the only download the test suite makes). When that is
impossible (no pip, no network) the check exits 77 (Meson's skip) and says what is missing.
"""
import importlib
import subprocess
import sys

SKIP = 77
failures = []
_tool = None


def _importable():
    try:
        import numpy  # noqa: F401
        import safetensors.numpy  # noqa: F401
        return None
    except ImportError as e:
        return str(e)


def require_packages(who):
    """Returns when numpy and safetensors import; installs them with pip first if needed."""
    missing = _importable()
    if missing is None:
        return
    print(f"{who}: {missing}; installing safetensors and numpy with pip", flush=True)
    try:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "safetensors", "numpy"],
                           capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"SKIP: {who} needs numpy and safetensors; cannot run pip for {sys.executable}: {e}")
        sys.exit(SKIP)
    if r.returncode != 0:
        print(f"SKIP: {who} needs numpy and safetensors; pip could not install them (no pip or no "
              f"network?):\n{r.stdout}{r.stderr}")
        sys.exit(SKIP)
    importlib.invalidate_caches()
    missing = _importable()
    if missing is not None:
        print(f"SKIP: {who}: safetensors/numpy still not importable after pip install: {missing}")
        sys.exit(SKIP)


def use_tool(path):
    global _tool
    _tool = path


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


def tool(*args):
    import subprocess
    return subprocess.run([_tool, *args], capture_output=True, text=True)
