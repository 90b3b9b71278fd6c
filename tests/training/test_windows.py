"""Token windows (spirelib.training.windows): training batches as a function of (seed, step) that
ranks slice, validation windows, and evaluation contexts of exact length with their continuations."""

import numpy as np
import pytest
import torch
from token_docs import flat_docs, make_zarr_store

from spirelib.training.corpus import LongCrawl64
from spirelib.training.windows import WindowSampler, eval_contexts


def test_training_windows_are_a_function_of_seed_and_step_and_ranks_slice_the_global_batch():
    docs = flat_docs([300, 50, 700])
    sampler = WindowSampler(docs, batch_size=8, length=33, seed=5)
    a = sampler.batch(7)
    assert a.shape == (8, 33) and a.dtype == torch.int64
    assert torch.equal(a, WindowSampler(docs, 8, 33, seed=5).batch(7))
    assert not torch.equal(a, sampler.batch(8))
    assert torch.equal(torch.cat([sampler.batch(7, rank=r, world=4) for r in range(4)]), a)
    # Windows are contiguous runs of the stream.
    stream = torch.from_numpy(docs.tokens)
    for w in a:
        start = int(np.flatnonzero(docs.tokens == int(w[0]))[0])
        assert torch.equal(stream[start : start + 33], w)


def test_eval_contexts_have_exact_length_and_come_from_long_enough_documents():
    docs = flat_docs([40, 200, 90, 130])
    ctx = eval_contexts(docs, n=64, context_len=100, gen_len=20, seed=0)
    assert ctx.tokens.shape == (64, 100) and ctx.continuation.shape == (64, 20)
    assert set(ctx.doc.tolist()) <= {1, 3}  # only documents holding L + G = 120 tokens
    for toks, cont, d, s in zip(ctx.tokens, ctx.continuation, ctx.doc, ctx.start):
        full = torch.cat([toks, cont])
        assert torch.equal(full, torch.from_numpy(1000 * d + np.arange(s, s + 120)))
    assert torch.equal(eval_contexts(docs, 64, 100, 20, seed=0).tokens, ctx.tokens)
    with pytest.raises(ValueError, match="no validation document holds"):
        eval_contexts(docs, 4, 190, 20, seed=0)


def test_each_rank_reads_only_its_rows_and_batches_arrive_one_step_ahead(tmp_path, monkeypatch):
    """Under torchrun a rank decompresses only its share of the global batch (the same windows
    as the whole batch's rows, so scaling out changes nothing), and `batches` yields exactly
    `batch(step)` for each step, read in a background thread."""
    make_zarr_store(tmp_path, rows=10, cols=100, chunks=(4, 32))
    docs = LongCrawl64(str(tmp_path)).train
    sampler = WindowSampler(docs, batch_size=8, length=20, seed=3)
    whole = sampler.batch(2)
    read = []
    original = type(docs).read_windows
    monkeypatch.setattr(type(docs), "read_windows", lambda self, d, s, n: read.append(len(d)) or original(self, d, s, n))
    mine = sampler.batch(2, rank=1, world=4)
    assert torch.equal(mine, whole[2:4]) and read == [2]
    flat = WindowSampler(flat_docs([300, 50, 700]), batch_size=4, length=33, seed=5)
    assert all(torch.equal(b, flat.batch(s, 1, 2)) for s, b in zip(range(3, 9), flat.batches(range(3, 9), 1, 2)))
    assert len(list(flat.batches(range(3, 9)))) == 6 and list(flat.batches(range(0))) == []
