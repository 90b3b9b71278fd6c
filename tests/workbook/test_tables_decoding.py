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


def test_length_rows_put_the_targets_own_loss_beside_each_tau_and_say_which_lengths_passed_training():
    from spirelib.measure.context_loss import LossStats
    from spirelib.workbook.tables.decoding import length_rows

    losses = {32: LossStats(3.1, 0.05, 6), 64: LossStats(3.4, 0.07, 6)}
    rows = length_rows(STATS, losses, trained_on=100, new_tokens=40)
    assert [r["within the training windows"] for r in rows] == ["yes", "no (1.0x)"]  # 72 fits, 104 does not
    assert rows[1] == {"L": 64, "L + G": 104, "within the training windows": "no (1.0x)",
                       "target's loss (nats/token)": "3.400 ± 0.070", "vanilla SD": "2.000 ± 0.050", "SPIRe": ""}
    assert table1_rows(STATS, key="KV budget")[0]["KV budget"] == 64


def test_past_training_says_who_gives_out_first_the_target_or_a_draft():
    from spirelib.workbook.narrative.decoding import past_training

    taus = {"magicdec": {512: 2.4, 2048: 2.0}, "spire": {512: 2.5, 2048: 2.45}}
    ci = {"magicdec": {512: 0.05, 2048: 0.05}, "spire": {512: 0.05, 2048: 0.05}}
    held = past_training(taus, ci, {512: 3.0, 2048: 3.02}, {512: 0.05, 2048: 0.05}, 1024, 64)
    assert "at L = 2,048, L + G = 2,112 positions, 2.1x those windows" in held
    assert "from 3.000 to 3.020 nats (+0.020 ± 0.071, not resolved)" in held
    assert "MagicDec 2.40 to 2.00 (-0.400 ± 0.071)" in held and "SPIRe 2.50 to 2.45 (-0.050 ± 0.071, not resolved)" in held
    assert held.endswith("while MagicDec gives out first: tau falls where the target does not.")
    rises = past_training(taus, ci, {512: 3.0, 2048: 3.5}, {512: 0.05, 2048: 0.05}, 1024, 64)
    assert "The target itself gives out past its windows" in rises and rises.endswith("MagicDec falls with it.")
    calm = past_training({"spire": taus["spire"]}, ci, {512: 3.0, 2048: 3.02}, {512: 0.05, 2048: 0.05}, 1024, 64)
    assert calm.endswith("Neither gives out at this length: no draft's tau falls and the target's loss does not "
                         "rise beyond the noise.")
    assert past_training(taus, ci, {512: 3.0}, {512: 0.05}, 1024, 64) is None  # nothing measured past the windows
    three = {**taus, "guided": {512: 2.4, 2048: 2.1}, "spire": {512: 2.5, 2048: 2.2}}
    ci3 = {**ci, "guided": ci["magicdec"]}
    assert past_training(three, ci3, {512: 3.0, 2048: 3.02}, {512: 0.05, 2048: 0.05}, 1024, 64).endswith(
        "while MagicDec, SPIRe and guided sparse give out first: tau falls where the target does not.")


def test_the_kv_budget_sweep_counts_only_budgets_resolved_together():
    from spirelib.workbook.narrative.decoding import kv_budget_sentence

    deltas = {16: (0.3, 0.1), 64: (0.05, 0.1), 256: (-0.01, 0.02)}
    words = kv_budget_sentence(deltas, {16: True, 64: False, 256: False}, 960)
    assert "16: +0.300 ± 0.100 (resolved); 64: +0.050 ± 0.100; 256: -0.010 ± 0.020." in words
    assert words.endswith("buys acceptance at budgets 16; elsewhere the difference is not resolved.")
    assert kv_budget_sentence(deltas, dict.fromkeys(deltas, False), 960).endswith(
        "No budget resolves a difference between the two at this scale.")
    assert "MagicDec's fixed window accepts more at budgets 256." in kv_budget_sentence(
        deltas, {16: False, 64: False, 256: True}, 960)
