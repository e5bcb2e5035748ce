"""The Backend concept's rules (tests/backend/backend_rules_test.cpp, the same bodies the mock and the
CUDA backend pass) on the torch backend: C++ executables that scripts/test_python.sh builds with the
package (-Dtorch_backend_tests=true) and names in PIPESWAP_TORCH_RULES_DIR. The CUDA one skips (77)
without a device; PIPESWAP_REQUIRE_DEVICE=1 makes that a failure."""

import os
import subprocess

import pytest

RULES_DIR = os.environ.get("PIPESWAP_TORCH_RULES_DIR", "")


@pytest.mark.parametrize("exe", ["test_torch_backend_rules", "test_torch_backend_rules_cuda"], ids=["cpu", "cuda"])
def test_backend_rules(exe):
    if not RULES_DIR:
        pytest.skip("the C++ rule executables are built by scripts/test_python.sh (PIPESWAP_TORCH_RULES_DIR)")
    path = os.path.join(RULES_DIR, exe)
    if exe.endswith("_cuda") and not os.path.exists(path):
        pytest.skip("this torch has no CUDA: the CUDA path was not built")
    assert os.path.exists(path), f"{path} was not built"
    r = subprocess.run(
        [path], capture_output=True, text=True, timeout=300, env=dict(os.environ, BOOST_TEST_COLOR_OUTPUT="no")
    )
    if r.returncode == 77:
        pytest.skip(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0, r.stdout + r.stderr
