"""Host work per decoding round under compiled decoding, counted on the CPU through the CUDA-graph
stand-in (`graph_pool`): the graph replays, and the aten ops dispatched outside them, each a kernel
a GPU launches from the host one by one (views, which launch nothing, are not counted), and the
host syncs inside them (a capture would fail on one).

A speculative round of every drafting method, greedy and sampled, is one replay: the k draft
passes, the verification, rejection sampling, rollback and the draft's catching up all inside it;
outside it only the copy of the stop flag to the host. An AD step is one replay. At 8 target
layers and k = 4, with the goals of the GPU round (at most 3 replays and 5 eager ops a round, at
most 2 ops an AD step) as the ceilings; today's counts are 1 replay, and 1 op a round, 0 a step."""

from __future__ import annotations

import pytest
import torch
from graph_pool import GraphPool, counting
from test_graph_outputs import CONTEXTS, K, drafts, models  # noqa: F401  (models: the fixture)

from spirelib.decoding.speculative import Options, autoregressive_rounds, speculative_rounds
from spirelib.throughput.methods import BUDGETED

METHODS = ["vanilla", *BUDGETED, "spire", "spire, no target activations", "lookup", "eagle3"]
MAX_OPS, MAX_AD_OPS = 5, 2  # the GPU round's goal: at most 3 replays, 5 ops (AD 2); replays are held to 1


def steady_round(models, name, temperature):  # noqa: F811  (models: the fixture)
    """(replays, OpCounter) of the 4th step or round of a generation through a `GraphPool`."""
    pool = GraphPool().install(*models.values())
    try:
        gen = torch.Generator().manual_seed(0)
        if name == "ad":
            rounds = autoregressive_rounds(models["target"], CONTEXTS, 40, temperature=temperature, generator=gen)
        else:
            rounds = speculative_rounds(models["target"], drafts(models, temperature)[name], CONTEXTS, 40, K,
                                        Options(temperature, generator=gen))
        for _ in range(3):
            next(rounds)
        with counting(pool) as (ops, before):
            next(rounds)
        rounds.close()
        return pool.replays - before, ops
    finally:
        GraphPool.uninstall(*models.values())


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", ["ad", *METHODS])
def test_a_round_is_one_replay_with_no_host_sync_and_almost_no_eager_op(models, name, temperature):  # noqa: F811
    replays, ops = steady_round(models, name, temperature)
    assert replays == 1, (name, replays)
    assert ops.ops <= (MAX_AD_OPS if name == "ad" else MAX_OPS), (ops.ops, ops.names.most_common(12))
    assert not ops.syncs_inside, dict(ops.syncs_inside)


def test_the_count_sees_a_round_that_is_not_captured(models, monkeypatch):  # noqa: F811
    """The counter itself: a round run as a plain call (no capture) shows its forwards as replays
    and its bookkeeping as eager ops."""
    from spirelib.decoding import speculative

    monkeypatch.setattr(speculative, "_rounds", lambda target, state, fn, args, timer: lambda: fn(*args, timer))
    replays, ops = steady_round(models, "magicdec", 0.0)
    assert replays == K + 1 and ops.ops > MAX_OPS, (replays, ops.ops)
