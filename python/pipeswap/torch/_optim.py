"""SwapAdamW and SwapAdam: torch.optim.AdamW / Adam with the state in pinned host memory.

The division of labour: pipeswap's C++ runtime (pipeswap._C, an optimizer_swap over the torch
backend) owns the state slots, their host stores and every copy; at each batch of a step it calls
back here with tensors that view the batch's slots on the device, and this module runs torch's own
Adam/AdamW ``step()`` on exactly those parameters and views. The update is torch's code with torch's
options, so its bits are torch's.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import defaultdict
from collections.abc import Container, Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Callable, NoReturn, TypeVar

import torch
from torch.optim import Optimizer

from ._ext import _C

if TYPE_CHECKING:
    from torch.optim.optimizer import ParamsT

_F = TypeVar("_F", bound=Callable[..., Any])
# What the runtime hands the update per batch: (parameter index, views of its slots) per parameter.
_BatchItems = list[tuple[int, list[torch.Tensor]]]

try:  # torch's own choice of the dtype of state['step']
    from torch.optim.optimizer import _get_scalar_dtype
except ImportError:  # pragma: no cover

    def _get_scalar_dtype(is_fused: bool | None = None) -> torch.dtype:
        if is_fused:
            return torch.float32
        return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - torch built without distributed
    DTensor = None


def _is_dtensor(t: object) -> bool:
    return DTensor is not None and isinstance(t, DTensor)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor a rank holds: a DTensor's local shard, any other tensor itself."""
    return t._local_tensor if _is_dtensor(t) else t


def _unhooked_step(cls: type[Optimizer]) -> Callable[..., Any]:
    """cls.step without torch's profiling wrapper, whose step hooks (global and per instance) must
    fire once per SwapAdamW.step(), not once per batch."""
    step = cls.step
    return step.__wrapped__ if getattr(step, "hooked", False) and hasattr(step, "__wrapped__") else step


def _no_trace(fn: _F) -> _F:
    """torch.compile does not trace into the step: it drives a C++ runtime with host
    synchronization and calls back into Python per batch, which dynamo cannot capture; eager it
    costs what torch's eager step costs."""
    try:
        import torch._dynamo

        return torch._dynamo.disable(fn)
    except Exception:  # pragma: no cover - torch without dynamo
        return fn


_STATE_KEYS = ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")


def _slot_keys(amsgrad: bool) -> list[str]:
    return ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if amsgrad else [])


def _update_callback(ref: weakref.ref[_SwapAdamBase]) -> Callable[[_BatchItems], None]:
    # The runtime holds this callable: a weak reference, so the optimizer can be collected.
    def update(items: _BatchItems) -> None:
        opt = ref()
        if opt is None:  # pragma: no cover - the runtime dies with the optimizer
            raise RuntimeError("pipeswap.torch: the optimizer of this runtime is gone")
        opt._update_batch(items)

    return update


class _ParamState(MutableMapping[str, Any]):
    """``optimizer.state[p]``: torch's keys, with Adam's moments read from and written to pipeswap's
    store. 'step' (and any key a framework adds) is held here as torch holds it; 'exp_avg',
    'exp_avg_sq' and 'max_exp_avg_sq' are views of the host store (a DTensor over the view for a
    DTensor parameter), current until the next step(); assigning one copies into the store."""

    __slots__ = ("_opt", "_p", "_held")

    def __init__(self, opt: _SwapAdamBase, p: torch.Tensor) -> None:
        self._opt = opt  # a weak proxy: the optimizer goes with its last reference (no cycle)
        self._p = p
        self._held = {}

    @property
    def started(self) -> bool:
        return "step" in self._held

    def _slot_keys(self) -> list[str] | tuple[()]:
        return self._opt._slot_keys_of(self._p) if self.started else ()

    def __getitem__(self, key: str) -> Any:
        if key in self._slot_keys():
            return self._opt._slot_view(self._p, key)
        return self._held[key]

    def __setitem__(self, key: str, value: Any) -> None:
        opt = self._opt
        if key in _STATE_KEYS[1:] and key in opt._slot_keys_of(self._p):
            if not self.started:
                raise KeyError(
                    f"{opt._name}.state[param]['{key}']: this parameter's state has not started (no "
                    "'step'); assign the whole entry: state[param] = {'step': ..., 'exp_avg': ..., ...}"
                )
            opt._write_slot(self._p, key, value)
            return
        if key == "step":
            value = opt._check_step(value, f"{opt._name}.state[param]['step']")
        self._held[key] = value

    def __delitem__(self, key: str) -> None:
        if key in self._slot_keys() or (key == "step" and self.started):
            raise KeyError(
                f"{self._opt._name}.state[param]: '{key}' cannot be removed alone (the moments live in "
                "pipeswap's host store); `del optimizer.state[param]` or `optimizer.state[param].clear()` "
                "resets the parameter's whole state, as in torch"
            )
        del self._held[key]

    def clear(self) -> None:
        """Resets the parameter's state: the moments are zeroed, 'step' goes (the next step starts
        the parameter afresh, as torch does after state[p].clear())."""
        if self.started:
            self._opt._zero_slots(self._p)
        self._held.clear()

    def __iter__(self) -> Iterator[str]:
        if self.started:
            yield "step"
            yield from self._slot_keys()
        yield from (k for k in self._held if k != "step")

    def __len__(self) -> int:
        return len(self._held) + len(self._slot_keys())

    def __contains__(self, key: object) -> bool:
        return key in self._held or key in self._slot_keys()

    def __repr__(self) -> str:
        return (
            "{"
            + ", ".join(
                f"{k!r}: <{type(self).__name__} view>" if k in self._slot_keys() else f"{k!r}: {self._held[k]!r}"
                for k in self
            )
            + "}"
        )


class _SwapState(MutableMapping[torch.Tensor, _ParamState]):
    """``optimizer.state``: param -> torch's per-parameter state (see _ParamState). As torch's
    defaultdict, an entry exists once it was looked up or stepped, and the mapping lists those in
    param_groups order. ``del state[p]``, ``state[p].clear()`` and ``state.clear()`` reset state as
    in torch; ``state[p] = {...}`` loads an entry (checked first, copied into the host store)."""

    def __init__(self, opt: _SwapAdamBase) -> None:
        # A weak proxy: the optimizer and its pinned host stores go with its last reference, not at
        # the next garbage collection.
        self._opt = weakref.proxy(opt)
        self._entries = {}  # id(param) -> _ParamState

    def _entry(self, p: torch.Tensor, create: bool) -> _ParamState | None:
        e = self._entries.get(id(p))
        if e is None or e._p is not p:
            if not create:
                return None
            opt = self._opt
            if p not in opt._index:
                opt._bind()
            if p not in opt._index:
                raise KeyError(
                    f"{opt._name}.state: the tensor is not a parameter of this optimizer (of any param_groups entry)"
                )
            e = self._entries[id(p)] = _ParamState(opt, p)
        return e

    def __getitem__(self, p: torch.Tensor) -> _ParamState:
        return self._entry(p, True)

    def __setitem__(self, p: torch.Tensor, value: Mapping[str, Any]) -> None:
        if not isinstance(value, Mapping):
            raise TypeError(f"{self._opt._name}.state[param] must be a dict, got {type(value).__name__}")
        self._opt._load_entry(self._entry(p, True), dict(value))

    def __delitem__(self, p: torch.Tensor) -> None:
        e = self._entry(p, False)
        if e is None:
            raise KeyError(p)
        e.clear()
        del self._entries[id(p)]

    def clear(self) -> None:
        for e in list(self._entries.values()):
            e.clear()
        self._entries.clear()

    def _live(self) -> list[torch.Tensor]:
        out = []
        for g in self._opt.param_groups:
            for p in g["params"]:
                e = self._entries.get(id(p))
                if e is not None and e._p is p:
                    out.append(p)
        return out

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self._live())

    def __len__(self) -> int:
        return len(self._live())

    def __contains__(self, p: object) -> bool:
        e = self._entries.get(id(p))
        return e is not None and e._p is p

    def __repr__(self) -> str:
        return f"<{self._opt._name} state of {len(self)} parameter(s); moments in pipeswap's host store>"


def _orphan(views: MutableMapping[int, torch.Tensor]) -> None:
    """Gives every view still held outside a private copy of its bytes, before the store under it
    is released or moved (the optimizer goes, its parameters or settings change)."""
    with torch.no_grad():
        for t in list(views.values()):
            try:
                t.set_(t.clone())
            except Exception:  # pragma: no cover - a tensor someone made unsettable; nothing else to do
                pass
    views.clear()


class _SwapAdamBase(Optimizer):
    _torch_class: type[Optimizer]  # torch.optim.Adam or torch.optim.AdamW

    def __init__(
        self,
        params: ParamsT,
        torch_kwargs: dict[str, Any],
        swap_times: int,
        packed: bool,
        resident_share: int,
        defer_offload: bool,
        min_swap_numel: int,
    ) -> None:
        name = type(self).__name__
        self._name = name
        if torch_kwargs.get("differentiable"):
            raise ValueError(
                f"{name}: differentiable=True is not supported: the state leaves the device after every "
                "step, so no autograd graph can run through the update"
            )
        self._swap = self._check_swap(swap_times, packed, resident_share, defer_offload, min_swap_numel)
        # torch's own class validates the hyper-parameters and gives the defaults (the same group
        # keys as torch, so state dicts move both ways). It is also the object that runs the update,
        # through its step without torch's hook wrapper (hooks fire once per step of this object).
        self._inner = self._torch_class([torch.zeros(1, requires_grad=True)], **torch_kwargs)
        self._inner.param_groups = []
        self._inner_step = _unhooked_step(self._torch_class)
        self._lock = threading.RLock()
        self._rt = None
        self._device = None
        self._index = {}  # param -> index in the runtime
        self._meta = []  # index -> (param, dtype, local shape, local stride, amsgrad)
        self._bound = []  # the parameters registered, in param_groups order
        self._where = {}  # index -> group index, during a step
        self._synced = False  # the host stores are complete and nothing stepped since
        # Views of the stores handed out (state, state_dict): they get private copies before the
        # stores move or go, so no tensor anyone holds ever points at released memory.
        self._views = weakref.WeakValueDictionary()
        self._view_count = 0
        self._finalizer = weakref.finalize(self, _orphan, self._views)
        super().__init__(params, dict(self._inner.defaults))
        self.state = _SwapState(self)

    # ----- swap settings -------------------------------------------------------------------------

    def _check_swap(
        self, swap_times: int, packed: bool, resident_share: int, defer_offload: bool, min_swap_numel: int
    ) -> dict[str, Any]:
        name = self._name

        def count(key: str, value: object, least: int) -> int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name}: {key} must be an int, got {type(value).__name__}")
            if value < least:
                raise ValueError(f"{name}: {key} must be at least {least}, got {value}")
            return value

        def flag(key: str, value: object) -> bool:
            if not isinstance(value, bool):
                raise TypeError(f"{name}: {key} must be a bool, got {type(value).__name__}")
            return value

        return {
            "swap_times": count("swap_times", swap_times, 1),
            "packed": flag("packed", packed),
            "resident_share": count("resident_share", resident_share, 0),
            "defer_offload": flag("defer_offload", defer_offload),
            "min_swap_numel": count("min_swap_numel", min_swap_numel, 0),
        }

    def _configure(self) -> None:
        s = self._swap
        self._orphan_views()
        self._rt.configure(s["swap_times"], s["packed"], s["resident_share"], s["defer_offload"], s["min_swap_numel"])

    @property
    def swap_settings(self) -> dict[str, Any]:
        """The swap settings (swap_times, packed, resident_share, defer_offload, min_swap_numel)."""
        return dict(self._swap)

    def configure_swap(self, **settings: Any) -> None:
        """Changes swap settings between steps (the same names as the constructor's). The runtime is
        rebuilt; the state carries over unchanged."""
        with self._lock:
            unknown = set(settings) - set(self._swap)
            if unknown:
                raise TypeError(
                    f"{self._name}.configure_swap: unknown setting(s) {sorted(unknown)}; known: {sorted(self._swap)}"
                )
            new = self._check_swap(**{**self._swap, **settings})
            old, self._swap = self._swap, new
            if self._rt is not None:
                try:
                    self._configure()
                except Exception:
                    self._swap = old
                    raise
                self._synced = False

    # ----- parameters ----------------------------------------------------------------------------

    def _check_new(self, where: str, p: object, device: torch.device | None) -> torch.device:
        """Checks a tensor about to become a parameter; returns the optimizer's device. The dtype and
        layout rule of a state slot is pipeswap._C's (check_param: the rule its add_param applies),
        asked here before the parameter joins, so a refused parameter changes nothing."""
        name = self._name
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"{name}: {where} is a {type(p).__name__}, not a tensor")
        lp = _local(p)
        if p.layout != torch.strided or lp.layout != torch.strided:
            raise ValueError(f"{name}: {where} has layout {p.layout}; only dense (strided) parameters are supported")
        _C.check_param(lp, f"{name}: {where}" + ("'s local shard" if lp is not p else ""))
        if device is None:
            device = lp.device
            if device.type == "cuda" and not _C.has_cuda:
                raise RuntimeError(
                    f"{name}: the parameters are on {device} but pipeswap._C was built without "
                    "its CUDA path (torch without CUDA, or the CUDA runtime headers were not found)"
                )
        elif lp.device != device:
            raise ValueError(
                f"{name}: {where} is on {lp.device} but the optimizer's parameters are on "
                f"{device}; all parameters of one optimizer must share a device "
                "(use one optimizer per device)"
            )
        if lp.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name}: {where} is on {lp.device}; CPU and CUDA devices are supported")
        return device

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        name = self._name
        if not isinstance(param_group, dict):
            raise TypeError(f"{name}: a parameter group must be a dict, got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, torch.Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError(
                f"{name}: optimizer parameters need to be organized in ordered collections, "
                "but the ordering of tensors in sets will change between runs; use a list"
            )
        else:
            params = list(params)
        # Named parameters ((name, tensor) pairs, torch >= 2.6) are torch's to unpack; the checks
        # below look at the tensors.
        tensors = [x[1] if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) else x for x in params]
        gi = len(self.param_groups)
        device = self._device
        seen = set()
        bound = {id(q) for g in self.param_groups for q in g["params"]}
        for k, p in enumerate(tensors):
            where = f"param_groups[{gi}]['params'][{k}]"
            if isinstance(p, torch.Tensor) and (id(p) in seen or id(p) in bound):
                raise ValueError(f"{name}: {where} is listed twice (a parameter belongs to one group, once)")
            seen.add(id(p))
            device = self._check_new(where, p, device)
        param_group = dict(param_group, params=params)
        super().add_param_group(param_group)  # torch's own checks: leaves, defaults, groups
        with self._lock:
            self._bind(checked={id(p) for p in tensors})

    def _bind(self, checked: Container[int] = frozenset()) -> None:
        """Registers the parameters of param_groups with the runtime. Called when groups are added
        and at every step() and state access, so parameters replaced in param_groups (as accelerate
        does, swapping in sharded DTensors after the optimizer exists) are bound too: before any
        state exists everything is registered afresh; afterwards only new parameters at the end may
        join, and a parameter with state may not be replaced. Parameters whose ids are in
        ``checked`` passed _check_new already (add_param_group checks its group before torch adds
        it); the others get its checks here."""
        current = [p for g in self.param_groups for p in g["params"]]
        bound = self._bound
        if len(current) == len(bound) and all(a is b for a, b in zip(current, bound)):
            return
        name = self._name
        prefix = len(bound) <= len(current) and all(a is b for a, b in zip(current, bound))
        if not prefix:
            started = [
                p
                for p in bound
                if (e := self.state._entry(p, False) if isinstance(self.state, _SwapState) else None) is not None
                and e.started
            ]
            if started:
                where = next(
                    (
                        f"the parameter bound at position {k}"
                        for k, p in enumerate(bound)
                        if k >= len(current) or current[k] is not p
                    ),
                    "a parameter",
                )
                raise RuntimeError(
                    f"{name}: param_groups changed after the optimizer state was started ({where} was replaced "
                    "or removed); its state lives in pipeswap's host store and cannot follow. Build the optimizer "
                    "over the final parameters, or save a state dict and load it into a new optimizer"
                )
            device = None
            gi_k = [(gi, k) for gi, g in enumerate(self.param_groups) for k in range(len(g["params"]))]
            for (gi, k), p in zip(gi_k, current):
                device = self._check_new(f"param_groups[{gi}]['params'][{k}]", p, device)
            checked = {id(p) for p in current}
            if self._rt is not None:
                self._orphan_views()
                self._rt.reset_params()
                self._synced = False
            if self._rt is not None and device is not None and device != self._device:
                self._rt = None
            self._index, self._meta, self._bound = {}, [], []
            if isinstance(self.state, _SwapState):
                self.state._entries.clear()
            self._device = device
            bound = self._bound
        new = current[len(bound) :]
        if not new:
            return
        # Parameters that joined without add_param_group (param_groups edited in place) get its checks.
        gi_k = [(gi, k) for gi, g in enumerate(self.param_groups) for k in range(len(g["params"]))]
        device = self._device
        for (gi, k), p in zip(gi_k[len(bound) :], new):
            if id(p) in checked:
                device = device or _local(p).device
            else:
                device = self._check_new(f"param_groups[{gi}]['params'][{k}]", p, device)
        amsgrad_of = {}
        for g in self.param_groups:
            for p in g["params"]:
                amsgrad_of[id(p)] = bool(g["amsgrad"])
        if self._rt is None:
            self._device = _local(new[0]).device
            self._rt = _C.Runtime(self._device, _update_callback(weakref.ref(self)))
            self._configure()
        self._orphan_views()  # add_param rebuilds the runtime; the stores may move
        self._synced = False
        for p in new:
            lp = _local(p)
            amsgrad = amsgrad_of[id(p)]
            i = self._rt.add_param(lp, _slot_keys(amsgrad))
            self._index[p] = i
            self._meta.append((p, lp.dtype, tuple(lp.shape), lp.stride(), amsgrad))
            bound.append(p)

    def _param_name(self, gi: int, k: int) -> str:
        return f"param_groups[{gi}]['params'][{k}]"

    def _check_param(self, gi: int, k: int, group: dict[str, Any], p: torch.Tensor) -> int:
        name, where = self._name, self._param_name(gi, k)
        i = self._index[p]
        _, dtype, shape, stride, amsgrad = self._meta[i]
        lp, g = _local(p), p.grad
        if lp.device != self._device:
            raise ValueError(
                f"{name}: {where} moved from {self._device} to {lp.device} since it was added; "
                "its state stays where the optimizer was built (build a new optimizer and "
                "load the state dict)"
            )
        if p.dtype != dtype:
            raise ValueError(
                f"{name}: {where} changed dtype from {dtype} to {p.dtype} since it was added; "
                "its state keeps the first dtype (build a new optimizer and load the state dict)"
            )
        if tuple(lp.shape) != shape or lp.stride() != stride:
            raise ValueError(
                f"{name}: {where} changed layout from shape {shape}, stride {stride} to shape "
                f"{tuple(lp.shape)}, stride {lp.stride()} since it was added"
            )
        if _is_dtensor(p) != _is_dtensor(g):
            raise ValueError(f"{name}: {where} is a {type(p).__name__} but its gradient a {type(g).__name__}")
        if _is_dtensor(p) and (g.device_mesh != p.device_mesh or tuple(g.placements) != tuple(p.placements)):
            raise ValueError(
                f"{name}: {where}'s gradient has placements {tuple(g.placements)}, the parameter "
                f"{tuple(p.placements)}; redistribute the gradient to the parameter's placements "
                "before step()"
            )
        if g.is_sparse or g.layout != torch.strided:
            raise ValueError(
                f"{name}: {where} has a sparse gradient; Adam and AdamW need dense gradients "
                "(torch.optim.SparseAdam is for sparse ones)"
            )
        if g.is_complex():
            raise ValueError(f"{name}: {where} has a complex gradient ({g.dtype}); only real gradients are supported")
        lg = _local(g)
        if lg.device != lp.device or g.dtype != p.dtype or g.shape != p.shape or lg.shape != lp.shape:
            raise ValueError(
                f"{name}: {where} has a gradient of {g.dtype} {tuple(g.shape)} on {lg.device} "
                f"for a parameter of {p.dtype} {tuple(p.shape)} on {lp.device}; they must match"
            )
        if bool(group["amsgrad"]) != amsgrad:
            raise ValueError(
                f"{name}: param_groups[{gi}]['amsgrad'] changed to {group['amsgrad']} after "
                f"{where} was added; its state slots were made for amsgrad={amsgrad}"
            )
        if group["differentiable"]:
            raise ValueError(
                f"{name}: param_groups[{gi}]['differentiable'] is True; not supported (the "
                "state leaves the device after every step)"
            )
        return i

    # ----- the step ------------------------------------------------------------------------------

    def _new_step(self, group: dict[str, Any], p: torch.Tensor) -> torch.Tensor:
        if group["capturable"] or group["fused"]:
            return torch.zeros((), dtype=_get_scalar_dtype(is_fused=group["fused"]), device=_local(p).device)
        return torch.tensor(0.0, dtype=_get_scalar_dtype(), device="cpu")

    @_no_trace
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Performs one optimization step (torch's Adam/AdamW step, batch by batch, while the state
        moves). Parameters without a gradient are skipped, as torch does. Under torch.compile the
        step runs eagerly (it is excluded from tracing)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with self._lock:
            if self._device is not None and self._device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"{self._name}.step: called during CUDA graph capture; the swap runtime "
                    "synchronizes with the host and cannot be captured"
                )
            self._bind()
            active, where = [], {}
            for gi, group in enumerate(self.param_groups):
                for k, p in enumerate(group["params"]):
                    if p.grad is None:
                        continue
                    i = self._check_param(gi, k, group, p)
                    active.append(i)
                    where[i] = gi
            if not active:
                return loss
            for i in active:  # everything checked: start the state of parameters new to it
                p = self._meta[i][0]
                entry = self.state[p]
                if not entry.started:
                    entry._held["step"] = self._new_step(self.param_groups[where[i]], p)
            self._where = where
            self._synced = False
            try:
                self._rt.set_active(active)
                self._rt.step()
            finally:
                self._where = {}
        return loss

    def _update_batch(self, items: _BatchItems) -> None:
        """Called by the runtime once per batch, with (index, [slot views]) per parameter. A DTensor
        parameter is updated through its local shard (the same elementwise kernels torch's AdamW
        runs on DTensors, on the same local tensors)."""
        by_group = defaultdict(list)
        for i, views in items:
            by_group[self._where[i]].append((self._meta[i][0], views))
        inner = self._inner
        for gi in sorted(by_group):
            group = self.param_groups[gi]
            entries = by_group[gi]
            inner_group = {k: v for k, v in group.items() if k not in ("params", "param_names")}
            params = []
            state = defaultdict(dict)
            for p, views in entries:
                if _is_dtensor(p):
                    q = p._local_tensor.detach()
                    q.grad = p.grad._local_tensor.detach()
                else:
                    q = p
                params.append(q)
                s = {"step": self.state[p]._held["step"], "exp_avg": views[0], "exp_avg_sq": views[1]}
                if group["amsgrad"]:
                    s["max_exp_avg_sq"] = views[2]
                state[q] = s
            inner_group["params"] = params
            inner.param_groups = [inner_group]
            inner.state = state
            try:
                self._inner_step(inner)
            finally:
                inner.state = defaultdict(dict)
                inner.param_groups = []

    # ----- phases --------------------------------------------------------------------------------

    def prefetch(self, max_batches: int | None = None) -> int:
        """Starts loading the next step's first batches (in step order, those neither resident nor in
        flight) into device memory, at most ``max_batches``; never blocks the host. Returns the
        batches resident or in flight for the next step (0 before the first step). Call it after a
        backward (e.g. from a backward hook of the first layers) or any time between two steps."""
        if max_batches is not None and (
            isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 0
        ):
            raise ValueError(f"{self._name}.prefetch: max_batches must be None or an int >= 0, got {max_batches!r}")
        with self._lock:
            if self._rt is None:
                return 0
            self._synced = False
            return self._rt.prefetch(max_batches)

    def finish_offload(self) -> None:
        """Finishes a deferred offload (defer_offload=True): torch's current stream waits the copies
        and their device memory is released behind them. Never blocks the host."""
        with self._lock:
            if self._rt is not None:
                self._rt.finish_offload()

    @property
    def offload_pending(self) -> bool:
        """True while a deferred offload is in flight."""
        return self._rt is not None and self._rt.offload_pending

    def synchronize(self) -> None:
        """Brings every batch home: the host stores are complete and synchronized, nothing of the
        state is left on the device except slots smaller than min_swap_numel."""
        with self._lock:
            if self._rt is not None:
                self._rt.synchronize()
                self._synced = True

    def swap_stats(self) -> dict[str, Any]:
        """Sizes of the last step: batches, swappable/unswappable/arena/host-store bytes, prefetched and
        resident batches."""
        with self._lock:
            return {} if self._rt is None else self._rt.stats()

    # ----- the state where torch keeps it ----------------------------------------------------------

    def _orphan_views(self) -> None:
        if len(self._views):
            _orphan(self._views)

    def _index_of(self, p: torch.Tensor) -> int:
        """p's index in the runtime, binding param_groups first when p is new to it (O(1) else)."""
        i = self._index.get(p)
        if i is None:
            self._bind()
            i = self._index[p]
        return i

    def _raw_views(self, p: torch.Tensor) -> list[torch.Tensor]:
        """Views of p's slots over the store (local shapes), in _slot_keys order."""
        i = self._index_of(p)
        if not self._synced:
            self._rt.synchronize()
            self._synced = True
        return self._rt.state_views(i, False)

    def _hand_out(self, p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """v (a view of the store) as torch would hold it for p: a DTensor like p for a DTensor."""
        if _is_dtensor(p):
            v = DTensor.from_local(v, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())
            self._views[self._view_count] = v._local_tensor
        else:
            self._views[self._view_count] = v
        self._view_count += 1
        return v

    def _slot_keys_of(self, p: torch.Tensor) -> list[str]:
        return _slot_keys(self._meta[self._index_of(p)][4])

    def _slot_view(self, p: torch.Tensor, key: str) -> torch.Tensor:
        with self._lock:
            keys = self._slot_keys_of(p)
            return self._hand_out(p, self._raw_views(p)[keys.index(key)])

    def _check_slot_value(self, p: torch.Tensor, key: str, v: object, where: str) -> torch.Tensor:
        if _is_dtensor(v):
            if not _is_dtensor(p) or tuple(v.shape) != tuple(p.shape):
                raise ValueError(
                    f"{where} is a DTensor of shape {tuple(v.shape)} for a parameter of shape {tuple(p.shape)}"
                )
            if tuple(v.placements) != tuple(p.placements):
                raise ValueError(f"{where} has placements {tuple(v.placements)}, the parameter {tuple(p.placements)}")
            v = v._local_tensor
        if not isinstance(v, torch.Tensor) or tuple(v.shape) != tuple(_local(p).shape):
            got = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            raise ValueError(
                f"{where} is {got} but the parameter has shape {tuple(_local(p).shape)}"
                f"{' (its local shard)' if _is_dtensor(p) else ''}: a state dict of another model?"
            )
        if v.is_complex() or not v.is_floating_point():
            raise ValueError(f"{where} has dtype {v.dtype}")
        return v

    def _write_slot(self, p: torch.Tensor, key: str, value: object) -> None:
        with self._lock:
            keys = self._slot_keys_of(p)
            v = self._check_slot_value(p, key, value, f"{self._name}.state[param]['{key}']")
            _copy_into(self._raw_views(p)[keys.index(key)], v)

    def _zero_slots(self, p: torch.Tensor) -> None:
        with self._lock:
            for view in self._raw_views(p):
                view.zero_()

    def _check_step(self, step: object, where: str) -> torch.Tensor | float:
        if isinstance(step, torch.Tensor):
            if step.numel() != 1 or step.is_complex():
                raise ValueError(f"{where} must be a real scalar")
        elif isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
            raise ValueError(f"{where} must be a number")
        return step

    def _place_step(self, p: torch.Tensor, group: dict[str, Any], step: torch.Tensor | float) -> torch.Tensor:
        """'step' placed as torch's load_state_dict places it."""
        step = step.detach().reshape(()) if isinstance(step, torch.Tensor) else torch.tensor(float(step))
        if _is_dtensor(step):
            step = step.full_tensor()
        if group["capturable"] or group["fused"]:
            return step.to(dtype=_get_scalar_dtype(is_fused=group["fused"]), device=_local(p).device, copy=True)
        return step.to(dtype=_get_scalar_dtype(), device="cpu", copy=True)

    def _group_of(self, p: torch.Tensor) -> tuple[int, dict[str, Any]]:
        for gi, g in enumerate(self.param_groups):
            if any(q is p for q in g["params"]):
                return gi, g
        raise KeyError(p)  # pragma: no cover - _entry checked it

    def _load_entry(self, entry: _ParamState, s: dict[str, Any]) -> None:
        """state[p] = s: checked whole, then copied into the store (ZeroRedundancyOptimizer's load
        and frameworks write entries this way)."""
        with self._lock:
            p, name = entry._p, self._name
            keys = self._slot_keys_of(p)
            where = f"{name}.state[param]"
            if not s:
                entry.clear()
                return
            missing = [k for k in ["step"] + keys if k not in s]
            if missing:
                raise ValueError(
                    f"{where}: the entry has keys {sorted(s)}; it needs {['step'] + keys} "
                    "(or is empty to reset the parameter's state)"
                )
            self._check_step(s["step"], f"{where}['step']")
            values = [self._check_slot_value(p, k, s[k], f"{where}['{k}']") for k in keys]
            gi, group = self._group_of(p)
            for view, v in zip(self._raw_views(p), values):
                _copy_into(view, v)
            entry._held = {k: v for k, v in s.items() if k not in keys}
            entry._held["step"] = self._place_step(p, group, s["step"])

    def state_tensors(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        """CPU copies of parameter ``p``'s state, as torch.optim.Adam keeps it in ``state[p]``
        (``{}`` before its first step)."""
        with self._lock:
            self._bind()
            if p not in self._index:
                raise KeyError(f"{self._name}.state_tensors: the tensor is not a parameter of this optimizer")
            entry = self.state._entry(p, False)
            if entry is None or not entry.started:
                return {}
            out = {"step": entry._held["step"].detach().to("cpu", copy=True)}
            for key, v in zip(self._slot_keys_of(p), self._raw_views(p)):
                out[key] = v.to("cpu", copy=True)
            return out

    # ----- state dicts ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """torch's format: {'state': {id: {'step', 'exp_avg', 'exp_avg_sq'[, 'max_exp_avg_sq']}},
        'param_groups': [...]}, ids numbered over the groups in order. The moments are views of the
        host stores (no copy is made; a DTensor over the view for a DTensor parameter), current until
        the next step(), as torch's state dict holds its live state tensors; 'step' is the state's own
        tensor, as in torch. Copy the dict (copy.deepcopy, torch.save) to keep it across steps."""
        for hook in getattr(self, "_optimizer_state_dict_pre_hooks", {}).values():
            hook(self)
        with self._lock:
            self._bind()
            mapping, groups, start = {}, [], 0
            for group in self.param_groups:
                packed = {k: v for k, v in group.items() if k != "params"}
                for n, p in enumerate(group["params"], start):
                    mapping.setdefault(id(p), n)
                packed["params"] = [mapping[id(p)] for p in group["params"]]
                start += len(packed["params"])
                groups.append(packed)
            state = {}
            for p in self.state:
                entry = self.state._entry(p, False)
                out = {}
                if entry.started:
                    out["step"] = entry._held["step"]
                    for key, v in zip(self._slot_keys_of(p), self._raw_views(p)):
                        out[key] = self._hand_out(p, v)
                out.update((k, v) for k, v in entry._held.items() if k != "step")
                state[mapping[id(p)]] = out
        out = {"state": state, "param_groups": groups}
        for hook in getattr(self, "_optimizer_state_dict_post_hooks", {}).values():
            result = hook(self, out)
            if result is not None:
                out = result
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state dict of torch.optim.Adam/AdamW or of this class (tensors or DTensors, on any
        device). Everything is checked first (groups, ids, keys, shapes); on a mismatch a ValueError
        names it and nothing changes. Each tensor is copied into pipeswap's host store (no device copy
        of the whole state; a tensor that already is a view of the store is left as it is); 'step' is
        placed as torch places it."""
        name = self._name
        for hook in getattr(self, "_optimizer_load_state_dict_pre_hooks", {}).values():
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError(f"{name}.load_state_dict: expected a dict with 'state' and 'param_groups'")
        with self._lock:
            self._bind()
            groups, saved_groups = self.param_groups, state_dict["param_groups"]
            if len(groups) != len(saved_groups):
                raise ValueError(
                    f"{name}.load_state_dict: the state dict has {len(saved_groups)} parameter "
                    f"group(s), this optimizer {len(groups)}"
                )
            for gi, (g, sg) in enumerate(zip(groups, saved_groups)):
                if len(g["params"]) != len(sg["params"]):
                    raise ValueError(
                        f"{name}.load_state_dict: param_groups[{gi}] has {len(sg['params'])} "
                        f"parameter(s) in the state dict, {len(g['params'])} here"
                    )
                for key in g:
                    if key not in ("params", "param_names") and key not in sg:
                        raise ValueError(f"{name}.load_state_dict: param_groups[{gi}] lacks '{key}'")
            id_map, place = {}, {}
            for gi, (g, sg) in enumerate(zip(groups, saved_groups)):
                for k, (old, p) in enumerate(zip(sg["params"], g["params"])):
                    id_map[old] = p
                    place[old] = (gi, k)
            entries = []
            for old, s in state_dict["state"].items():
                if old not in id_map:
                    raise ValueError(
                        f"{name}.load_state_dict: state for id {old!r}, which no parameter group "
                        "of the state dict lists"
                    )
                p = id_map[old]
                gi, k = place[old]
                where = f"state[{old!r}] ({self._param_name(gi, k)})"
                amsgrad = self._meta[self._index[p]][4]
                if bool(saved_groups[gi]["amsgrad"]) != amsgrad:
                    raise ValueError(
                        f"{name}.load_state_dict: param_groups[{gi}]['amsgrad'] is "
                        f"{saved_groups[gi]['amsgrad']} in the state dict, {amsgrad} here"
                    )
                if not isinstance(s, Mapping):
                    raise ValueError(f"{name}.load_state_dict: {where} is not a dict")
                need = ["step"] + _slot_keys(amsgrad)
                if not s:  # an entry without state (torch lists parameters it looked up)
                    entries.append((p, gi, None, None))
                    continue
                missing = [key for key in need if key not in s]
                extra = [key for key in s if key not in need]
                if missing or extra:
                    raise ValueError(
                        f"{name}.load_state_dict: {where} has keys {sorted(s)}; expected {need} (amsgrad={amsgrad})"
                    )
                values = [
                    self._check_slot_value(p, key, s[key], f"{name}.load_state_dict: {where}['{key}']")
                    for key in need[1:]
                ]
                self._check_step(s["step"], f"{name}.load_state_dict: {where}['step']")
                entries.append((p, gi, s["step"], values))
            # Everything checked: apply.
            for g, sg in zip(groups, saved_groups):
                new = {k: v for k, v in sg.items() if k != "params"}
                if "param_names" in g:
                    new["param_names"] = g["param_names"]
                if isinstance(new.get("betas"), list):
                    new["betas"] = tuple(new["betas"])  # a checkpoint format may turn the tuple to a list
                new["params"] = g["params"]
                g.clear()
                g.update(new)
            loaded = set()
            for p, gi, step, values in entries:
                entry = self.state._entry(p, True)
                if values is None:
                    entry.clear()
                else:
                    for view, v in zip(self._raw_views(p), values):
                        _copy_into(view, v)
                    entry._held = {"step": self._place_step(p, groups[gi], step)}
                loaded.add(id(p))
            # As torch does, parameters the state dict has no entry for start afresh.
            for p in list(self.state):
                if id(p) not in loaded:
                    del self.state[p]
        for hook in getattr(self, "_optimizer_load_state_dict_post_hooks", {}).values():
            hook(self)

    def __getstate__(self) -> NoReturn:
        raise TypeError(
            f"{self._name} cannot be pickled (its state lives in pipeswap's host stores); save its state_dict() instead"
        )


def _copy_into(view: torch.Tensor, v: torch.Tensor) -> None:
    """Copies v into a view of the store, unless v is that view (DCP loads into the views)."""
    if (
        v.data_ptr() == view.data_ptr()
        and v.device == view.device
        and v.stride() == view.stride()
        and v.dtype == view.dtype
    ):
        return
    view.copy_(v)


class SwapAdamW(_SwapAdamBase):
    """``torch.optim.AdamW`` with its state in pinned host memory between steps: the same
    arguments, the same bits.

    Swap settings (keyword-only):
      swap_times      batches a step is split into (1 = the whole state at once); default 16
      packed          True (default): the packed pipeline, two reusable device staging arenas and
                      one large copy per batch and direction; False: the per-tensor pipeline, each
                      state tensor in its own device storage
      resident_share  bytes of state (whole batches, from the front) that stay on the device
      defer_offload   step() returns with the last batches' copies to the host still in flight;
                      finish_offload(), the next step() or prefetch() finish them
      min_swap_numel  state tensors with fewer elements stay on the device (default 1024)
    ``differentiable=True`` is refused; ``capturable=True`` works outside CUDA graph capture.
    """

    _torch_class = torch.optim.AdamW

    def __init__(
        self,
        params: ParamsT,
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float | torch.Tensor, float | torch.Tensor] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        swap_times: int = 16,
        packed: bool = True,
        resident_share: int = 0,
        defer_offload: bool = False,
        min_swap_numel: int = 1024,
    ) -> None:
        super().__init__(
            params,
            dict(
                lr=lr,
                betas=betas,
                eps=eps,
                weight_decay=weight_decay,
                amsgrad=amsgrad,
                maximize=maximize,
                foreach=foreach,
                capturable=capturable,
                differentiable=differentiable,
                fused=fused,
            ),
            swap_times,
            packed,
            resident_share,
            defer_offload,
            min_swap_numel,
        )


class SwapAdam(_SwapAdamBase):
    """``torch.optim.Adam`` with its state in pinned host memory between steps (see SwapAdamW for the
    swap settings). Further keyword arguments of this torch's Adam (decoupled_weight_decay) pass
    through."""

    _torch_class = torch.optim.Adam

    def __init__(
        self,
        params: ParamsT,
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float | torch.Tensor, float | torch.Tensor] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        swap_times: int = 16,
        packed: bool = True,
        resident_share: int = 0,
        defer_offload: bool = False,
        min_swap_numel: int = 1024,
        **torch_kwargs: Any,
    ) -> None:
        super().__init__(
            params,
            dict(
                lr=lr,
                betas=betas,
                eps=eps,
                weight_decay=weight_decay,
                amsgrad=amsgrad,
                foreach=foreach,
                maximize=maximize,
                capturable=capturable,
                differentiable=differentiable,
                fused=fused,
                **torch_kwargs,
            ),
            swap_times,
            packed,
            resident_share,
            defer_offload,
            min_swap_numel,
        )
