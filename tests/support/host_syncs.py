"""Count host syncs: every point where the host waits for a tensor's value (on a GPU, for the
device to catch up), which is what keeps a GPU's CPU and device from overlapping.

`count_host_syncs()` sees them on the CPU too: the aten ops that return a value to Python or
whose output shape depends on the data (`.item()`, `int()`, `bool()` and `float()` of a tensor
call `_local_scalar_dense`; `torch.equal`; boolean-mask indexing and `nonzero`), and the
Tensor methods that copy to the host (`tolist`, `numpy`, `cpu`)."""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: aten ops that make the host wait for the device.
SYNC_OPS = {"_local_scalar_dense", "equal", "is_nonzero", "nonzero", "masked_select", "unique", "_unique2"}


class _SyncCounter(TorchDispatchMode):
    def __init__(self, counts: Counter):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in SYNC_OPS:
            self.counts[name] += 1
        elif name == "index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                     for i in (args[1] if len(args) > 1 else []) if i is not None):
            self.counts["boolean index"] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_host_syncs():
    """Counts per kind of sync inside the block (a Counter; `sum(c.values())` is the total)."""
    counts: Counter = Counter()
    saved = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy", "cpu")}

    def wrap(name):
        original = saved[name]

        def method(self, *args, **kwargs):
            if name != "cpu" or self.device.type != "cpu":
                counts[f"Tensor.{name}"] += 1
            return original(self, *args, **kwargs)
        return method

    for name in saved:
        setattr(torch.Tensor, name, wrap(name))
    try:
        with _SyncCounter(counts):
            yield counts
    finally:
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)
