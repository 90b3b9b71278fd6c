"""Training-cost accounting and the paper's cost analysis (method §2)."""

import numpy as np
import pytest

from spirelib.throughput.costs import (
    break_even_serving,
    chinchilla_tokens,
    cost_table,
    draft_training_units,
    serving_savings,
    training_flops,
)
from spirelib.throughput.perfmodel import PAPER_MULTIPLIERS, PAPER_TAU, throughput_multiplier

TAU = PAPER_TAU[512]


def modeled(method, B, L, target, draft=None):
    return throughput_multiplier(method, TAU[method], B, L, target, draft)


def test_spire_training_is_a_quarter_of_the_target_by_body_parameters():
    assert draft_training_units("spire-draft", "seqax-67m") == pytest.approx(0.25, abs=1e-4)
    assert draft_training_units("spire-draft-70b", "llama3-70b") == 0.25
    assert draft_training_units("spire-draft", "seqax-67m", mfu_ratio=0.5) == pytest.approx(0.5, abs=1e-4)


def test_the_papers_cost_table_from_its_published_multipliers():
    # the paper computes savings from its two-decimal multipliers
    small, large = PAPER_MULTIPLIERS["seqax-67m"], PAPER_MULTIPLIERS["llama3-70b"]
    assert round(serving_savings(small["spire"]), 2) == 6.40
    assert round(serving_savings(small["spire"], training_units=0.25), 2) == 6.15
    assert round(serving_savings(small["magicdec"]), 2) == 5.12
    assert round(serving_savings(large["spire"], training_units=0.25), 2) == 6.20
    assert round(serving_savings(large["magicdec"]), 2) == 5.33


def test_the_cost_table_from_the_full_precision_model():
    spire = modeled("spire", 64, 512, "seqax-67m", "spire-draft")
    magicdec = modeled("magicdec", 64, 512, "seqax-67m")
    units = draft_training_units("spire-draft", "seqax-67m")
    assert round(serving_savings(spire), 2) == 6.40
    assert round(serving_savings(spire, training_units=units), 2) == 6.15
    # the unrounded MagicDec multiplier 2.0524 saves 5.1275: 5.13, not the paper's 5.12 (from 2.05)
    assert round(serving_savings(magicdec), 2) == 5.13
    spire70 = modeled("spire", 64, 65536, "llama3-70b", "spire-draft-70b")
    magicdec70 = modeled("magicdec", 64, 65536, "llama3-70b")
    # unrounded 2.8241 gives 6.21 net (the paper's 6.20 comes from 2.82)
    assert round(serving_savings(spire70, training_units=0.25), 2) == 6.21
    assert round(serving_savings(magicdec70), 2) == 5.33


def test_spire_saves_about_20_percent_more_than_magicdec():
    rows = cost_table({"spire": 2.78, "magicdec": 2.05, "vanilla": 1.36}, {"spire": 0.25, "vanilla": 0.125})
    assert [r["method"] for r in rows] == ["spire", "magicdec", "vanilla"]
    assert rows[0]["net_savings"] == pytest.approx(10 * (1 - 1 / 2.78) - 0.25)
    assert rows[0]["vs_best_other"] > 0.20
    # at full precision the margin is 19.96%: the paper's "> 20%" holds only for its rounded figures
    spire = modeled("spire", 64, 512, "seqax-67m", "spire-draft")
    magicdec = modeled("magicdec", 64, 512, "seqax-67m")
    full = serving_savings(spire, training_units=0.25) / serving_savings(magicdec) - 1
    assert 0.199 < full < 0.20


def test_break_even_serving_volume_equalizes_net_savings():
    volume = break_even_serving(2.78, 0.25, baseline_tm=2.05)
    assert serving_savings(2.78, serving_units=volume, training_units=0.25) == pytest.approx(
        serving_savings(2.05, serving_units=volume))
    assert break_even_serving(2.78, 0.25) == pytest.approx(0.25 / (1 - 1 / 2.78))
    assert break_even_serving(1.5, 0.25, baseline_tm=2.0) == np.inf  # never catches up
    assert break_even_serving(2.0, 0.0, baseline_tm=1.5, baseline_training_units=0.1) == 0.0


def test_savings_vectorize_over_serving_volume():
    volume = np.array([1.0, 10.0, 100.0])
    assert np.allclose(serving_savings(2.0, serving_units=volume, training_units=0.25), volume / 2 - 0.25)


def test_training_flop_accounting():
    assert chinchilla_tokens(67_117_056) == 20 * 67_117_056
    assert training_flops(1e9, 2e10) == 6 * 1e9 * 2e10


@pytest.mark.parametrize("call, name", [
    (lambda: serving_savings(0.0), "tm"),
    (lambda: serving_savings(2.0, serving_units=-1), "serving_units"),
    (lambda: draft_training_units("spire-draft", "seqax-67m", mfu_ratio=0), "mfu_ratio"),
    (lambda: training_flops(-1, 10), "params"),
])
def test_bad_inputs_raise_value_errors_naming_them(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_cost_table_also_does_the_papers_rounded_arithmetic():
    row = cost_table({"spire": 2.7849}, {"spire": 0.2512})[0]
    assert row["net_from_rounded"] == pytest.approx(10 * (1 - 1 / 2.78) - 0.25)
    assert row["net_savings"] == pytest.approx(10 * (1 - 1 / 2.7849) - 0.2512)
