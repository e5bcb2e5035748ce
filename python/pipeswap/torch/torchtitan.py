"""pipeswap in torchtitan: its AdamW (and Adam) become SwapAdamW (SwapAdam) through torchtitan's own
override mechanism (``torchtitan.config.override``). The one line in a job:

    --override.imports pipeswap.torch.torchtitan.swap_adamw
    --override.imports 'pipeswap.torch.torchtitan.swap_adamw={"swap_times": 8}'   # with swap settings

(or ``config.override.imports = ["pipeswap.torch.torchtitan.swap_adamw"]`` in a config_registry
function). The override replaces the job's ``OptimizersContainer.Config`` with
``SwapOptimizersContainer.Config``, copying every field (param groups, implementation, factory
arguments); the container it builds is torchtitan's own ``OptimizersContainer`` (one optimizer per
model part and optimizer name, its FQN-keyed flat state dicts for the DCP checkpointer, its hooks),
except that the names ``"AdamW"`` and ``"Adam"`` build pipeswap's optimizers with the swap settings.
Other optimizer names (``"DistMuon"``, ...) are built by torchtitan as before.
"""

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torchtitan.components.optimizer import OptimizersContainer
from torchtitan.config.override import derive, override

from ._optim import SwapAdam, SwapAdamW

__all__ = ["SwapOptimizersContainer", "swap_adamw"]

_SWAPPED = {"AdamW": SwapAdamW, "Adam": SwapAdam}
_SETTINGS = ("swap_times", "packed", "resident_share", "defer_offload", "min_swap_numel")


def _check(swap: dict[str, Any], implementation: str) -> None:
    unknown = sorted(set(swap) - set(_SETTINGS))
    if unknown:
        raise TypeError(f"pipeswap.torch.torchtitan: unknown swap setting(s) {unknown}; known: {list(_SETTINGS)}")
    if implementation == "fused_opt_states_bf16":
        raise ValueError(
            "pipeswap.torch.torchtitan: optimizer.implementation='fused_opt_states_bf16' puts bfloat16 "
            "exp_avg/exp_avg_sq into optimizer.state from a step pre-hook; SwapAdamW keeps the state in its "
            "host stores in the parameters' dtype. Use 'fused', 'foreach' or 'for-loop'"
        )


class SwapOptimizersContainer(OptimizersContainer):
    """torchtitan's ``OptimizersContainer`` whose ``"AdamW"`` and ``"Adam"`` are pipeswap's
    ``SwapAdamW`` and ``SwapAdam``; each gets ``Config.swap`` as its swap settings."""

    @dataclass(kw_only=True, slots=True)
    class Config(OptimizersContainer.Config):
        swap: dict[str, Any] = field(default_factory=dict)
        """pipeswap's swap settings for every SwapAdamW/SwapAdam this container builds
        (swap_times, packed, resident_share, defer_offload, min_swap_numel); empty: the defaults."""

    def __init__(self, config: Config, *, model_parts: list[torch.nn.Module]) -> None:
        _check(config.swap, config.implementation)
        by_name = dict(config.optimizer_factory_kwargs_by_name)
        for name in _SWAPPED:
            by_name[name] = {**config.swap, **by_name.get(name, {})}
        super().__init__(replace(config, optimizer_factory_kwargs_by_name=by_name), model_parts=model_parts)

    @staticmethod
    def _resolve_optimizer_factory(name: str) -> type[torch.optim.Optimizer]:
        if name in _SWAPPED:
            return _SWAPPED[name]
        return OptimizersContainer._resolve_optimizer_factory(name)


@override(
    target=OptimizersContainer.Config,
    description="pipeswap: AdamW/Adam keep their state in host memory (SwapAdamW/SwapAdam)",
)
def swap_adamw(config: OptimizersContainer.Config, **swap: Any) -> SwapOptimizersContainer.Config:
    """The override: the job's optimizer config, every field kept, as a ``SwapOptimizersContainer``'s.
    Keyword arguments (JSON after ``=`` in ``--override.imports``) are the swap settings."""
    _check(swap, config.implementation)
    if isinstance(config, SwapOptimizersContainer.Config):
        swap = {**config.swap, **swap}
    return derive(config, SwapOptimizersContainer.Config, swap=swap)
