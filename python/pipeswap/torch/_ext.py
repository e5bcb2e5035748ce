"""The compiled extension pipeswap._C, checked against the torch this Python imports."""

from __future__ import annotations

from types import ModuleType

import torch

try:
    from .. import _C
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "pipeswap.torch needs the compiled extension pipeswap._C, which is missing or does not load "
        f"({e}). Build it against this torch: pip install --no-build-isolation . (from pipeswap's source)"
    ) from e


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:2])


if _major_minor(_C.torch_version) != _major_minor(torch.__version__):
    raise ImportError(
        f"pipeswap._C was built against torch {_C.torch_version} but this Python has torch "
        f"{torch.__version__}; torch's C++ ABI changes between releases. Rebuild pipeswap against this "
        "torch: pip install --no-build-isolation ."
    )


def extension() -> ModuleType:
    """The compiled runtime module ``pipeswap._C`` (``torch_version`` it was built for, ``has_cuda``)."""
    return _C
