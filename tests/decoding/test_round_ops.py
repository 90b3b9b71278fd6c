"""Host work per decoding round under compiled decoding, counted on the CPU through the CUDA-graph
stand-in (`graph_pool`): the graph replays, and the aten ops dispatched outside them, each a kernel
a GPU launches from the host one by one (views, which launch nothing, are not counted).

A steady-state AD step is one replay; an SD round k + 1 replays (k draft passes, one verification).
The eager ops around them are today's counts, the ceilings below: a change that adds host work to a
round fails here. They are well above what a round could cost with its bookkeeping inside the
graphs (about 3 eager ops an AD step, 10 an SD round): the cache's bookkeeping (`prepare`, the
visibility mask), rejection sampling and rollback still run eagerly between replays."""

from __future__ import annotations

import pytest
import torch
from graph_pool import GraphPool, counting
from test_graph_outputs import CONTEXTS, K, drafts, models  # noqa: F401  (models: the fixture)

from spirelib.decoding.speculative import autoregressive_rounds, speculative_rounds

#: Eager ops per steady-state step (AD) or round (SD, k = 3), measured on 2026-12-04 with the caches'
#: bookkeeping inside the forwards' graphs (before: AD 26 and 46, SD 159-331).
CEILINGS = {("ad", 0.0): 1, ("ad", 1.0): 21,
            ("vanilla", 0.0): 59, ("vanilla", 1.0): 144,
            ("magicdec", 0.0): 83, ("magicdec", 1.0): 168,
            ("spire", 0.0): 100, ("spire", 1.0): 185,
            ("spire, no target activations", 0.0): 59, ("spire, no target activations", 1.0): 144}


def steady_round(models, name, temperature):
    """(replays, OpCounter) of the 4th step or round of a generation through a `GraphPool`."""
    pool = GraphPool().install(models["target"], models["small"], models["spire"], models["plain"])
    try:
        gen = torch.Generator().manual_seed(0)
        if name == "ad":
            rounds = autoregressive_rounds(models["target"], CONTEXTS, 40, temperature=temperature, generator=gen)
        else:
            rounds = speculative_rounds(models["target"], drafts(models, temperature, gen)[name], CONTEXTS, 40, K,
                                        temperature=temperature, generator=gen)
        for _ in range(3):
            next(rounds)
        with counting(pool) as (ops, before):
            next(rounds)
        return pool.replays - before, ops
    finally:
        GraphPool.uninstall(*models.values())


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", ["ad", "vanilla", "magicdec", "spire", "spire, no target activations"])
def test_a_round_is_its_replays_plus_no_more_eager_ops_than_today(models, name, temperature):  # noqa: F811
    replays, ops = steady_round(models, name, temperature)
    assert replays == (1 if name == "ad" else K + 1), (name, replays)
    assert ops.ops <= CEILINGS[name, temperature], (ops.ops, ops.names.most_common(12))
