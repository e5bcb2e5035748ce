"""ActivationSwap: each (stage, micro-batch) forward's saved tensors go to host memory after the
forward and come back before the backward, at the points pipeswap's swap-step injection places in the
rank's pipeline order.

The saved tensors are caught with ``torch.autograd.graph.saved_tensors_hooks`` around each forward;
pipeswap's C++ activation manager (``pipeswap._C.SavedTensors``, over the torch backend and the
device's shared copy streams) holds their storages and moves them. The order is a cursor: each
forward and backward the training loop runs must be the next compute step of the order, and the
swap steps between two compute steps run between them. docs/pytorch.md, "Activations", is the guide.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Callable, NoReturn, Optional, Union

import torch

from ._ext import _C

_SWAP = {
    "SWAP_SET_GROUP",
    "SWAP_LAUNCH_OFFLOAD",
    "SWAP_WAIT_OFFLOAD",
    "SWAP_LAUNCH_LOAD",
    "SWAP_WAIT_LOAD",
}
DEFAULT_MIN_BYTES = 1 << 20

#: One entry of a pipeline order: None (a bubble), (kind, stage, micro), or a composite
#: (kind, None, None, leaves).
Step = Optional[tuple[Any, ...]]
Order = Sequence[Step]
DeviceLike = Union[torch.device, str, int]


def schedule_orders(kind: str, ranks: int, micro: int, stages_per_rank: int = 1) -> list[list[Step]]:
    """Every rank's order of a pipeline schedule, point-to-point steps included.

    ``kind`` is ``"gpipe"``, ``"1f1b"`` or ``"interleaved_1f1b"`` (``stages_per_rank`` stages per rank, loop
    placement: rank r runs stages r, r + ranks, ...). An entry is ``None`` (a bubble) or a tuple
    ``(kind, stage, micro)``; the same orders as ``pipeswap schedule``. An unknown kind, or
    ``stages_per_rank`` other than 1 for a one-stage-per-rank schedule, raises ``ValueError``.
    """
    return _C.schedule_orders(kind, ranks, micro, stages_per_rank)


def inject_swap_steps(order: Order, load_lookahead: int = 1, offload_wait_delay: int = 1) -> list[Step]:
    """``order`` with pipeswap's activation swap steps injected (docs/schedules.md)."""
    return _C.inject_swap_steps(list(order), load_lookahead, offload_wait_delay)


def check_orders(orders: Sequence[Order], stages_per_rank: int = 1) -> str:
    """Problems of several ranks' orders (swap life cycles, matched sends and receives, deadlock),
    as text; empty when the schedule is valid. The same checks as ``pipeswap validate``."""
    return _C.check_orders([list(o) for o in orders], stages_per_rank)


def orders_json(orders: Sequence[Order]) -> dict[str, list[list[dict[str, Any] | None]]]:
    """``{"ranks": [...]}``, the JSON ``pipeswap validate`` reads."""

    def entry(e: Step) -> dict[str, Any] | None:
        if e is None:
            return None
        d = {"type": e[0], "stage": e[1], "micro": e[2]}
        if len(e) == 4:
            d["sub"] = [entry(x) for x in e[3]]
        return d

    return {"ranks": [[entry(e) for e in o] for o in orders]}


def order_text(order: Order) -> str:
    """One line per entry: ``FWD 0.3``, ``SWAP_LAUNCH_LOAD 0.1``, ``-`` for a bubble."""
    return "\n".join("-" if e is None else f"{e[0]} {e[1]}.{e[2]}" for e in order)


def _require_int(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"ActivationSwap: {name} must be an integer >= {least}, got {value!r}")


class ActivationSwap:
    """The activation swap of one rank.

    ``order`` is the rank's pipeline order (entries ``None`` or ``(kind, stage, micro)``, as
    :func:`schedule_orders` gives them; point-to-point and other steps are kept for the placement
    and skipped when running, since torch does the communication). With ``offload=True`` pipeswap's swap steps
    are injected into it (``load_lookahead`` and ``offload_wait_delay`` as in
    ``pipeswap schedule --inject``); with ``offload=False`` nothing moves, and the saved tensors are
    only counted, which gives the figure to compare against.

    ``min_bytes``: storages smaller than this stay on the device. ``rank`` names the rank in errors.
    ``on_swap_step(kind, stage, micro)``, if given, is called before each swap step runs (tracing, or
    checks such as ``stats()["moved_alive"] == 0`` before a load).

    Use::

        swap.begin()                       # or implicitly, at the first forward
        with swap.forward(stage, micro):   # under saved_tensors_hooks
            out = stage_module(x)
        with swap.backward(stage, micro):
            out.backward(grad)
        swap.end()                         # the order must be complete

    A forward or backward out of order raises ``RuntimeError`` naming what the order expected; a
    failure inside one, or in a swap step, aborts the step, as a failed step is over in torch: every
    group is released (a graph of that step then fails at the saved tensors the swap moved), and the
    error is raised again as itself (its type kept: ``torch.OutOfMemoryError`` for a strict budget
    that refuses a load, the stage's own exception for a failing forward) with a note
    (``__notes__``) naming the rank, stage and micro-batch and the forward, backward or swap step
    that failed. Parameters, gradients and the object stay usable; the next forward starts the next
    step.

    Saved storages the swap does not move stay autograd's and are freed where autograd frees them;
    the manager holds only the storages it moves.
    """

    def __init__(
        self,
        device: DeviceLike,
        order: Order,
        *,
        offload: bool = True,
        min_bytes: int = DEFAULT_MIN_BYTES,
        load_lookahead: int = 1,
        offload_wait_delay: int = 1,
        rank: int = 0,
        on_swap_step: Callable[[str, int, int], None] | None = None,
    ) -> None:
        _require_int("rank", rank, 0)  # min_bytes, load_lookahead, offload_wait_delay: checked in C++
        order = list(order)
        for i, e in enumerate(order):
            if e is None:
                continue
            if not isinstance(e, (tuple, list)) or len(e) not in (3, 4):
                raise ValueError(f"ActivationSwap: order entry {i} is {e!r}; expected None or (kind, stage, micro)")
            if len(e) == 4 or e[0].startswith("OVERLAP_"):
                raise ValueError(
                    f"ActivationSwap: order entry {i} is the composite {e[0]}; torch runs one "
                    "forward or backward at a time, so the order holds leaf FWD and BWD steps"
                )
            if e[0] in _SWAP:
                raise ValueError(
                    f"ActivationSwap: order entry {i} is {e[0]}; pass the order without swap "
                    "steps (they are injected here)"
                )
        self.device = torch.device(device)
        self.rank = rank
        self.offload = offload
        injected = inject_swap_steps(order, load_lookahead, offload_wait_delay)  # also checks both options
        self.order = injected if offload else order
        problems = _C.check_order(self.order)
        if problems:  # the order itself is broken (a backward before its forward, for example)
            raise ValueError(f"ActivationSwap: the order of rank {rank} is not valid:\n{problems}")
        # What runs: compute and swap steps. Point-to-point and opaque steps (FSDP, split backwards)
        # are the training loop's; they only shaped the placement.
        self._steps = [e for e in self.order if e is not None and (e[0] in ("FWD", "BWD") or e[0] in _SWAP)]
        self._st = _C.SavedTensors(self.device, min_bytes)
        self._pos = 0
        self._running = False
        self._broken = None
        self.steps_run = 0
        self.on_swap_step = on_swap_step

    # ----- a step ------------------------------------------------------------------------------------

    def begin(self) -> None:
        """Starts a pipeline step: the cursor goes back to the order's start."""
        self._st.begin_run()
        self._pos = 0
        self._running = True
        self._broken = None

    def end(self) -> None:
        """Ends the step: the swap steps after the last compute step run, and the order must be
        complete. Every group is released."""
        self._check_usable()
        try:
            self._run_swaps()
            if self._pos != len(self._steps):
                k, s, m = self._steps[self._pos]
                raise RuntimeError(
                    f"pipeswap: rank {self.rank}: the step ended, but pipeswap's order still "
                    f"expects {k} of stage {s}, micro-batch {m} (position {self._pos}); the "
                    "training loop ran another schedule than the order"
                )
        finally:
            self._st.end_run()
            self._running = False
        self.steps_run += 1

    def abort(self) -> None:
        """Abandons the step: every group is released, whatever its state."""
        self._st.end_run()
        self._running = False

    # ----- compute ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def forward(self, stage: int, micro: int) -> Iterator[None]:
        """The forward of ``(stage, micro)``: what autograd saves inside goes to its group."""
        self._enter("FWD", stage, micro)
        self._st.enter(stage, micro)
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._st.pack, self._unpack):
                yield
        except BaseException as e:
            self._st.exit()
            self._fail("forward", stage, micro, e)
        self._st.exit()
        self._leave()

    @contextlib.contextmanager
    def backward(self, stage: int, micro: int) -> Iterator[None]:
        """The backward of ``(stage, micro)``: its group is on the device inside, and released after."""
        self._enter("BWD", stage, micro)
        try:
            yield
        except BaseException as e:
            self._fail("backward", stage, micro, e)
        try:
            if self._st.has_group(stage, micro):
                self._st.release(stage, micro)
        except BaseException as e:
            self._fail("backward", stage, micro, e)
        self._leave()

    def keep(self, tensor: torch.Tensor) -> None:
        """Marks ``tensor``'s storage as one that never moves (while it lives)."""
        self._st.keep(tensor)

    # ----- what it did ------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The manager's figures: ``saved_bytes`` (swappable saved storages on the device now),
        ``peak_saved_bytes`` (their most in the step), ``max_group_bytes``, ``offloaded_bytes`` (all
        steps), ``moved_alive`` (moved storages still referenced: 0 when offloads freed their
        memory), ``groups``, and ``predicted_peak_groups`` from the order."""
        d = self._st.stats()
        d["predicted_peak_groups"] = self.predicted_peak_groups()
        return d

    def predicted_peak_groups(self) -> int:
        """The most groups whose swappable storages the order keeps on the device at once: from a
        forward to its ``SWAP_WAIT_OFFLOAD`` and from its ``SWAP_LAUNCH_LOAD`` to the end of its
        backward (a group that is not swapped: from its forward to its backward)."""
        resident, peak = set(), 0
        for k, s, m in self._steps:
            if k in ("FWD", "SWAP_LAUNCH_LOAD"):
                resident.add((s, m))
                peak = max(peak, len(resident))
            elif k in ("SWAP_WAIT_OFFLOAD", "BWD"):
                resident.discard((s, m))
        return peak

    def group_state(self, stage: int, micro: int) -> str | None:
        """``collecting``, ``offloading``, ``offloaded``, ``loading``, ``loaded``; None without a group."""
        return self._st.state(stage, micro) if self._st.has_group(stage, micro) else None

    def moved_storages(self, stage: int, micro: int) -> int:
        """Storages the group's offload moved in this step."""
        return self._st.moved_storages(stage, micro)

    def order_text(self) -> str:
        return order_text(self.order)

    # ----- the cursor -------------------------------------------------------------------------------

    def _unpack(self, packed: Any) -> torch.Tensor:
        return packed if isinstance(packed, torch.Tensor) else self._st.unpack(packed)

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise RuntimeError(
                f"pipeswap: rank {self.rank}: this step failed ({self._broken}); call begin() to start the next one"
            )

    def _enter(self, kind: str, stage: int, micro: int) -> None:
        if not self._running:  # the first compute step of a step (also the one after a failed step)
            self.begin()
        self._run_swaps()
        if self._pos == len(self._steps):
            raise RuntimeError(
                f"pipeswap: rank {self.rank}: {kind} of stage {stage}, micro-batch {micro} runs "
                "after pipeswap's order ended; the training loop runs another schedule"
            )
        expected = self._steps[self._pos]
        if tuple(expected) != (kind, stage, micro):
            k, s, m = expected
            raise RuntimeError(
                f"pipeswap: rank {self.rank}: the training loop runs {kind} of stage {stage}, "
                f"micro-batch {micro}, but pipeswap's order expects {k} of stage {s}, micro-batch "
                f"{m} (position {self._pos}); pass the order of the schedule that runs"
            )
        self._pos += 1

    def _leave(self) -> None:
        self._run_swaps()  # a failing swap step is named as itself

    def _run_swaps(self) -> None:
        steps, st = self._steps, self._st
        while self._pos < len(steps) and steps[self._pos][0] in _SWAP:
            k, s, m = steps[self._pos]
            try:
                if self.on_swap_step is not None:
                    self.on_swap_step(k, s, m)
                if k == "SWAP_LAUNCH_OFFLOAD":
                    st.launch_offload(s, m)
                elif k == "SWAP_WAIT_OFFLOAD":
                    st.wait_offload(s, m)
                elif k == "SWAP_LAUNCH_LOAD":
                    st.launch_load(s, m)
                elif k == "SWAP_WAIT_LOAD":
                    st.wait_load(s, m)
                # SWAP_SET_GROUP: the forward opens its group itself
            except BaseException as e:
                self._fail(f"swap step {k}", s, m, e)
            self._pos += 1

    def _fail(self, what: str, stage: int, micro: int, error: BaseException) -> NoReturn:
        """Aborts the step and raises `error` again as itself, with a note naming where it failed."""
        self._broken = f"{what} of stage {stage}, micro-batch {micro}"
        self._st.end_run()  # every group of the step, whatever its state
        self._running = False
        if isinstance(error, Exception):  # not KeyboardInterrupt, SystemExit: those pass untouched
            _add_note(
                error,
                f"pipeswap: rank {self.rank}, stage {stage}, micro-batch {micro}: the {what} failed; "
                "the step was aborted (every group released)",
            )
        raise error


def _add_note(error: BaseException, note: str) -> None:
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:  # Python < 3.11: the same attribute, which tracebacks of 3.11 print
        error.__notes__ = [*getattr(error, "__notes__", ()), note]
