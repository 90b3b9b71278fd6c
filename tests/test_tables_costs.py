"""Tables of the cost analysis (notebook 08) hold exactly what `costs` computes."""

import dataclasses
import math

import numpy as np
import pytest

from spirelib import costs
from spirelib import perfmodel as pm
from spirelib.plots.explorer import Scenario
from spirelib.tables import costs as tables

SCENARIOS = {"seqax-67m": Scenario.paper("seqax-67m"), "llama3-70b": Scenario.paper("llama3-70b")}


def test_draft_training_units_per_target_and_method():
    units = tables.draft_training_units(SCENARIOS, mfu_ratio=0.5)
    assert list(units) == list(SCENARIOS) and list(units["seqax-67m"]) == ["vanilla", "spire"]
    assert units["seqax-67m"]["spire"] == costs.draft_training_units("spire-draft", "seqax-67m", mfu_ratio=0.5)


def test_draft_cost_rows():
    rows = tables.draft_cost_rows(SCENARIOS, tables.draft_training_units(SCENARIOS))
    spire = next(r for r in rows if r["draft"] == "SPIRe: spire-draft")
    n, n_target = pm.body_params("spire-draft"), pm.body_params("seqax-67m")
    assert spire["params"] == n and spire["own"] == pytest.approx((n / n_target) ** 2)  # 20 tokens per parameter each
    assert spire["flops"] == costs.training_flops(n, costs.chinchilla_tokens(n_target)) and len(rows) == 4


def test_by_method_and_relative_margin():
    rows = [{"method": "spire", "net_savings": 6.0}, {"method": "magicdec", "net_savings": 4.0}]
    nets = tables.by_method(rows, "net_savings")
    assert nets == {"spire": 6.0, "magicdec": 4.0} and tables.relative_margin(nets) == 0.5
    assert tables.relative_margin({"spire": 1.0, "magicdec": 0.0}) is None


def test_paper_cost_checks_reproduce_the_paper():
    checks = tables.paper_cost_checks(SCENARIOS)
    assert [c["quantity"] for c in checks] == [q[0] for q in tables.PAPER_COST_CHECKS]
    assert all(c["which"] != "neither" for c in checks)  # each number matches one way or the other
    assert checks[1]["full"] == pytest.approx(10 * (1 - 1 / checks[1]["tm"]) - 0.25)


def test_break_even_volumes():
    tm = {"spire": 2.0, "vanilla": 1.0, "magicdec": 1.5}
    out = tables.break_even_volumes(tm, {"spire": 0.25, "vanilla": 0.1}, {"spire": 2.0, "magicdec": 2.0},
                                    {"spire": 0.25})
    assert out["spire_vs_ad"] == pytest.approx(0.5) and math.isinf(out["vanilla_vs_ad"])
    assert out["spire_vs_magicdec"] == pytest.approx(0.25 / (1 / 1.5 - 1 / 2))
    assert math.isinf(out["spire_vs_magicdec_70b"])


def test_mixed_length_savings_margins():
    small = SCENARIOS["seqax-67m"]
    lengths = pm.LengthDistribution(512, 1.0, seed=0).sample(16)
    rows, margins = tables.mixed_length_savings(small, 16, lengths, 10.0, {"spire": 0.25})
    assert [r["window"] for r in rows] == ["L/8", "64 tokens"] and list(margins) == ["L/8", "64 tokens"]
    tms = dataclasses.replace(small, window=64).mixed_and_uniform(16, lengths)
    spire, magicdec = (costs.serving_savings(tms[m][0], serving_units=10.0, training_units=t)
                       for m, t in (("spire", 0.25), ("magicdec", 0.0)))
    assert margins["64 tokens"][0] == pytest.approx(spire - magicdec)
    assert rows[1]["spire"].startswith(f"{spire:.3f} (uniform ")
    assert np.isfinite(margins["L/8"]).all()


def test_net_savings_charge_each_method_its_training():
    nets = tables.net_savings({"spire": 2.0, "magicdec": np.array([1.25, 2.5])}, 10.0, {"spire": 0.25})
    assert nets["spire"] == pytest.approx(4.75) and nets["magicdec"] == pytest.approx([2.0, 6.0])
    by_volume = tables.net_savings({"spire": 2.0}, np.array([1.0, 4.0]), {"spire": 0.5})["spire"]  # (2,)
    assert by_volume == pytest.approx([0.0, 1.5])
