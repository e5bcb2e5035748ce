"""SwapAdamW and SwapAdam: torch.optim.AdamW / Adam with the state in pinned host memory.

The division of labour: pipeswap's C++ runtime (pipeswap._C, an optimizer_swap over the torch
backend) owns the state slots, their host stores and every copy; at each batch of a step it calls
back here with tensors that view the batch's slots on the device, and this module runs torch's own
Adam/AdamW ``step()`` on exactly those parameters and views. The update is torch's code with torch's
options, so its bits are torch's.
"""

import math
import threading
import weakref
from collections import defaultdict

import torch
from torch.optim import Optimizer

from ._ext import _C


try:  # torch's own choice of the dtype of state['step']
    from torch.optim.optimizer import _get_scalar_dtype
except ImportError:  # pragma: no cover
    def _get_scalar_dtype(is_fused=None):
        if is_fused:
            return torch.float32
        return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


_PIPELINES = ("packed", "per_tensor")
_STATE_KEYS = ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")


def _dense(t):
    """Whether t's elements fill its memory exactly once, in any dimension order."""
    expect = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expect:
            return False
        expect *= size
    return True


def _slot_keys(amsgrad):
    return ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if amsgrad else [])


def _update_callback(ref):
    # The runtime holds this callable: a weak reference, so the optimizer can be collected.
    def update(items):
        opt = ref()
        if opt is None:  # pragma: no cover - the runtime dies with the optimizer
            raise RuntimeError("pipeswap.torch: the optimizer of this runtime is gone")
        opt._update_batch(items)

    return update


class _SwapAdamBase(Optimizer):
    _torch_class = None  # torch.optim.Adam or torch.optim.AdamW

    def __init__(self, params, torch_kwargs, swap_times, pipeline, resident_share, defer_offload,
                 min_swap_numel):
        name = type(self).__name__
        self._name = name
        if torch_kwargs.get("differentiable"):
            raise ValueError(
                f"{name}: differentiable=True is not supported: the state leaves the device after every "
                "step, so no autograd graph can run through the update")
        self._swap = self._check_swap(swap_times, pipeline, resident_share, defer_offload, min_swap_numel)
        # torch's own class validates the hyper-parameters and gives the defaults (the same group
        # keys as torch, so state dicts move both ways). It is also the object that runs the update.
        self._inner = self._torch_class([torch.zeros(1, requires_grad=True)], **torch_kwargs)
        self._inner.param_groups = []
        self._lock = threading.RLock()
        self._rt = None
        self._device = None
        self._index = {}   # param -> index in the runtime
        self._meta = []    # index -> (param, dtype, shape, stride, amsgrad)
        self._where = {}   # index -> group index, during a step
        super().__init__(params, dict(self._inner.defaults))

    # ----- swap settings -------------------------------------------------------------------------

    def _check_swap(self, swap_times, pipeline, resident_share, defer_offload, min_swap_numel):
        name = self._name

        def count(key, value, least):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name}: {key} must be an int, got {type(value).__name__}")
            if value < least:
                raise ValueError(f"{name}: {key} must be at least {least}, got {value}")
            return value

        if pipeline not in _PIPELINES:
            raise ValueError(f"{name}: pipeline must be one of {_PIPELINES}, got {pipeline!r}")
        if not isinstance(defer_offload, bool):
            raise TypeError(f"{name}: defer_offload must be a bool, got {type(defer_offload).__name__}")
        return {
            "swap_times": count("swap_times", swap_times, 1),
            "pipeline": pipeline,
            "resident_share": count("resident_share", resident_share, 0),
            "defer_offload": defer_offload,
            "min_swap_numel": count("min_swap_numel", min_swap_numel, 0),
        }

    def _configure(self):
        s = self._swap
        self._rt.configure(s["swap_times"], s["pipeline"] == "packed", s["resident_share"],
                           s["defer_offload"], s["min_swap_numel"])

    @property
    def swap_settings(self):
        """The swap settings (swap_times, pipeline, resident_share, defer_offload, min_swap_numel)."""
        return dict(self._swap)

    def configure_swap(self, **settings):
        """Changes swap settings between steps (the same names as the constructor's). The runtime is
        rebuilt; the state carries over unchanged."""
        with self._lock:
            unknown = set(settings) - set(self._swap)
            if unknown:
                raise TypeError(f"{self._name}.configure_swap: unknown setting(s) {sorted(unknown)}; "
                                f"known: {sorted(self._swap)}")
            new = self._check_swap(**{**self._swap, **settings})
            old, self._swap = self._swap, new
            if self._rt is not None:
                try:
                    self._configure()
                except Exception:
                    self._swap = old
                    raise

    # ----- parameters ----------------------------------------------------------------------------

    def add_param_group(self, param_group):
        name = self._name
        if not isinstance(param_group, dict):
            raise TypeError(f"{name}: a parameter group must be a dict, got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, torch.Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError(f"{name}: optimizer parameters need to be organized in ordered collections, "
                            "but the ordering of tensors in sets will change between runs; use a list")
        else:
            params = list(params)
        # Named parameters ((name, tensor) pairs, torch >= 2.6) are torch's to unpack; the checks
        # below look at the tensors.
        tensors = [x[1] if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) else x for x in params]
        gi = len(self.param_groups)
        device = self._device
        seen = set()
        for k, p in enumerate(tensors):
            where = f"param_groups[{gi}]['params'][{k}]"
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"{name}: {where} is a {type(p).__name__}, not a tensor")
            if id(p) in seen or p in self._index:
                raise ValueError(f"{name}: {where} is listed twice (a parameter belongs to one group, once)")
            seen.add(id(p))
            if p.is_complex():
                raise ValueError(f"{name}: {where} is complex ({p.dtype}); only real floating-point "
                                 "parameters are supported")
            if p.layout != torch.strided:
                raise ValueError(f"{name}: {where} has layout {p.layout}; only dense (strided) parameters "
                                 "are supported")
            if p.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
                raise ValueError(f"{name}: {where} has dtype {p.dtype}; float32, float64, bfloat16 and "
                                 "float16 are supported")
            if device is None:
                device = p.device
            elif p.device != device:
                raise ValueError(f"{name}: {where} is on {p.device} but the optimizer's parameters are on "
                                 f"{device}; all parameters of one optimizer must share a device "
                                 "(use one optimizer per device)")
            if p.device.type not in ("cpu", "cuda"):
                raise ValueError(f"{name}: {where} is on {p.device}; CPU and CUDA devices are supported")
            if not _dense(p):
                raise ValueError(f"{name}: {where} is not dense and non-overlapping (shape "
                                 f"{tuple(p.shape)}, stride {p.stride()}); its state needs that layout")
        if device is not None and device.type == "cuda" and not _C.has_cuda:
            raise RuntimeError(f"{name}: the parameters are on {device} but pipeswap._C was built without "
                               "its CUDA path (torch without CUDA, or the CUDA runtime headers were not found)")
        param_group = dict(param_group, params=params)
        super().add_param_group(param_group)  # torch's own checks: leaves, defaults, groups
        group = self.param_groups[-1]
        with self._lock:
            if self._rt is None and group["params"]:
                self._device = device
                self._rt = _C.Runtime(device, _update_callback(weakref.ref(self)))
                self._configure()
            for p in group["params"]:
                amsgrad = bool(group["amsgrad"])
                i = self._rt.add_param(p, _slot_keys(amsgrad))
                self._index[p] = i
                self._meta.append((p, p.dtype, tuple(p.shape), p.stride(), amsgrad))

    def _param_name(self, gi, k):
        return f"param_groups[{gi}]['params'][{k}]"

    def _check_param(self, gi, k, group, p):
        name, where = self._name, self._param_name(gi, k)
        i = self._index.get(p)
        if i is None:
            raise ValueError(f"{name}: {where} was put into param_groups without add_param_group")
        _, dtype, shape, stride, amsgrad = self._meta[i]
        g = p.grad
        if p.device != self._device:
            raise ValueError(f"{name}: {where} moved from {self._device} to {p.device} since it was added; "
                             "its state stays where the optimizer was built (build a new optimizer and "
                             "load the state dict)")
        if p.dtype != dtype:
            raise ValueError(f"{name}: {where} changed dtype from {dtype} to {p.dtype} since it was added; "
                             "its state keeps the first dtype (build a new optimizer and load the state dict)")
        if tuple(p.shape) != shape or p.stride() != stride:
            raise ValueError(f"{name}: {where} changed layout from shape {shape}, stride {stride} to shape "
                             f"{tuple(p.shape)}, stride {p.stride()} since it was added")
        if g.is_sparse or g.layout != torch.strided:
            raise ValueError(f"{name}: {where} has a sparse gradient; Adam and AdamW need dense gradients "
                             "(torch.optim.SparseAdam is for sparse ones)")
        if g.is_complex():
            raise ValueError(f"{name}: {where} has a complex gradient ({g.dtype}); only real gradients are "
                             "supported")
        if g.device != p.device or g.dtype != p.dtype or g.shape != p.shape:
            raise ValueError(f"{name}: {where} has a gradient of {g.dtype} {tuple(g.shape)} on {g.device} "
                             f"for a parameter of {p.dtype} {tuple(p.shape)} on {p.device}; they must match")
        if bool(group["amsgrad"]) != amsgrad:
            raise ValueError(f"{name}: param_groups[{gi}]['amsgrad'] changed to {group['amsgrad']} after "
                             f"{where} was added; its state slots were made for amsgrad={amsgrad}")
        if group["differentiable"]:
            raise ValueError(f"{name}: param_groups[{gi}]['differentiable'] is True; not supported (the "
                             "state leaves the device after every step)")
        return i

    # ----- the step ------------------------------------------------------------------------------

    def _new_step(self, group, p):
        if group["capturable"] or group["fused"]:
            return torch.zeros((), dtype=_get_scalar_dtype(is_fused=group["fused"]), device=p.device)
        return torch.tensor(0.0, dtype=_get_scalar_dtype(), device="cpu")

    @torch.no_grad()
    def step(self, closure=None):
        """Performs one optimization step (torch's Adam/AdamW step, batch by batch, while the state
        moves). Parameters without a gradient are skipped, as torch does."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with self._lock:
            if self._device is not None and self._device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"{self._name}.step: called during CUDA graph capture; the swap runtime "
                                   "synchronizes with the host and cannot be captured")
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
                state = self.state[p]
                if "step" not in state:
                    state["step"] = self._new_step(self.param_groups[where[i]], p)
            self._where = where
            try:
                self._rt.set_active(active)
                self._rt.step()
            finally:
                self._where = {}
        return loss

    def _update_batch(self, items):
        """Called by the runtime once per batch, with (index, [slot views]) per parameter."""
        by_group = defaultdict(list)
        for i, views in items:
            by_group[self._where[i]].append((self._meta[i][0], views))
        inner = self._inner
        for gi in sorted(by_group):
            group = self.param_groups[gi]
            entries = by_group[gi]
            inner_group = {k: v for k, v in group.items() if k != "params"}
            inner_group["params"] = [p for p, _ in entries]
            state = defaultdict(dict)
            for p, views in entries:
                s = {"step": self.state[p]["step"], "exp_avg": views[0], "exp_avg_sq": views[1]}
                if group["amsgrad"]:
                    s["max_exp_avg_sq"] = views[2]
                state[p] = s
            inner.param_groups = [inner_group]
            inner.state = state
            try:
                inner.step()
            finally:
                inner.state = defaultdict(dict)
                inner.param_groups = []

    # ----- phases --------------------------------------------------------------------------------

    def prefetch(self, max_batches=None):
        """Starts loading the next step's first batches (in step order, those neither resident nor in
        flight) into device memory, at most ``max_batches``; never blocks the host. Returns the
        batches resident or in flight for the next step (0 before the first step). Call it after a
        backward (e.g. from a backward hook of the first layers) or any time between two steps."""
        if max_batches is not None and (isinstance(max_batches, bool) or not isinstance(max_batches, int)
                                        or max_batches < 0):
            raise ValueError(f"{self._name}.prefetch: max_batches must be None or an int >= 0, got {max_batches!r}")
        with self._lock:
            return 0 if self._rt is None else self._rt.prefetch(max_batches)

    def finish_offload(self):
        """Finishes a deferred offload (defer_offload=True): torch's current stream waits the copies
        and their device memory is released behind them. Never blocks the host."""
        with self._lock:
            if self._rt is not None:
                self._rt.finish_offload()

    @property
    def offload_pending(self):
        """True while a deferred offload is in flight."""
        return self._rt is not None and self._rt.offload_pending

    def synchronize(self):
        """Brings every batch home: the host stores are complete and synchronized, nothing of the
        state is left on the device except slots smaller than min_swap_numel."""
        with self._lock:
            if self._rt is not None:
                self._rt.synchronize()

    def swap_stats(self):
        """Sizes of the last step: batches, swappable/unswappable/arena/host-store bytes, prefetched and
        resident batches."""
        with self._lock:
            return {} if self._rt is None else self._rt.stats()

    def state_tensors(self, p):
        """CPU copies of parameter ``p``'s state, as torch.optim.Adam keeps it in ``state[p]``
        (``{}`` before its first step)."""
        with self._lock:
            i = self._index.get(p)
            if i is None:
                raise KeyError(f"{self._name}.state_tensors: the tensor is not a parameter of this optimizer")
            if "step" not in self.state[p]:
                return {}
            return self._state_entry(p, i, self._rt.state_views(i))

    # ----- state dicts ---------------------------------------------------------------------------

    def _state_entry(self, p, i, views):
        entry = {"step": self.state[p]["step"].detach().to("cpu", copy=True)}
        for key, v in zip(_slot_keys(self._meta[i][4]), views):
            entry[key] = v.to("cpu", copy=True)
        return entry

    def state_dict(self):
        """torch's format: {'state': {id: {'step', 'exp_avg', 'exp_avg_sq'[, 'max_exp_avg_sq']}},
        'param_groups': [...]}, ids numbered over the groups in order. Every tensor is a CPU copy."""
        for hook in getattr(self, "_optimizer_state_dict_pre_hooks", {}).values():
            hook(self)
        with self._lock:
            mapping, groups, start = {}, [], 0
            for group in self.param_groups:
                packed = {k: v for k, v in group.items() if k != "params"}
                for n, p in enumerate(group["params"], start):
                    mapping.setdefault(id(p), n)
                packed["params"] = [mapping[id(p)] for p in group["params"]]
                start += len(packed["params"])
                groups.append(packed)
            state = {}
            if self._rt is not None:
                self._rt.synchronize()
            for p, s in self.state.items():
                if "step" not in s:
                    continue
                i = self._index[p]
                state[mapping[id(p)]] = self._state_entry(p, i, self._rt.state_views(i))
        out = {"state": state, "param_groups": groups}
        for hook in getattr(self, "_optimizer_state_dict_post_hooks", {}).values():
            result = hook(self, out)
            if result is not None:
                out = result
        return out

    def load_state_dict(self, state_dict):
        """Loads a state dict of torch.optim.Adam/AdamW or of this class. Everything is checked first
        (groups, ids, keys, shapes); on a mismatch a ValueError names it and nothing changes. The
        state goes into pipeswap's host stores; 'step' is placed as torch places it."""
        name = self._name
        for hook in getattr(self, "_optimizer_load_state_dict_pre_hooks", {}).values():
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError(f"{name}.load_state_dict: expected a dict with 'state' and 'param_groups'")
        with self._lock:
            groups, saved_groups = self.param_groups, state_dict["param_groups"]
            if len(groups) != len(saved_groups):
                raise ValueError(f"{name}.load_state_dict: the state dict has {len(saved_groups)} parameter "
                                 f"group(s), this optimizer {len(groups)}")
            for gi, (g, sg) in enumerate(zip(groups, saved_groups)):
                if len(g["params"]) != len(sg["params"]):
                    raise ValueError(f"{name}.load_state_dict: param_groups[{gi}] has {len(sg['params'])} "
                                     f"parameter(s) in the state dict, {len(g['params'])} here")
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
                    raise ValueError(f"{name}.load_state_dict: state for id {old!r}, which no parameter group "
                                     "of the state dict lists")
                p = id_map[old]
                gi, k = place[old]
                where = f"state[{old!r}] ({self._param_name(gi, k)})"
                amsgrad = self._meta[self._index[p]][4]
                if bool(saved_groups[gi]["amsgrad"]) != amsgrad:
                    raise ValueError(f"{name}.load_state_dict: param_groups[{gi}]['amsgrad'] is "
                                     f"{saved_groups[gi]['amsgrad']} in the state dict, {amsgrad} here")
                if not isinstance(s, dict):
                    raise ValueError(f"{name}.load_state_dict: {where} is not a dict")
                need = ["step"] + _slot_keys(amsgrad)
                missing = [key for key in need if key not in s]
                extra = [key for key in s if key not in need]
                if missing or extra:
                    raise ValueError(f"{name}.load_state_dict: {where} has keys {sorted(s)}; expected "
                                     f"{need} (amsgrad={amsgrad})")
                for key in need[1:]:
                    v = s[key]
                    if not isinstance(v, torch.Tensor) or tuple(v.shape) != tuple(p.shape):
                        got = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
                        raise ValueError(f"{name}.load_state_dict: {where}['{key}'] is {got} but the "
                                         f"parameter has shape {tuple(p.shape)}: a state dict of another model?")
                    if v.is_complex() or not v.is_floating_point():
                        raise ValueError(f"{name}.load_state_dict: {where}['{key}'] has dtype {v.dtype}")
                step = s["step"]
                if isinstance(step, torch.Tensor):
                    if step.numel() != 1 or step.is_complex():
                        raise ValueError(f"{name}.load_state_dict: {where}['step'] must be a real scalar")
                elif isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
                    raise ValueError(f"{name}.load_state_dict: {where}['step'] must be a number")
                entries.append((p, gi, s))
            # Everything checked: apply.
            for gi, (g, sg) in enumerate(zip(groups, saved_groups)):
                new = {k: v for k, v in sg.items() if k != "params"}
                if "param_names" in g:
                    new["param_names"] = g["param_names"]
                new["params"] = g["params"]
                g.clear()
                g.update(new)
            if self._rt is not None:
                self._rt.synchronize()
            loaded = set()
            for p, gi, s in entries:
                i = self._index[p]
                for view, key in zip(self._rt.state_views(i), _slot_keys(self._meta[i][4])):
                    view.copy_(s[key])
                group = groups[gi]
                step = s["step"]
                step = step.detach().reshape(()) if isinstance(step, torch.Tensor) else torch.tensor(float(step))
                if group["capturable"] or group["fused"]:
                    step = step.to(dtype=_get_scalar_dtype(is_fused=group["fused"]), device=p.device, copy=True)
                else:
                    step = step.to(dtype=_get_scalar_dtype(), device="cpu", copy=True)
                self.state[p] = {"step": step}
                loaded.add(p)
            # As torch does, parameters the state dict has no state for start afresh.
            for p in list(self.state):
                if p not in loaded:
                    i = self._index[p]
                    for view in self._rt.state_views(i):
                        view.zero_()
                    del self.state[p]
        for hook in getattr(self, "_optimizer_load_state_dict_post_hooks", {}).values():
            hook(self)

    def __getstate__(self):
        raise TypeError(f"{self._name} cannot be pickled (its state lives in pipeswap's host stores); "
                        "save its state_dict() instead")


class SwapAdamW(_SwapAdamBase):
    """``torch.optim.AdamW`` with its state in pinned host memory between steps: the same
    arguments, the same bits.

    Swap settings (keyword-only):
      swap_times      batches a step is split into (1 = the whole state at once); default 16
      pipeline        "packed" (two reusable device staging arenas, one large copy per batch and
                      direction) or "per_tensor" (each state tensor its own device storage)
      resident_share  bytes of state (whole batches, from the front) that stay on the device
      defer_offload   step() returns with the last batches' copies to the host still in flight;
                      finish_offload(), the next step() or prefetch() finish them
      min_swap_numel  state tensors with fewer elements stay on the device (default 1024)
    ``differentiable=True`` is refused; ``capturable=True`` works outside CUDA graph capture.
    """

    _torch_class = torch.optim.AdamW

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
                 swap_times=16, pipeline="packed", resident_share=0, defer_offload=False, min_swap_numel=1024):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize, foreach=foreach, capturable=capturable,
                                      differentiable=differentiable, fused=fused),
                         swap_times, pipeline, resident_share, defer_offload, min_swap_numel)


class SwapAdam(_SwapAdamBase):
    """``torch.optim.Adam`` with its state in pinned host memory between steps (see SwapAdamW for the
    swap settings). Further keyword arguments of this torch's Adam (decoupled_weight_decay) pass
    through."""

    _torch_class = torch.optim.Adam

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
                 swap_times=16, pipeline="packed", resident_share=0, defer_offload=False, min_swap_numel=1024,
                 **torch_kwargs):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      foreach=foreach, maximize=maximize, capturable=capturable,
                                      differentiable=differentiable, fused=fused, **torch_kwargs),
                         swap_times, pipeline, resident_share, defer_offload, min_swap_numel)
