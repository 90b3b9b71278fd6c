"""Token documents for the data tests: a flat stream of known tokens and a tiny Zarr store."""

from __future__ import annotations

import numpy as np
import pytest

from spirelib.training.corpus import GPT2_VOCAB, FlatDocs


def flat_docs(lengths, seed=0):
    """Documents of the given lengths with distinct token values (doc i uses i*1000 + offset)."""
    arrays = [1000 * i + np.arange(n) for i, n in enumerate(lengths)]
    starts = np.concatenate([[0], np.cumsum(np.array(lengths) + 1)[:-1]])
    tokens = np.concatenate([np.append(a, -1) for a in arrays])
    return FlatDocs(tokens, starts, np.array(lengths))


def make_zarr_store(root, rows=10, cols=100, chunks=(4, 32)):
    """A tiny LongCrawl64 look-alike: Zarr v2 arrays train.zarr/heldout.zarr of uint16 ids."""
    zarr = pytest.importorskip("zarr")
    arrays = {}
    for name, n in (("train.zarr", rows), ("heldout.zarr", rows // 2)):
        values = (np.arange(n * cols).reshape(n, cols) * 7 % GPT2_VOCAB).astype(np.uint16)
        z = zarr.create_array(str(root / name), shape=values.shape, chunks=chunks, dtype="uint16", zarr_format=2)
        z[:] = values
        arrays[name] = values
    return arrays
