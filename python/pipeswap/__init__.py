"""pipeswap: optimizer state in pinned host memory, swapped to the accelerator just in time.

``pipeswap.torch`` holds the PyTorch optimizers (``SwapAdamW``, ``SwapAdam``). The runtime is
pipeswap's C++ library (``pipeswap._C``, built against the torch it imports); docs/pytorch.md is
the guide.
"""

from ._version import version as __version__

__all__ = ["__version__"]
