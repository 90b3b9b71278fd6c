"""Token windows drawn from a split's documents, all deterministic from a seed (method §5, 6).

- `WindowSampler.batch(step, rank, world)`: training windows (B, T+1), drawn from
  (seed, step) for the global batch, each rank taking its slice, so a resumed or
  distributed run sees exactly the windows of an uninterrupted single-process run.
- `validation_windows(docs, n, length, seed)`: a fixed set of windows for validation loss.
- `eval_contexts(docs, n, L, G, seed)`: contexts of exactly L tokens from validation
  documents long enough to hold L + G tokens, with the G reference tokens that follow.

The documents are `corpus.FlatDocs` or `corpus.ZarrDocs`.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from spirelib.training.corpus import FlatDocs, ZarrDocs

_TRAIN, _VALIDATION, _CONTEXTS = 0, 1, 2  # the purposes a seed's streams are spawned for


def _rng(seed: int, purpose: int, index: int = 0) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(purpose, index)))


class WindowSampler:
    """Training batches of token windows (B, T+1), a pure function of (seed, step): the global
    batch is drawn from (seed, step) and rank r of `world` takes rows [r*B/world, (r+1)*B/world),
    reading only those."""

    def __init__(self, docs: FlatDocs | ZarrDocs, batch_size: int, length: int, seed: int):
        self.docs, self.batch_size, self.length, self.seed = docs, batch_size, length, seed

    def batch(self, step: int, rank: int = 0, world: int = 1) -> torch.Tensor:
        if self.batch_size % world:
            raise ValueError(f"batch_size {self.batch_size} is not divisible by the world size {world}")
        per_rank = self.batch_size // world
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        return torch.from_numpy(self.docs.sample_windows(_rng(self.seed, _TRAIN, step), self.batch_size, self.length,
                                                         rows=mine))  # (B/world, T+1)

    def batches(self, steps: range, rank: int = 0, world: int = 1, pin: bool = False) -> Iterator[torch.Tensor]:
        """This rank's batches for `steps`, each read (and, for a GPU, pinned, so that its copy to
        the device is asynchronous) in a background thread while the step before it trains."""
        def load(step: int) -> torch.Tensor:
            b = self.batch(step, rank, world)
            return b.pin_memory() if pin else b

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="batches") as pool:
            ahead = None
            for step in steps:
                current = ahead.result() if ahead is not None else load(step)
                ahead = pool.submit(load, step + 1) if step + 1 in steps else None
                yield current


def validation_windows(docs: FlatDocs | ZarrDocs, n: int, length: int, seed: int) -> torch.Tensor:
    """A fixed set of n windows (n, length) for validation loss."""
    return torch.from_numpy(docs.sample_windows(_rng(seed, _VALIDATION), n, length))


@dataclass(frozen=True)
class EvalContexts:
    tokens: torch.Tensor  # (n, L) contexts
    continuation: torch.Tensor  # (n, G) the tokens that follow each context in its document
    doc: np.ndarray  # (n,) document index in the split
    start: np.ndarray  # (n,) offset of the context in its document


def eval_contexts(docs: FlatDocs | ZarrDocs, n: int, context_len: int, gen_len: int, seed: int) -> EvalContexts:
    """n contexts of exactly `context_len` tokens (method §5), each from a validation document
    that holds context_len + gen_len tokens, uniform over all such windows."""
    need = context_len + gen_len
    room = docs.lengths - need + 1  # (n_docs,) valid start offsets per document
    if room.max(initial=0) < 1:
        raise ValueError(f"no validation document holds L + G = {need} tokens (longest: {int(docs.lengths.max())}); "
                         "lower the context length or use a corpus with longer documents")
    room = np.maximum(room, 0)
    rng = _rng(seed, _CONTEXTS)
    doc = rng.choice(len(room), size=n, p=room / room.sum())
    start = rng.integers(0, room[doc])
    windows = torch.from_numpy(docs.read_windows(doc, start, need))  # (n, L+G)
    return EvalContexts(windows[:, :context_len], windows[:, context_len:], doc, start)
