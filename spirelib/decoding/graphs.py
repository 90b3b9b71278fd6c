"""One CUDA graph per decoding round (method §3.5): a speculative round (the k draft passes, the
verification, rejection sampling, rollback and the draft's catching up) or an AD step, captured
whole and replayed, so the host launches one graph a round instead of every op between forwards.

The engine (`speculative`) writes each round as a function of static state: caches, the rows'
bookkeeping and the generation's uniforms (`sampling.Noise`) live at fixed addresses for the whole
process (`kvcache.reuse`) and are updated in place; nothing random happens inside a round and the
host reads nothing from it (the stop check reads a flag one round late, `LateFlag`). `GRAPHS.run`
then serves a round's function by key: on a CUDA device the first call of a key runs eagerly (the
compiled forwards inside build their kernels), the second records a graph, every later one replays
it; elsewhere it calls the function (the CPU has no graphs; its forwards are compiled C++).

A key is what the function's Python decided (the draft's kind and options, temperature, k, G) plus
the addresses of every tensor it reads or writes: a round over the same buffers replays, one over
new buffers records anew. Every recording is counted (`recordings`), so a timed region can tell
that it replayed (`watch`). `release` frees every graph and its memory pool.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

import torch

#: The profiler's name for a round's graph (`RoundGraphs.run`): one launch on a GPU, whatever it holds.
GRAPH_REGION = "decoding round graph"


def addresses(tensors: Iterable[torch.Tensor]) -> tuple:
    """What a graph over `tensors` depends on: each one's address, shape and dtype."""
    return tuple((t.data_ptr(), tuple(t.shape), t.dtype) for t in tensors)


class RoundGraphs:
    """The process's captured rounds: one graph per key, one memory pool for all of them (every
    round writes what it keeps into static buffers, so no graph's output outlives its replay)."""

    def __init__(self):
        self.graphs: dict = {}
        self.warm: set = set()
        self.recordings = 0
        self.pool = None

    @staticmethod
    def captures(device: torch.device) -> bool:
        """Whether rounds on `device` run as captured graphs (CUDA) or as calls (anything else)."""
        return device.type == "cuda"

    def run(self, key: tuple, fn: Callable, *args, device: torch.device) -> None:
        """`fn(*args)` as the graph of `key` (which must name every address `fn` reads or writes),
        marked for the profiler as one region (`GRAPH_REGION`, what `bench rounds` counts as a replay)."""
        with torch.profiler.record_function(GRAPH_REGION):
            if self.captures(device):
                self._replay(key, fn, args)
            else:
                fn(*args)

    def _replay(self, key: tuple, fn: Callable, args: tuple) -> None:
        graph = self.graphs.get(key)
        if graph is None:
            if key not in self.warm:  # the first call runs eagerly: compiled kernels build outside any capture
                self.warm.add(key)
                fn(*args)
                return
            graph = torch.cuda.CUDAGraph()
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self.pool):  # records; runs nothing
                fn(*args)
            self.graphs[key] = graph
            self.recordings += 1
        graph.replay()

    @contextlib.contextmanager
    def watch(self):
        """A list that holds, after the block, how many graphs were recorded inside it: a timed
        region whose count is not 0 timed a recording (a sync and a capture), not only replays."""
        seen = [self.recordings]
        yield seen
        seen[0] = self.recordings - seen[0]

    def release(self) -> None:
        """Forget every graph and free their memory pool (between benchmarks of different shapes)."""
        self.graphs.clear()
        self.warm.clear()
        self.pool = None
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


GRAPHS = RoundGraphs()


class LateFlag:
    """A device flag the host reads one round late: after each round the flag is copied to the
    host without waiting (`post`); `previous` reads the copy posted a round before the last, which
    on a GPU means waiting for that round only while the last one runs, so the device never
    drains. Where the flag says stop, the round in flight changed nothing (a finished row is frozen)."""

    def __init__(self, device: torch.device):
        pinned = device.type == "cuda"
        self.host = [torch.zeros((), dtype=torch.bool, pin_memory=pinned) for _ in range(2)]
        self.events: list = [None, None]
        self.posted = 0

    def post(self, flag: torch.Tensor) -> None:
        slot = self.posted % 2
        self.host[slot].copy_(flag, non_blocking=True)
        if flag.device.type == "cuda":
            self.events[slot] = torch.cuda.Event()
            self.events[slot].record()
        self.posted += 1

    def previous(self) -> bool:
        """The flag as it stood after the round before the last posted (False before two posts)."""
        if self.posted < 2:
            return False
        slot = self.posted % 2  # the older of the two copies
        if self.events[slot] is not None:
            self.events[slot].synchronize()
        return bool(self.host[slot])
