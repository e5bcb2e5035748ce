"""The Python package's house rules: ruff's lint and format over python/, tests/python and
examples/torch (configured in pyproject.toml, type hints of the package included), and one version
number, meson.build's."""

import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import pipeswap

ROOT = pathlib.Path(__file__).resolve().parents[2]


def ruff():
    """The ruff of this Python's environment (scripts/test_python.sh installs it), else PATH's."""
    here = pathlib.Path(sys.executable).parent / "ruff"
    found = str(here) if os.access(here, os.X_OK) else shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed in this environment (scripts/test_python.sh installs it: pip install ruff)")
    return found


@pytest.mark.parametrize("args", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(args):
    r = subprocess.run([ruff(), *args], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, f"ruff {' '.join(args)} (run it from {ROOT} to see or fix):\n{r.stdout}{r.stderr}"


def test_one_version_number():
    project = re.search(r"project\([^)]*?version:\s*'([^']+)'", (ROOT / "meson.build").read_text(), re.S)
    assert project, "meson.build's project() has no version"
    assert pipeswap.__version__ == project.group(1)
    assert importlib.metadata.version("pipeswap") == project.group(1)
    written = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "python").rglob("*.py")
        if re.search(r"__version__\s*=\s*['\"]", p.read_text())
    ]
    assert written == [], f"a version literal besides meson.build's: {written}"
