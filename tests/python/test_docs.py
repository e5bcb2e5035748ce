"""Every ```python block of docs/pytorch.md runs (on the CPU, in a fresh namespace); blocks opened
with ```python fragment are excerpts and are skipped."""

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "pytorch.md"
BLOCKS = [
    (m.start(), m.group(2))
    for m in re.finditer(r"^```python( fragment)?\n(.*?)^```", DOC.read_text(), re.S | re.M)
    if not m.group(1)
]


def test_the_page_has_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize(
    "code", [b for _, b in BLOCKS], ids=[f"line{DOC.read_text()[:i].count(chr(10)) + 1}" for i, _ in BLOCKS]
)
def test_example_runs(code):
    exec(compile(code, str(DOC), "exec"), {"__name__": "__docs__"})
