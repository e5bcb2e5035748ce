"""Counting the storages PyTorch operations write, for the activation tests (test_activation_table.py,
dist/tp_activation_worker.py): a DTensor or a functional collective's result counts by the plain
tensor under it."""

import gc
import weakref

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def local(x):
    """The plain tensor under a DTensor or a functional collective's result (x itself if plain)."""
    while isinstance(x, DTensor) or hasattr(x, "elem"):
        x = x._local_tensor if isinstance(x, DTensor) else x.elem
    return x


def ptr(x):
    """The address of the storage under x, the key the counts skip by."""
    return local(x).untyped_storage().data_ptr()


class Storages(TorchDispatchMode):
    """Every storage an operation writes while the mode is on, to count those still alive after."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in tree_leaves(out):
            if isinstance(x, torch.Tensor):
                st = local(x).untyped_storage()
                self.made.append((weakref.ref(st), st.data_ptr(), st.nbytes()))
        return out

    def alive(self, skip):
        """Bytes of the storages made and still alive, less those whose address is in skip."""
        gc.collect()
        return sum(dict((p, n) for r, p, n in self.made if r() is not None and p not in skip).values())
