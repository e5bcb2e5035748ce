"""pipeswap for PyTorch.

Optimizer state: ``SwapAdamW`` and ``SwapAdam`` replace ``torch.optim.AdamW`` and ``torch.optim.Adam``
in one line and give the same bits: each batch of parameters is updated by torch's own Adam/AdamW on
the device while pipeswap's C++ runtime moves the state (exp_avg, exp_avg_sq, max_exp_avg_sq)
between host and device around it.

Activations: ``ActivationSwap`` sends each (stage, micro-batch) forward's saved tensors to host memory
and brings them back before the backward, placed by pipeswap's injected pipeline order;
``pipeswap.torch.pipelining.offload_activations(schedule)`` does it inside torch.distributed.pipelining.
``DeviceBudget`` counts both jobs' device storage on a device in one budget.

See docs/pytorch.md.
"""

from ._activations import (
    ActivationSwap,
    check_orders,
    inject_swap_steps,
    order_text,
    orders_json,
    schedule_orders,
)
from ._ext import _C, extension
from ._optim import SwapAdam, SwapAdamW

DeviceBudget = _C.DeviceBudget

__all__ = [
    "ActivationSwap",
    "DeviceBudget",
    "SwapAdam",
    "SwapAdamW",
    "check_orders",
    "extension",
    "inject_swap_steps",
    "order_text",
    "orders_json",
    "schedule_orders",
]
