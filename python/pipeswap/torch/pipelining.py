"""Activation swap inside ``torch.distributed.pipelining``.

::

    schedule = Schedule1F1B(stage, n_microbatches=8, loss_fn=loss_fn)
    swap = pipeswap.torch.pipelining.offload_activations(schedule)
    schedule.step(x, target=y)          # as before

The seam: torch's schedules drive each stage through ``forward_one_chunk(micro, ...)`` and
``backward_one_chunk(micro, ...)``, one micro-batch at a time, on every schedule class. This module
wraps those two methods on the schedule's stage objects (and ``step`` on the schedule), so the
forward runs under pipeswap's saved-tensor hooks and every call moves the cursor of pipeswap's order
for the rank: the swap steps that pipeswap's injection placed between two compute steps run between
them. torch's ``pipeline_order`` IR would be the cleaner seam, but it has no OFFLOAD or RELOAD
action and ``register_custom_function`` refuses new action types, so the order runs beside it.

What this relies on (docs/pytorch.md, "What torch must provide for a cleaner seam"): the methods
``forward_one_chunk``, ``backward_one_chunk`` and ``step``; the attributes ``_stage``/``_stages``,
``_n_microbatches`` and, for multi-stage schedules, ``pipeline_order``; the stage's
``stage_index``, ``num_stages``, ``group_rank``, ``group_size`` and ``device``. If torch renames
one, :func:`offload_activations` fails at the call with the name it looked for, never later.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from ._activations import DEFAULT_MIN_BYTES, ActivationSwap, Order, Step, schedule_orders

__all__ = ["offload_activations", "rank_order"]


def _attr(obj: object, name: str, who: str) -> Any:
    try:
        return getattr(obj, name)
    except AttributeError:
        raise TypeError(
            f"offload_activations: {who} ({type(obj).__name__}) has no attribute {name!r}; this "
            "torch.distributed.pipelining differs from the versions pipeswap knows"
        ) from None


def _stages_of(schedule: Any) -> list[Any]:
    if hasattr(schedule, "_stages"):
        return list(schedule._stages)
    return [_attr(schedule, "_stage", "the schedule")]


def _kind_of(schedule: Any) -> str | None:
    from torch.distributed.pipelining import schedules as ts

    for cls, kind in (
        ("ScheduleGPipe", "gpipe"),
        ("Schedule1F1B", "1f1b"),
        ("ScheduleInterleaved1F1B", "interleaved_1f1b"),
    ):
        if type(schedule) is getattr(ts, cls, None):
            return kind
    return None


def _torch_order(schedule: Any, rank: int) -> list[Step]:
    """The rank's compute order from torch's own ``pipeline_order`` (multi-stage schedules)."""
    order = []
    for a in schedule.pipeline_order[rank]:
        if a is None:
            order.append(None)
            continue
        kind = str(getattr(a.computation_type, "value", a.computation_type))
        if kind == "F":
            order.append(("FWD", a.stage_index, a.microbatch_index))
        elif kind == "B":
            order.append(("BWD", a.stage_index, a.microbatch_index))
        elif kind in ("I", "W", "OVERLAP_F_B"):
            raise ValueError(
                f"offload_activations: {type(schedule).__name__} runs {a} on rank {rank}; "
                "pipeswap places swaps around full forwards and backwards (F, B) only"
            )
        # communication, resharding and gradient reduction: not compute slots, nothing to place
    return order


def _compute(order: Order) -> list[Step]:
    return [e for e in order if e is not None and e[0] in ("FWD", "BWD")]


def rank_order(schedule: Any) -> tuple[int, list[list[Step] | None], str]:
    """The rank's pipeline order that ``schedule`` runs, as pipeswap's schedule layer writes it.

    For GPipe, 1F1B and interleaved 1F1B this is pipeswap's own order of the same schedule (with its
    point-to-point steps), after checking that its compute steps are the ones torch runs; another
    multi-stage schedule gives torch's ``pipeline_order`` for the rank (compute steps only).
    Returns ``(rank, orders, source)``: every rank's order (a list; None for ranks whose order is not
    known), and ``"pipeswap"`` or ``"torch"`` for where the rank's order came from.
    """
    stages = _stages_of(schedule)
    s0 = stages[0]
    rank, ranks = _attr(s0, "group_rank", "the stage"), _attr(s0, "group_size", "the stage")
    micro = _attr(schedule, "_n_microbatches", "the schedule")
    stages_per_rank = len(stages)
    kind = _kind_of(schedule)
    # A multi-stage schedule executes its pipeline_order; a single-stage one runs its own loop (its
    # pipeline_order, where present, is a description that need not match what runs).
    multi = hasattr(schedule, "_stages")
    torch_order = _torch_order(schedule, rank) if multi and getattr(schedule, "pipeline_order", None) else None
    if kind is not None:
        orders = schedule_orders(kind, ranks, micro, stages_per_rank)
        ours = orders[rank]
        if torch_order is None or _compute(ours) == _compute(torch_order):
            return rank, orders, "pipeswap"
    if torch_order is None:
        raise ValueError(
            f"offload_activations: {type(schedule).__name__} is not a schedule pipeswap knows "
            "(ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B, or one with a pipeline_order)"
        )
    orders = [None] * ranks
    orders[rank] = torch_order
    return rank, orders, "torch"


def offload_activations(
    schedule: Any,
    *,
    min_bytes: int = DEFAULT_MIN_BYTES,
    load_lookahead: int = 1,
    offload_wait_delay: int = 1,
    offload: bool = True,
    on_swap_step: Callable[[str, int, int], None] | None = None,
) -> ActivationSwap:
    """Instruments ``schedule``'s stages of this rank so each micro-batch's saved activations go to
    host memory after its forward and come back before its backward, placed by pipeswap's injected
    order for the schedule. Returns the rank's :class:`ActivationSwap` (``stats()``, ``order``,
    ``order_text()``). ``offload=False`` runs the same instrumentation with no moves (the baseline's
    figures). Call it once per schedule, before its first ``step``.
    """
    stages = _stages_of(schedule)
    if getattr(schedule, "_pipeswap_activation_swap", None) is not None:
        raise RuntimeError("offload_activations: this schedule is instrumented already")
    rank, orders, source = rank_order(schedule)
    device = _attr(stages[0], "device", "the stage")
    swap = ActivationSwap(
        device,
        orders[rank],
        offload=offload,
        min_bytes=min_bytes,
        load_lookahead=load_lookahead,
        offload_wait_delay=offload_wait_delay,
        rank=rank,
        on_swap_step=on_swap_step,
    )
    swap.orders = [swap.order if r == rank else o for r, o in enumerate(orders)]
    swap.order_source = source
    _attr(schedule, "_has_backward", "the schedule")
    for st in stages:
        _instrument_stage(schedule, st, swap)
    _instrument_step(schedule, swap)
    schedule._pipeswap_activation_swap = swap
    return swap


def _training(schedule: Any) -> bool:
    """Whether the schedule's step trains: ``eval()`` runs ``step`` with ``_has_backward`` off, and a
    step under ``torch.no_grad()`` saves nothing. Anything else runs torch's own code untouched."""
    return schedule._has_backward and torch.is_grad_enabled()


def _instrument_stage(schedule: Any, stage: Any, swap: ActivationSwap) -> None:
    fwd = _attr(stage, "forward_one_chunk", "the stage")
    bwd = _attr(stage, "backward_one_chunk", "the stage")
    index = _attr(stage, "stage_index", "the stage")

    @functools.wraps(fwd)
    def forward_one_chunk(fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        if not _training(schedule):  # evaluation: torch's own forward, nothing moves
            return fwd(fwd_chunk_id, *args, **kwargs)
        with swap.forward(index, fwd_chunk_id):
            return fwd(fwd_chunk_id, *args, **kwargs)

    @functools.wraps(bwd)
    def backward_one_chunk(bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        if not _training(schedule):  # evaluation: torch's stage skips its backward; so does the order
            return bwd(bwd_chunk_id, *args, **kwargs)
        full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
        if not full:
            raise RuntimeError(
                f"pipeswap: rank {swap.rank}, stage {index}: a split backward (input, then "
                "weight) is not placed by pipeswap's order; use a schedule with full backwards"
            )
        with swap.backward(index, bwd_chunk_id):
            return bwd(bwd_chunk_id, *args, **kwargs)

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk


def _instrument_step(schedule: Any, swap: ActivationSwap) -> None:
    step = _attr(schedule, "step", "the schedule")

    @functools.wraps(step)
    def instrumented(*args: Any, **kwargs: Any) -> Any:
        if not _training(schedule):  # evaluation (eval(), or no grad): the order's cursor is not moved
            return step(*args, **kwargs)
        swap.begin()
        try:
            out = step(*args, **kwargs)
        except BaseException:
            swap.abort()
            raise
        swap.end()
        return out

    schedule.step = instrumented
