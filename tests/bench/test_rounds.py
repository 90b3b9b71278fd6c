"""`spire bench rounds`: a profiled step's top-level events sorted into graph replays (compiled
forwards and a round's graph, `graphs.GRAPH_REGION`), eager ops (kernels the host launches one by
one), views (no kernel), host syncs and the host's microseconds outside the replays."""

from __future__ import annotations

import torch

from spirelib.bench import rounds


def test_a_profiled_step_counts_replays_eager_ops_views_and_syncs():
    graph = torch.compile(lambda x: (x * 2 + 1).sin(), fullgraph=True, dynamic=False)
    x = torch.randn(8)
    graph(x)  # compiled before it is counted

    def step():
        y = graph(x)  # one replay: its own ops are the graph's
        z = y + 1  # one eager op
        z[:4]  # a view
        return float(z.sum())  # a reduction and its copy to the host (eager), one host sync

    counted = rounds.count(step)
    assert counted["replays"] == 1
    assert counted["ops"] == {"add": 1, "sum": 1, "item": 1}, counted["ops"]  # item: the copy to the host
    assert counted["views"] >= 1 and counted["syncs"] == 1
    assert counted["host_us"] > 0


def test_a_rounds_graph_region_is_one_replay_whatever_runs_inside_it():
    """A round run through `GRAPHS.run` (its graph on a GPU; a plain call, marked, on the CPU): what
    runs inside is the graph's, a sync there included; the host's time is what runs outside."""
    from spirelib.decoding.graphs import GRAPHS

    x = torch.randn(64)

    def round_(out):
        for _ in range(20):
            out.add_(x.sin())
        float(out.sum())  # inside the region: not the host's (a capture would refuse it; counted there)

    out = torch.zeros(64)

    def step():
        GRAPHS.run((), round_, out, device=x.device)
        out.mul_(0.5)  # one eager op outside

    counted = rounds.count(step)
    assert counted["replays"] == 1 and counted["ops"] == {"mul_": 1} and counted["syncs"] == 0, counted
    assert counted["host_us"] > 0


def test_eager_decoding_is_all_eager_ops_and_the_goal_says_so():
    from spirelib.model.config import ModelConfig
    from spirelib.model.transformer import Transformer

    torch.manual_seed(0)
    target = Transformer(ModelConfig(vocab_size=64, num_layers=2, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8,
                                     d_ff=32)).eval()
    (ad,) = rounds.steady_state_counts(target, {}, batch=2, context=8, k=2, temperature=0.0)
    assert ad["method"] == "ad" and ad["replays"] == 0 and ad["eager_ops"] > 10 and not rounds.goal(ad)
    assert rounds.goal({"method": "ad", "replays": 1, "eager_ops": 2, "syncs": 0})
    assert not rounds.goal({"method": "ad", "replays": 1, "eager_ops": 3, "syncs": 0})
    assert rounds.goal({"method": "spire", "replays": 3, "eager_ops": 5, "syncs": 0})
    assert not rounds.goal({"method": "spire", "replays": 4, "eager_ops": 5, "syncs": 0})
    assert not rounds.goal({"method": "spire", "replays": 1, "eager_ops": 1, "syncs": 1})
