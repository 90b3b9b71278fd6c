"""Tables of the ablations (notebook 05): paired measurements and the rows built from them."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from spirelib.acceptance import tau_from_per_position
from spirelib.model import ModelConfig, Transformer
from spirelib.tables import ablations as tables
from spirelib.tau import AcceptCounts, DeltaTau, TauProtocol, delta_tau

CFG = ModelConfig(vocab_size=29, num_layers=2, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=64)


def counts(*rows):
    return AcceptCounts(torch.tensor(rows), k=2)


COUNTS = {0: {"spire": counts([2, 2, 1], [2, 1, -1]), "hard_target": counts([0, 1, 0], [1, 0, 0])},
          1: {"spire": counts([2, 1, 2], [2, 2, -1]), "hard_target": counts([1, 0, 0], [0, 0, 1])}}


def test_budget_note():
    assert tables.budget_note(100, 100, 3, 2, 5.0) == ("**Budget.** Each variant trains on 100 tokens per seed, "
                                                       "the main SPIRe draft's budget.")
    note = tables.budget_note(1_000, 4_000, 3, 2, 12.0)
    assert "25% of the main SPIRe draft's 4,000 (notebook 03): 3 variants x 2 seeds" in note
    assert "would take 24x this notebook's training time (12 s here" in note


def test_variant_counts_pair_every_variant_and_seed():
    from spirelib.spire import SpireConfig, SpireDraftModel

    torch.manual_seed(0)
    target = Transformer(CFG).double().eval()
    draft = SimpleNamespace(model=SpireDraftModel.from_target(target, SpireConfig(num_layers=1, window=4)).eval())
    contexts = torch.randint(0, CFG.vocab_size, (3, 8), generator=torch.Generator().manual_seed(2))
    out = tables.variant_counts(target, {0: {"a": draft, "b": draft}, 1: {"a": draft}}, contexts, 8,
                                TauProtocol(k=3, new_tokens=5), 1.0, progress=False)
    assert list(out) == [0, 1] and list(out[0]) == ["a", "b"] and list(out[1]) == ["a"]
    assert torch.equal(out[0]["a"].accepted, out[0]["b"].accepted)  # the same draft sees the same streams
    assert out[0]["a"].accepted.shape[0] == 3


def test_paired_deltas_over_seeds_and_measured_pairs_only():
    deltas = tables.paired_deltas(COUNTS, {"hard_target": ("hard_target", "spire"), "x": ("no_feedback", "spire")})
    assert list(deltas) == ["hard_target"]
    assert deltas["hard_target"] == delta_tau([COUNTS[0]["hard_target"], COUNTS[1]["hard_target"]],
                                              [COUNTS[0]["spire"], COUNTS[1]["spire"]])
    assert len(deltas["hard_target"].per_seed) == 2 and deltas["hard_target"].mean < 0


def test_predicted_taus_average_the_seeds():
    def trained(*alphas):
        return SimpleNamespace(summary={f"alpha_{j}": a for j, a in enumerate(alphas, start=1)})

    variants = {0: {"spire": trained(0.9, 0.8), "hard_target": trained(0.5, 0.5)},
                1: {"spire": trained(0.7, 0.6), "hard_target": trained(0.5, 0.5)}}
    out = tables.predicted_taus(variants, k=2)
    assert list(out) == ["spire", "hard_target"]
    assert out["spire"] == pytest.approx((tau_from_per_position([0.9, 0.8]) + tau_from_per_position([0.7, 0.6])) / 2)
    assert out["hard_target"] == pytest.approx(1 + 0.5 + 0.25)


def test_tau_rows():
    stats = {"spire": SimpleNamespace(mean=3.2, ci95=0.1), "hard_target": SimpleNamespace(mean=2.9, ci95=0.2)}
    deltas = {"hard_target": DeltaTau(-0.3, 0.1, (-0.25, -0.35))}
    rows = tables.tau_rows(stats, {"spire": 3.0, "hard_target": 2.8}, deltas, {"spire": 3.4, "hard_target": 3.0})
    assert rows[0]["delta"] == "(reference)" and rows[0]["seeds"] == "" and rows[0]["paper_delta"] == 0.0
    assert rows[1] == {"variant": rows[1]["variant"], "tau": "2.900 ± 0.200", "predicted": 2.8,
                       "delta": "-0.300 ± 0.100", "seeds": "-0.250, -0.350", "resolved": "yes", "paper": 3.0,
                       "paper_delta": pytest.approx(-0.4)}
    unknown = tables.tau_rows({"new": stats["spire"]}, {"new": 3.0}, {}, {"spire": 3.4})[0]
    assert math.isnan(unknown["paper"]) and math.isnan(unknown["paper_delta"])


def test_importance_rows():
    ranked = [{"rank": 1, "part": "feedback", "multiplier_lost": 0.3, "resolved": True},
              {"rank": None, "part": "sparse_kv", "multiplier_lost": 0.1, "resolved": False}]
    deltas = {"feedback": DeltaTau(0.2, 0.05, (0.2,))}
    rows = tables.importance_rows(ranked, deltas, {"feedback": 0.25}, ("sparse_kv", "feedback"))
    assert rows[0] == {"rank": 1, "ours": "feedback", "drop": 0.3, "delta": "+0.200 ± 0.050", "paper_rank": 2,
                       "paper_drop": 0.25}
    assert rows[1]["rank"] == "not resolved at this scale" and rows[1]["delta"] == "cost model only"
    assert rows[1]["paper_rank"] == 1 and np.isnan(rows[1]["paper_drop"])
