"""PyTorch optimizers whose state lives in pinned host memory between steps.

``SwapAdamW`` and ``SwapAdam`` replace ``torch.optim.AdamW`` and ``torch.optim.Adam`` in one line and
give the same bits: each batch of parameters is updated by torch's own Adam/AdamW on the device
while pipeswap's C++ runtime moves the state (exp_avg, exp_avg_sq, max_exp_avg_sq) between host and
device around it. See docs/pytorch.md.
"""

from ._optim import SwapAdam, SwapAdamW, extension

__all__ = ["SwapAdam", "SwapAdamW", "extension"]
