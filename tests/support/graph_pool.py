"""CUDA graph trees' output rule, on the CPU: a stand-in for compiled decoding (`GraphPool`).

Under `torch.compile(mode="reduce-overhead")` every compiled graph of a device replays into one
memory pool, and each replay, of any graph, may overwrite the outputs of the replays before it
(torch raises "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent
run" where it can tell). A consumer must finish with an output, or copy what it keeps, before the
next replay. The CPU's compiled graphs allocate fresh outputs, so no CPU run shows such a bug.

`GraphPool.install(models)` replaces each model's compiled forward (`Transformer._compiled`,
`SpireDraftModel._compiled_step`) and the engine's captured rounds (`decoding.graphs.GRAPHS.run`:
a whole speculative round or AD step) with their eager code, run as a "replay": before it runs,
every output any earlier replay returned is overwritten with garbage (NaN, or an out-of-range
token id), as a pool reused by the next replay would be. A forward inside a round is part of the
round's graph, not a replay of its own. A decoding path that reads an output after the next
replay, or feeds one into it, then computes from garbage and no longer equals eager decoding. A
tensor a replay leaves on an input object (a cache's attribute replaced, not updated in place) is
such an output too; a tensor it updates in place must be a static address (a cache's own, marked
with `torch._dynamo.mark_static_address`), or CUDA graphs would not replay that graph at all.

The pool also counts what a GPU user pays per round (`OpCounter`): the replays, and the aten ops
dispatched outside them (each a kernel launch on a GPU; views, which launch nothing, apart).
"""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
from host_syncs import SYNC_OPS
from torch.utils._python_dispatch import TorchDispatchMode

from spirelib.decoding.graphs import GRAPHS
from spirelib.model.eagle3 import Eagle3DraftModel
from spirelib.model.spire import SpireDraftModel
from spirelib.model.transformer import Transformer

GARBAGE_TOKEN = -(2 ** 40)  # no embedding has this row: a token read after the next replay fails loudly


def _tensors(out):
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (list, tuple)):
        for item in out:
            yield from _tensors(item)


def _held(args) -> dict[tuple[int, str], torch.Tensor]:
    """The tensors among `args` and held by the objects among them, and by the objects those hold
    (a round's draft, its caches, the rows; attributes and lists of tensors), by (argument, name):
    what a replay reads, and may write in place or replace."""
    held = {}

    def visit(i, obj, name, seen):
        if isinstance(obj, torch.Tensor):
            held[i, name] = obj
        elif isinstance(obj, list):
            for j, item in enumerate(obj):
                if isinstance(item, torch.Tensor):
                    held[i, f"{name}[{j}]"] = item
        elif hasattr(obj, "__dict__") and not isinstance(obj, torch.nn.Module) and id(obj) not in seen:
            seen.add(id(obj))
            for attr, value in vars(obj).items():
                visit(i, value, f"{type(obj).__name__}.{attr}", seen)

    for i, arg in enumerate(args):
        visit(i, arg, f"argument {i}", set())
    return held


class GraphPool:
    """One device's pool of graph outputs, shared by every model installed in it."""

    def __init__(self):
        self.live: list[torch.Tensor] = []  # outputs of replays since the last overwrite
        self.replays = 0
        self.inside = False  # a replay is running: its ops are the graph's, not eager ops

    def overwrite(self) -> None:
        """What the next replay does to every output before it."""
        with torch.no_grad(), self.graph():
            for t in self.live:
                t.fill_(float("nan") if t.is_floating_point() else (GARBAGE_TOKEN if t.dtype != torch.bool else True))
        self.live.clear()

    @contextlib.contextmanager
    def graph(self):
        """Ops run here are the graph's (or the pool's own), not eager ops of the caller."""
        self.inside = True
        try:
            yield
        finally:
            self.inside = False

    def replay(self, fn):
        def run(*args, **kwargs):
            if self.inside:  # a forward inside a captured round: part of the round's graph
                return fn(*args, **kwargs)
            self.overwrite()
            self.replays += 1
            held = _held(args)  # the tensors the inputs hold before the replay
            versions = {id(t): t._version for t in held.values()}
            with self.graph():
                out = fn(*args, **kwargs)
            self.live.extend(_tensors(out))
            after = _held(args)
            for key, t in after.items():
                if held.get(key) is not t:  # a tensor the replay left on an input object: a graph output too
                    self.live.append(t)
                elif t._version != versions[id(t)] and not hasattr(t, "_dynamo_static_input_type"):
                    raise AssertionError(f"a replay wrote {key[1]} in place, which is not a static address: "
                                         "CUDA graphs would skip this graph (torch._dynamo.mark_static_address)")
            return out
        return run

    def install(self, *models) -> GraphPool:
        """Decode `models` (targets, SPIRe and EAGLE-3 drafts; None is skipped) and the engine's rounds through this pool."""
        GRAPHS.run = lambda key, fn, *args, device: self.replay(fn)(*args)
        for model in models:
            if isinstance(model, (SpireDraftModel, Eagle3DraftModel)):
                model._compiled_step = self.replay(model._step)
                if isinstance(model, SpireDraftModel):
                    model.body._compiled = self.replay(model.body._stream)
            elif isinstance(model, Transformer):
                model._compiled = self.replay(model._stream)
            elif model is not None:
                raise TypeError(f"no compiled forward to stand in for on {type(model).__name__}")
        return self

    @staticmethod
    def uninstall(*models) -> None:
        vars(GRAPHS).pop("run", None)
        for model in models:
            if isinstance(model, SpireDraftModel):
                model._compiled_step = model.body._compiled = None
            elif isinstance(model, Eagle3DraftModel):
                model._compiled_step = None
            elif isinstance(model, Transformer):
                model._compiled = None


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched outside `pool`'s replays: `ops` (kernels a GPU would
    launch one by one from the host) and `views` (metadata only), per op name in `names`; and the
    host syncs inside them (`syncs_inside`, per op: a CUDA graph's capture fails on one)."""

    def __init__(self, pool: GraphPool):
        super().__init__()
        self.pool = pool
        self.ops = 0
        self.views = 0
        self.names: Counter = Counter()
        self.syncs_inside: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.pool.inside and func.overloadpacket.__name__ in SYNC_OPS:
            self.syncs_inside[func.overloadpacket.__name__] += 1
        if not self.pool.inside:
            if func.is_view or func.overloadpacket.__name__ in ("detach", "lift_fresh"):
                self.views += 1
            else:
                self.ops += 1
                self.names[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counting(pool: GraphPool):
    """(OpCounter, replays before) over the block: `pool.replays - before` replays ran inside."""
    counter = OpCounter(pool)
    before = pool.replays
    with counter:
        yield counter, before
