"""Tables of measured acceptance (notebook 04): Table 1's shape and every measurement's counts."""

from spirelib.measure.tau import TauStats
from spirelib.workbook.tables.decoding import acceptance_rows, table1_rows


def stats(mean, per_position=(0.8, 0.5)):
    return TauStats(mean=mean, ci95=0.05, n_contexts=6, std=0.1, rounds=40, acceptance_rate=0.4,
                    per_position=per_position, accepted_at=(32, 16), reached=(40, 32))


STATS = {"vanilla": {64: stats(2.0), 32: stats(2.25)}, "spire": {32: stats(3.5)}}


def test_table1_rows_longest_first_with_the_paper_where_it_has_that_length():
    rows = table1_rows(STATS, {64: {"vanilla": 2.6, "spire": 3.4}})
    assert [r["L"] for r in rows] == [64, 32]
    assert rows[0] == {"L": 64, "vanilla SD": "2.000 ± 0.050", "vanilla SD (paper)": "2.600", "SPIRe": "",
                       "SPIRe (paper)": "3.400"}
    assert rows[1]["SPIRe"] == "3.500 ± 0.050" and rows[1]["SPIRe (paper)"] == "—"
    assert table1_rows(STATS)[1] == {"L": 32, "vanilla SD": "2.250 ± 0.050", "SPIRe": "3.500 ± 0.050"}


def test_acceptance_rows_one_per_method_and_length():
    rows = acceptance_rows(STATS)
    assert [(r["method"], r["L"]) for r in rows] == [("vanilla", 32), ("vanilla", 64), ("spire", 32)]
    assert rows[0] == {"method": "vanilla", "L": 32, "n_contexts": 6, "rounds": 40, "tau": "2.250 ± 0.050",
                       "acceptance_rate": 0.4, "per_position": "0.800, 0.500"}


def test_04_leads_with_the_order_the_difference_to_the_paper_and_the_trend_over_l():
    from spirelib.workbook.narrative.decoding import lead

    paper = {256: {"vanilla": 2.6, "magicdec": 3.9, "spire": 3.43}, 512: {"vanilla": 2.65, "magicdec": 3.89,
                                                                         "spire": 3.40},
             960: {"vanilla": 2.6, "magicdec": 3.85, "spire": 3.37}}
    taus = {"vanilla": {256: 2.5, 512: 2.55, 960: 2.6}, "magicdec": {256: 4.3, 512: 4.35, 960: 4.38},
            "spire": {256: 3.73, 512: 3.78, 960: 3.81}}
    order, against, trend = lead(taus, paper)
    assert order == ("**Order at L = 512:** MagicDec 4.35 > SPIRe 3.78 > vanilla SD 2.55; the paper's at L = 512: "
                     "MagicDec 3.89 > SPIRe 3.40 > vanilla SD 2.65 (the same order).")
    assert against.startswith("**Against the paper's tau** at the lengths both measured, this run's minus the "
                              "paper's: MagicDec +0.40 to +0.53; SPIRe +0.30 to +0.44; vanilla SD -0.10 to +0.00.")
    assert ("SPIRe's tau rises with L here (3.73 at L = 256 to 3.81 at L = 960), where the paper's falls (3.43 to "
            "3.37)") in trend
    assert ("vanilla SD's tau rises with L here (2.50 at L = 256 to 2.60 at L = 960), where the paper's stays at "
            "2.60") in trend
    assert "MagicDec's tau rises with L here (4.30 at L = 256 to 4.38 at L = 960), where the paper's falls" in trend
    assert "Every method's tau rises with L here, the vanilla draft's too" in trend
    taus["vanilla"][960] = 2.4
    assert "Every method's tau rises" not in lead(taus, paper)[2]
    assert "(a different order)" in lead({**taus, "vanilla": {512: 5.0}}, paper)[0]



def test_04_says_when_a_trend_over_l_is_within_the_noise():
    from spirelib.workbook.narrative.decoding import lead

    paper = {256: {"magicdec": 4.0, "spire": 3.43}, 960: {"magicdec": 3.79, "spire": 3.38}}
    taus = {"magicdec": {256: 4.431, 960: 4.275}, "spire": {256: 3.918, 960: 3.947}}
    ci95 = {"magicdec": {256: 0.044, 960: 0.049}, "spire": {256: 0.050, 960: 0.051}}
    order, scope, _, trend = lead(taus, paper, ci95)
    assert scope.startswith("**What the ± intervals cover:** the contexts only") and "held fixed" in scope
    assert ("MagicDec's tau falls with L here (4.43 at L = 256 to 4.28 at L = 960, -0.156 ± 0.066), as the "
            "paper's") in trend
    assert ("SPIRe's tau rises with L here (3.92 at L = 256 to 3.95 at L = 960, +0.029 ± 0.071: not resolved, within "
            "the noise), where the paper's falls") in trend
    assert "Every method" not in trend
    ci95["spire"] = {256: 0.01, 960: 0.01}
    taus["magicdec"] = {256: 4.0, 960: 4.3}
    assert "Every method's tau rises with L here" in lead(taus, paper, ci95)[-1]
    ci95["spire"] = {256: 0.05, 960: 0.05}
    assert "Every method's tau rises" not in lead(taus, paper, ci95)[-1]  # SPIRe's rise is within the noise
