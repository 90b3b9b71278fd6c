"""Tables of the ablations (notebook 05): paired measurements and the rows built from them."""

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from spirelib.measure import ablations
from spirelib.measure.tau import AcceptCounts, DeltaTau, TauProtocol, delta_tau
from spirelib.model.config import ModelConfig
from spirelib.model.transformer import Transformer
from spirelib.throughput.ablations import RankedPart, pays_from
from spirelib.throughput.acceptance import tau_from_per_position
from spirelib.throughput.recorded_ablations import (
    Family,
    RecordedAblations,
    RecordedDelta,
    RecordedInterval,
    VariantTau,
)
from spirelib.workbook.narrative import ablations as words
from spirelib.workbook.tables import ablations as tables

CFG = ModelConfig(vocab_size=29, num_layers=2, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=64)


def counts(*rows):
    return AcceptCounts(torch.tensor(rows), k=2)


COUNTS = {0: {"spire": counts([2, 2, 1], [2, 1, -1]), "hard_target": counts([0, 1, 0], [1, 0, 0])},
          1: {"spire": counts([2, 1, 2], [2, 2, -1]), "hard_target": counts([1, 0, 0], [0, 0, 1])}}


def test_budget_note():
    assert words.budget_note(100, 100, 3, 2, 5.0) == ("**Budget.** Each variant trains on 100 tokens per seed, "
                                                       "the main SPIRe draft's budget.")
    note = words.budget_note(1_000, 4_000, 3, 2, 12.0)
    assert "25% of the main SPIRe draft's 4,000 (notebook 03): 3 variants x 2 seeds" in note
    assert "would take 24x this notebook's training time (12 s here" in note


def test_variant_counts_pair_every_variant_and_seed():
    from spirelib.model.config import SpireConfig
    from spirelib.model.spire import SpireDraftModel

    torch.manual_seed(0)
    target = Transformer(CFG).double().eval()
    draft = SimpleNamespace(model=SpireDraftModel.from_target(target, SpireConfig(num_layers=1, window=4)).eval())
    contexts = torch.randint(0, CFG.vocab_size, (3, 8), generator=torch.Generator().manual_seed(2))
    out = ablations.variant_counts(target, {0: {"a": draft, "b": draft}, 1: {"a": draft}}, contexts, 8,
                                TauProtocol(k=3, new_tokens=5), 1.0, progress=False)
    assert list(out) == [0, 1] and list(out[0]) == ["a", "b"] and list(out[1]) == ["a"]
    assert torch.equal(out[0]["a"].accepted, out[0]["b"].accepted)  # the same draft sees the same streams
    assert out[0]["a"].accepted.shape[0] == 3


def test_paired_deltas_over_seeds_and_measured_pairs_only():
    deltas = ablations.paired_deltas(COUNTS, {"hard_target": ("hard_target", "spire"), "x": ("no_feedback", "spire")})
    assert list(deltas) == ["hard_target"]
    assert deltas["hard_target"] == delta_tau([COUNTS[0]["hard_target"], COUNTS[1]["hard_target"]],
                                              [COUNTS[0]["spire"], COUNTS[1]["spire"]])
    assert len(deltas["hard_target"].per_seed) == 2 and deltas["hard_target"].mean < 0


def test_seed_taus_and_interval_note_say_what_the_intervals_are_about():
    from spirelib.measure.tau import tau_over_seeds

    taus = ablations.seed_taus(COUNTS)
    assert list(taus) == ["spire", "hard_target"]
    assert taus["spire"] == tau_over_seeds([COUNTS[0]["spire"], COUNTS[1]["spire"]])
    deltas = ablations.paired_deltas(COUNTS, {"hard_target": ("hard_target", "spire")})
    note = tables.interval_note(deltas, 6, ablations.DeltaRule.of(0, 2))
    assert note == RecordedInterval("training", "training randomness (2 seeds, target fixed)", 2, 2, 1, 1, "fixed",
                                    Family("Holm", 0.05, 6, 1, 0.05))
    assert note.to_dict() == {  # as results.json holds it, and read back the same
        "scope": "training", "about": "training randomness (2 seeds, target fixed)", "seeds": 2, "n_contexts": 2,
        "df_seeds": 1, "df_contexts": 1, "target": "fixed",
        "family": {"procedure": "Holm", "level": 0.05, "comparisons": 6, "looks": 1, "look_level": 0.05,
                   "width": None}}
    assert RecordedInterval.from_dict(note.to_dict()) == note
    # two looks, stopped at the first (2 of 4 contexts): Holm at its share, 0.01, and the width settling there
    stopped = tables.interval_note(deltas, 6, ablations.DeltaRule.of(2, 4, 0.03)).family
    assert replace(stopped, look_level=0.01) == Family("Holm", 0.05, 6, 2, 0.01, 0.03)
    assert stopped.tested_at == stopped.look_level == pytest.approx(0.01)
    assert tables.interval_note(deltas, 6, ablations.DeltaRule(1, 2)).family.look_level == pytest.approx(0.04)
    assert Family.from_dict({"procedure": "Holm", "level": 0.05, "comparisons": 6}).tested_at == 0.05  # older runs
    one = ablations.paired_deltas({0: COUNTS[0]}, {"hard_target": ("hard_target", "spire")})
    rule = ablations.DeltaRule.of(0, 2)
    assert tables.interval_note(one, 1, rule).scope == "draft" and tables.interval_note(one, 1, rule).df_seeds is None
    assert tables.interval_note({}, 0, rule) is None


def test_ranking_takes_the_family_wise_verdicts_over_seeds_and_with_one_seed_what_the_draft_shows():
    """A part whose own interval excludes 0 but which the family does not resolve gets no rank."""
    ours = [("sparse KV", 0.7), ("feedback", 0.2), ("distillation", -0.1)]
    two = {"feedback": DeltaTau(0.2, 0.05, (0.18, 0.22), 64), "distillation": DeltaTau(-0.1, 0.05, (-0.05, -0.15), 64)}
    rows = ablations.ranking(ours, two, {"feedback": True, "distillation": False})
    assert two["distillation"].resolved  # alone
    assert [(r.part, r.effect, r.rank, r.scope) for r in rows] == [
        ("sparse KV", "helps", 1, "training"), ("feedback", "helps", 2, "training"),
        ("distillation", "not resolved", None, "training")]
    one = {"feedback": DeltaTau(0.2, 0.05, (0.2,), 64), "distillation": DeltaTau(-0.1, 0.05, (-0.1,), 64)}
    rows = ablations.ranking(ours, one, {"feedback": True, "distillation": True})
    assert [(r.part, r.effect, r.resolved, r.scope) for r in rows] == [
        ("sparse KV", "helps", True, "draft"), ("feedback", "helps", False, "draft"),
        ("distillation", "harmful", False, "draft")]  # shows for the one trained draft; never resolved


def test_predicted_taus_average_the_seeds():
    def trained(*alphas):
        return SimpleNamespace(summary={f"alpha_{j}": a for j, a in enumerate(alphas, start=1)})

    variants = {0: {"spire": trained(0.9, 0.8), "hard_target": trained(0.5, 0.5)},
                1: {"spire": trained(0.7, 0.6), "hard_target": trained(0.5, 0.5)}}
    out = ablations.predicted_taus(variants, k=2)
    assert list(out) == ["spire", "hard_target"]
    assert out["spire"] == pytest.approx((tau_from_per_position([0.9, 0.8]) + tau_from_per_position([0.7, 0.6])) / 2)
    assert out["hard_target"] == pytest.approx(1 + 0.5 + 0.25)


def test_tau_rows():
    stats = {"spire": SimpleNamespace(mean=3.2, ci95=0.1), "hard_target": SimpleNamespace(mean=2.9, ci95=0.2)}
    deltas = {"hard_target": DeltaTau(-0.3, 0.1, (-0.25, -0.35))}
    rows = tables.tau_rows(stats, {"spire": 3.0, "hard_target": 2.8}, deltas, {"spire": 3.4, "hard_target": 3.0},
                           {"hard_target": True})
    assert rows[0]["delta"] == "(reference)" and rows[0]["seeds"] == "" and rows[0]["paper_delta"] == 0.0
    assert rows[1] == {"variant": rows[1]["variant"], "tau": "2.900 ± 0.200", "predicted": 2.8,
                       "delta": "-0.300 ± 0.100", "seeds": "-0.250, -0.350", "resolved": "yes", "paper": 3.0,
                       "paper_delta": pytest.approx(-0.4)}
    unknown = tables.tau_rows({"new": stats["spire"]}, {"new": 3.0}, {}, {"spire": 3.4}, {})[0]
    assert math.isnan(unknown["paper"]) and math.isnan(unknown["paper_delta"])
    within = {"hard_target": DeltaTau(-0.3, 0.4, (-0.25, -0.35))}  # two seeds, interval over 0
    no = {"hard_target": False}
    assert tables.tau_rows(stats, {"spire": 3.0, "hard_target": 2.8}, within, {"spire": 3.4}, no)[1]["resolved"] == (
        "not resolved at this scale")
    assert tables.tau_rows(stats, {"spire": 3.0, "hard_target": 2.8}, deltas, {"spire": 3.4}, no)[1]["resolved"] == (
        "not resolved at this scale (its own interval excludes 0, the family's does not)")
    one = {"hard_target": DeltaTau(-0.3, 0.1, (-0.3,), 8)}  # one seed: about that trained draft, never resolved
    yes = {"hard_target": True}
    assert tables.tau_rows(stats, {"spire": 3.0, "hard_target": 2.8}, one, {"spire": 3.4}, yes)[1]["resolved"] == (
        "one seed: shows for this trained draft, not resolved over training")
    assert tables.tau_rows(stats, {"spire": 3.0, "hard_target": 2.8}, one, {"spire": 3.4}, no)[1]["resolved"] == (
        "one seed: not even for this trained draft")


def test_importance_rows():
    ranked = [RankedPart("feedback", 0.3, True, "helps", rank=1),
              RankedPart("sparse_kv", 0.1, False, "not resolved")]
    deltas = {"feedback": DeltaTau(0.2, 0.05, (0.2,))}
    rows = tables.importance_rows(ranked, deltas, {"feedback": 0.25}, ("sparse_kv", "feedback"))
    assert rows[0] == {"rank": 1, "ours": "feedback", "drop": 0.3, "delta": "+0.200 ± 0.050", "paper_rank": 2,
                       "paper_drop": 0.25}
    assert rows[1]["rank"] == "not resolved at this scale" and rows[1]["delta"] == (
        "modeled, no interval (cost model only)")
    harmful = tables.importance_rows([replace(ranked[0], rank=None, effect="harmful")], deltas, {}, ("feedback",))
    assert harmful[0]["rank"] == "harmful at this scale"
    one_seed = [replace(ranked[0], rank=None, effect=e, scope="draft") for e in ("harmful", "not resolved")]
    assert [r["rank"] for r in tables.importance_rows(one_seed, deltas, {}, ("feedback",))] == [
        "hurts this trained draft", "within the contexts' noise"]
    assert rows[1]["paper_rank"] == 1 and np.isnan(rows[1]["paper_drop"])


def test_check_variants_names_the_unknown_ones():
    ablations.check_variants(["spire", "random_init"])
    with pytest.raises(ValueError, match=r"unknown ablations \['nope'\]; choose from"):
        ablations.check_variants(["spire", "nope"])


def test_scale_note_states_shapes_budget_and_protocol():
    base = SimpleNamespace(num_layers=2, window=16)
    series = SimpleNamespace(k=4, new_tokens=8, temperature=1.0)
    assert words.scale_note("target 8x64", base, 12345, [0, 1], 64, 8, series) == (
        "target 8x64; every variant 2 layers, window 16, 12,345 training tokens per seed, seeds [0, 1]; "
        "tau at L = 64, n = 8 contexts, k = 4, G = 8, T = 1")


def test_paper_deltas_only_for_the_variants_the_paper_reports():
    from spirelib.throughput.perfmodel import PAPER_ABLATION_TAU as paper
    assert ablations.paper_deltas(["random_init", "mine"]) == {"random_init": paper["random_init"] - paper["spire"]}


def test_headline_and_paper_importance_price_the_variants_at_b64_l512():
    from spirelib.throughput.ablations import importance, variant_multipliers
    from spirelib.throughput.perfmodel import PAPER_ABLATION_TAU, PAPER_HOI
    taus = {"spire": 3.0, "random_init": 2.0, "no_feedback": 2.5}
    assert ablations.headline_importance(taus, 4) == importance(
        variant_multipliers(taus, 64, 512, "seqax-67m", "spire-draft", k=4, hoi=PAPER_HOI))
    paper_taus = {n: t for n, t in PAPER_ABLATION_TAU.items() if n != "no_sparse_kv"}
    assert ablations.paper_importance(4) == dict(ablations.headline_importance(paper_taus, 4))
    assert "sparse KV" in ablations.paper_importance(4)  # the cost model's part, from SPIRe's own tau


def test_a_ranking_rows_effect_and_the_older_rows_without_one():
    def effect(**row):
        return RankedPart.from_dict({"part": "feedback", **row}).effect

    assert effect(effect="harmful", multiplier_lost=0.5) == "harmful"
    assert effect(multiplier_lost=0.5) == "helps"  # recorded before "effect": resolved by default
    assert effect(multiplier_lost=-0.1, resolved=True) == "harmful"
    assert effect(multiplier_lost=0.5, resolved=False) == "not resolved"
    row = RankedPart("feedback", 0.5, True, "helps", "draft", 2)
    assert RankedPart.from_dict(row.to_dict()) == row


def test_order_sentence_ranks_what_helps_and_names_what_hurts_or_is_not_resolved():
    ranked = [RankedPart("sparse KV", 0.4, True, "helps"), RankedPart("distillation", 0.1, True, "helps"),
              RankedPart("target activations", -0.08, True, "harmful"),
              RankedPart("feedback", 0.3, False, "not resolved")]
    assert words.order_sentence(ranked) == (
        "2 of 4 parts help at this scale (a measured part only when resolved): sparse KV (modeled, no interval, "
        "+0.40x) > distillation (+0.10x), in the paper's order. Resolved as harmful here, removing it raises tau: "
        "target activations (-0.08x; the paper ranks it 2 of 6). Not resolved at this scale (no rank): feedback.")
    two = RecordedInterval("training", seeds=2, n_contexts=128, df_seeds=1, df_contexts=127,
                           family=Family("Holm", 0.05, 6))
    taus = {"target activations": RecordedDelta(-0.056, 0.049), "distillation": RecordedDelta(0.2, 0.1),
            "feedback": RecordedDelta(0.01, 0.03)}
    variants = {"no_feedback_no_target_acts": RecordedDelta(0.044, 0.039, family_excludes_zero=True),
                "hard_target": RecordedDelta(-0.2, 0.1, family_excludes_zero=True),  # a part's: said there
                "no_feedback": RecordedDelta(0.05, 0.04, family_excludes_zero=False)}
    assert words.order_sentence(ranked, two, taus, variants) == (
        "Over training randomness (2 seeds per variant, the target fixed; family-wise over the table's 6 comparisons, "
        "Holm at 5%): 2 of 4 parts help at this scale (a measured part only when resolved): sparse KV (modeled, no "
        "interval, +0.40x) > distillation (+0.200 ± 0.100 tau, +0.10x), in the paper's order. Resolved as harmful "
        "here, removing it raises tau: target activations (-0.056 ± 0.049 tau, -0.08x; the paper ranks it 2 of 6). "
        "Not resolved at this scale (no rank): feedback (+0.010 ± 0.030 tau, +0.30x). Also resolved, a variant "
        "against SPIRe: no feedback, no target activations above SPIRe (+0.044 ± 0.039 tau). Each ± is that "
        "difference's own 95% interval, uncorrected.")
    one = replace(two, scope="draft", seeds=1, df_seeds=None)
    text = words.order_sentence([replace(r, scope="draft") for r in ranked], one, taus)
    assert text == (
        "For one trained draft per variant (one seed, the target fixed; not over training randomness; family-wise "
        "over the table's 6 comparisons, Holm at 5%): 2 of 4 parts help this trained draft (a measured part only "
        "beyond its contexts' noise): sparse KV (modeled, no interval, +0.40x) > distillation (+0.200 ± 0.100 tau, "
        "+0.10x), in the paper's order. Hurt this trained draft, removing it raises its tau: target activations "
        "(-0.056 ± 0.049 tau, -0.08x; the paper ranks it 2 of 6). Within the contexts' noise for this trained draft "
        "(no rank): feedback (+0.010 ± 0.030 tau, +0.30x). Each ± is that difference's own 95% interval, "
        "uncorrected.")
    assert "resolved" not in text  # one seed never speaks of resolved
    ranked[:2] = ranked[1::-1]
    assert ", not in the paper's order." in words.order_sentence(ranked)
    legacy = [RankedPart.from_dict(r) for r in ({"part": "sparse KV", "multiplier_lost": 0.4},  # before "effect"
                                                {"part": "feedback", "multiplier_lost": 0.1, "resolved": False})]
    assert words.order_sentence(legacy).startswith("1 of 2 parts help at this scale (a measured part only when "
                                                    "resolved): sparse KV")


def test_interval_sentence_says_what_a_seed_varies_that_the_target_is_fixed_and_the_degrees_of_freedom():
    two = RecordedInterval("training", seeds=2, n_contexts=128, df_seeds=1, df_contexts=127)
    text = words.interval_sentence(two)
    assert text.startswith("**Over training randomness.** Each variant was trained at 2 seeds. A seed is a draft's "
                           "training seed: it draws the draft's training windows")
    assert "The target (notebook 02's), the contexts and the decoding streams are held fixed" in text
    assert "the seeds' spread (1 degree of freedom: t = 12.7, so only large effects" in text
    assert "the noise of the 128 contexts that all seeds share (127 degrees of freedom)" in text
    assert "docs/method.md §10" in text
    three = words.interval_sentence(replace(two, seeds=3, df_seeds=2))
    assert "the seeds' spread (2 degrees of freedom) and" in three and "12.7" not in three
    one = words.interval_sentence(replace(two, scope="draft", seeds=1, df_seeds=None))
    assert one.startswith("**One trained draft per variant.** With one training seed, every difference is about the "
                          "two trained drafts that seed gave.")
    assert "covers only the noise of the 128 contexts (Student's t, 127 degrees of freedom), not training" in one
    assert "nothing here is resolved in that sense" in one and "held fixed" in one
    assert words.interval_sentence(None) == ""


def test_family_sentence_says_the_level_holm_tested_at_and_with_two_looks_where_the_table_stopped():
    one_look = RecordedInterval("training", seeds=3, n_contexts=128, df_seeds=2, df_contexts=127,
                                family=Family("Holm", 0.05, 6, 1, 0.05))
    text = words.family_sentence(one_look)
    assert "tested at level 0.05/6, the next at 0.05/5" in text and "looks" not in text
    assert "at most 5%" in text
    stopped = replace(one_look, n_contexts=64, family=Family("Holm", 0.05, 6, 2, 0.01, 0.05))
    text = words.family_sentence(stopped)
    assert "tested at level 0.01/6, the next at 0.01/5" in text
    assert "two looks, and the table was judged at the one where it stopped, after 64 contexts" in text
    assert "its interval within ±0.05" in text and "share the 5% (Bonferroni), so Holm tested at 0.01" in text
    assert "at most 5%" in text
    older = replace(one_look, family=Family.from_dict({"procedure": "Holm", "level": 0.05, "comparisons": 6}))
    assert words.family_sentence(older) == text.replace("0.01", "0.05").split(" The contexts were")[0] + \
        " The chance" + text.split(" The chance", 1)[1]


def test_ablation_results_and_protocol_keep_the_results_keys():
    stats = {"spire": SimpleNamespace(mean=3.0, ci95=0.1, n_contexts=8)}
    delta = DeltaTau(-1.0, 0.5, (-1.0,), 8)
    shown = {"random_init": False, "feedback": True}
    ranked = [RankedPart("sparse KV", 0.7, True, "helps", "draft", 1)]
    series = SimpleNamespace(k=4, new_tokens=8, temperature=1.0, tau_seed=3)
    todict = SimpleNamespace(to_dict=lambda: {"batch_size": 2, "seq_len": 16, "steps": 3})
    protocol = tables.ablation_protocol(series, 64, ablations.DeltaRule.of(0, 8), todict, todict, [0], 1.5, "s")
    assert protocol.to_dict() == {"context_length": 64, "n_contexts": 8, "first_look": None, "look_width": None,
                                  "k": 4, "new_tokens": 8, "temperature": 1.0, "seed": 3, "training": todict.to_dict(),
                                  "spire": todict.to_dict(), "seeds": [0], "training_seconds": 1.5, "scale": "s"}
    looked = tables.ablation_protocol(series, 64, ablations.DeltaRule.of(4, 8, 0.02), todict, todict, [0], 1.5, "s")
    assert (looked.n_contexts, looked.first_look, looked.look_width) == (8, 4, 0.02)
    assert tables.looks_of(looked) == ablations.DeltaRule(4, 8, 0.02)  # the rule, read back from its record
    assert tables.looks_of(protocol).looks == 1 and tables.looks_of(type(protocol)()).looks == 1
    assert protocol.training_tokens == 96
    results = tables.ablation_results(stats, ranked, {"random_init": delta}, {"feedback": delta}, shown, [0], False,
                                      protocol)
    assert results == RecordedAblations(
        tau={"spire": VariantTau(3.0, 0.1, 8)}, importance=ranked,
        delta_tau={"random_init": tables.delta_record(delta, False)},
        component_delta_tau={"feedback": tables.delta_record(delta, True)},
        interval=tables.interval_note({"feedback": delta}, 2, ablations.DeltaRule.of(0, 8)),  # feedback's alone
        seeds=[0], importance_matches_paper=False, ablation_protocol=protocol)
    recorded = results.to_dict()  # results.json's keys, in their order, and read back the same
    assert list(recorded) == ["tau", "importance", "delta_tau", "component_delta_tau", "interval", "seeds",
                              "importance_matches_paper", "ablation_protocol"]
    assert recorded["tau"] == {"spire": {"mean": 3.0, "ci95": 0.1, "n_contexts": 8}}
    assert recorded["importance"] == [{"part": "sparse KV", "multiplier_lost": 0.7, "resolved": True,
                                       "effect": "helps", "scope": "draft", "rank": 1}]
    assert list(recorded["delta_tau"]["random_init"]) == [*delta.to_dict(), "family_excludes_zero", "resolved_alone"]
    assert RecordedAblations.from_dict(recorded) == results and results.one_seed
    feedback = results.component_delta_tau["feedback"]
    assert results.interval.scope == "draft" and feedback.resolved is False  # one seed: never resolved
    assert feedback.excludes_zero is True and feedback.family_excludes_zero is True
    assert results.delta_tau["random_init"].family_excludes_zero is False
    two = DeltaTau(-1.0, 0.5, (-1.0, -1.0), 8)
    assert tables.delta_record(two, False).resolved is False and tables.delta_record(two, False).resolved_alone
    assert tables.delta_record(two, True).resolved is True
    assert RecordedAblations.from_dict({}) == RecordedAblations()  # a run without 05


def test_learning_curves_start_at_step_0_and_say_where_a_part_pays():
    metrics = [{"kind": "train", "tokens": 5, "alpha": 0.9},
               {"kind": "val", "tokens": 10, "alpha": 0.30, "hard_ce": 6.0},
               {"kind": "val", "tokens": 20, "alpha": 0.40, "hard_ce": 5.0}]
    with_it = ablations.learning_curve(metrics, {"alpha": 0.10, "hard_ce": 9.6})
    assert with_it == [(0, 0.10), (10, 0.30), (20, 0.40)]
    assert ablations.learning_curve(metrics, None, "hard_ce") == [(10, 6.0), (20, 5.0)]
    without = [(0, 0.16), (10, 0.35), (20, 0.38)]
    assert pays_from(with_it, without) == 20
    assert pays_from(without, with_it) is None  # below at the last evaluation
    assert pays_from([(0, 0.2), (10, 0.1), (20, 0.3)], [(0, 0.1), (10, 0.2), (20, 0.2)]) == 20  # stays above
    assert pays_from([(0, 0.3), (10, 0.3)], [(0, 0.1), (10, 0.2)]) == 0
    assert pays_from([(0, 0.3), (10, 0.9470004)], [(0, 0.1), (10, 0.947)]) is None  # a tie at 3 decimals
    text = words.curve_sentence({"no_feedback": with_it, "no_feedback_no_target_acts": without, "spire": with_it},
                                 {"target activations": ("no_feedback", "no_feedback_no_target_acts"),
                                  "feedback": ("spire", "no_feedback"), "pruned init": ("spire", "random_init")})
    assert text == ("On the learning curves of validation alpha (evaluations at 0, 10, 20 training tokens): target "
                    "activations (no feedback against no feedback, no target activations) pays from 20 training tokens "
                    "on (alpha with it minus without: -0.060 → -0.050 → +0.020); feedback (SPIRe against no feedback) "
                    "does not pay within 20 training tokens (alpha with it minus without: +0.000 → +0.000 → +0.000, "
                    "unchanged).")
    behind = {"no_feedback": [(0, 0.10), (10, 0.30)], "no_feedback_no_target_acts": [(0, 0.13), (10, 0.31)]}
    pair = {"target activations": ("no_feedback", "no_feedback_no_target_acts")}
    assert words.curve_sentence(behind, pair).endswith("(alpha with it minus without: -0.030 → -0.010, narrowing).")
    tied_first = {"no_feedback": [(0, 0.1), (10, 0.30), (20, 0.40)],
                  "no_feedback_no_target_acts": [(0, 0.1), (10, 0.33), (20, 0.403)]}
    assert words.curve_sentence(tied_first, pair).endswith("+0.000 → -0.030 → -0.003, narrowing).")


def test_step_0_says_whether_the_pruned_init_starts_below_random_weights():
    initial = {"spire": {"alpha": 0.105, "hard_ce": 9.60}, "random_init": {"alpha": 0.196, "hard_ce": 8.33}}
    text = words.step0_sentence(initial, 4096)
    assert text.startswith("At step 0, before training, on the trainer's validation windows: SPIRe alpha 0.105 "
                           "(CE 9.60); random init alpha 0.196 (CE 8.33); a uniform guess has CE ln 4096 = 8.32.")
    assert "The pruned init starts below random weights (SPIRe)" in text
    initial["spire"]["alpha"] = 0.3
    assert text != words.step0_sentence(initial, 4096) and "starts above" in words.step0_sentence(initial, 4096)


def test_05_leads_with_its_conclusion_and_says_what_rules_out_a_defect_when_target_activations_hurt():
    ranked = [RankedPart("sparse KV", 0.7, True, "helps", rank=1),
              RankedPart("target activations", -0.08, True, "harmful")]
    paragraphs = words.lead(ranked, 204_800, 1_228_800, "step 0 ...", "curves ...")
    assert paragraphs[0].startswith("1 of 2 parts help at this scale (a measured part only when resolved)")
    assert paragraphs[1].startswith("The variants trained on 204,800 tokens per seed, 17% of the main SPIRe draft's "
                                    "1,228,800")
    assert paragraphs[2:4] == ["step 0 ...", "curves ..."] and paragraphs[4] == words.PATH_CHECK
    ranked[1] = replace(ranked[1], effect="helps")
    assert words.PATH_CHECK not in words.lead(ranked, 1_228_800, 1_228_800)
    assert words.lead(ranked, 1_228_800, 1_228_800)[1].endswith("the main SPIRe draft's budget.")
    interval = RecordedInterval("training", seeds=2, n_contexts=128, df_seeds=1, df_contexts=127)
    paragraphs = words.lead(ranked, 1_228_800, 1_228_800, interval=interval)
    assert paragraphs[0] == words.order_sentence(ranked, interval)  # the index's claim says it in these words
    assert paragraphs[1] == words.interval_sentence(interval) and paragraphs[2].startswith("The variants trained")


def test_05s_figure_says_with_one_seed_that_its_bars_are_about_one_trained_draft_each():
    from spirelib.workbook.plots.ablations import delta_figure

    two = {"random_init": tables.delta_record(DeltaTau(-0.3, 0.1, (-0.25, -0.35), 8), True),
           "no_feedback": tables.delta_record(DeltaTau(-0.3, 0.1, (-0.25, -0.35), 8), False)}  # alone: resolved
    fig = delta_figure(two, {})
    assert [list(b.x)[0] for b in fig.data if b.type == "bar"] == ["random init", "no feedback<br>(not resolved)"]
    assert "95% CI over training seeds and contexts, uncorrected" in fig.layout.title.text.replace("<br>", " ")
    one = {"random_init": tables.delta_record(DeltaTau(-0.3, 0.1, (-0.3,), 8), True),
           "no_feedback": tables.delta_record(DeltaTau(-0.3, 0.1, (-0.3,), 8), False)}
    fig = delta_figure(one, {})
    assert [list(b.x)[0] for b in fig.data if b.type == "bar"] == ["random init<br>(this draft only)",
                                                                     "no feedback<br>(within noise)"]
    title = fig.layout.title.text.replace("<br>", " ")
    assert "one trained draft each (paired, each bar's own 95% CI over contexts only, uncorrected" in title
