"""The ablation importance ranking reproduces the paper's order from the paper's taus."""

import pytest

from spirelib.model.config import ABLATIONS
from spirelib.throughput import perfmodel
from spirelib.throughput.ablations import COMPONENTS, PAPER_IMPORTANCE_ORDER, importance, variant_multipliers


def paper_multipliers(B=64, L=512):
    taus = {k: v for k, v in perfmodel.PAPER_ABLATION_TAU.items() if k != "no_sparse_kv"}
    return variant_multipliers(taus, B, L, "seqax-67m", "spire-draft")


def test_paper_taus_give_the_paper_importance_order():
    assert [name for name, _ in importance(paper_multipliers())] == PAPER_IMPORTANCE_ORDER


def test_no_sparse_kv_is_spire_with_a_dense_cache():
    m = paper_multipliers()
    assert m["spire"] == pytest.approx(2.78, abs=0.005)
    assert m["no_sparse_kv"] == pytest.approx(1.70, abs=0.005)


def test_every_trained_ablation_has_a_component_and_partial_sets_rank_what_they_can():
    trained_variants = {v for pair in COMPONENTS.values() for v in pair} - {"no_sparse_kv"}
    assert trained_variants == set(ABLATIONS)
    ranked = importance({"spire": 2.0, "no_feedback": 1.5, "random_init": 1.9})
    assert ranked == [("feedback", pytest.approx(0.5)), ("pruned init", pytest.approx(0.1))]


def test_order_agreement_compares_only_the_components_ranked():
    from spirelib.throughput.ablations import matches_paper_order

    assert matches_paper_order(importance(paper_multipliers()))
    assert matches_paper_order([("pruned init", 0.3), ("MixedLoss", 0.1)])  # a partial ranking in the paper's order
    assert not matches_paper_order([("MixedLoss", 0.3), ("pruned init", 0.1)])


def test_unresolved_differences_get_no_rank():
    from spirelib.throughput.ablations import MEASURED_COMPONENTS, resolved_ranking

    assert "sparse KV" not in MEASURED_COMPONENTS and len(MEASURED_COMPONENTS) == len(COMPONENTS) - 1
    ranking = importance(paper_multipliers())
    resolved = {name: name in ("target activations", "feedback") for name in MEASURED_COMPONENTS}
    rows = resolved_ranking(ranking, resolved)
    assert [(r.part, r.rank) for r in rows] == [
        ("sparse KV", 1), ("target activations", 2), ("feedback", 3),
        ("distillation", None), ("pruned init", None), ("MixedLoss", None)]
    assert all(r.resolved == (r.rank is not None) for r in rows)


def test_a_part_resolved_as_harmful_is_reported_as_harmful_not_ranked_last():
    from spirelib.throughput.ablations import MEASURED_COMPONENTS, resolved_ranking

    ranking = [("sparse KV", 0.7), ("distillation", 0.1), ("feedback", 0.01), ("target activations", -0.08)]
    rows = resolved_ranking(ranking, {name: name != "feedback" for name in MEASURED_COMPONENTS})
    assert [(r.part, r.rank, r.effect) for r in rows] == [
        ("sparse KV", 1, "helps"), ("distillation", 2, "helps"), ("target activations", None, "harmful"),
        ("feedback", None, "not resolved")]


def test_with_one_seed_a_ranking_speaks_of_its_trained_drafts_and_resolves_nothing_measured():
    from spirelib.measure import tau
    from spirelib.throughput.ablations import DRAFT, MEASURED_COMPONENTS, TRAINING, resolved_ranking

    assert (TRAINING, DRAFT) == (tau.TRAINING, tau.DRAFT)  # the scopes tau's intervals report
    ranking = [("sparse KV", 0.7), ("distillation", 0.1), ("feedback", 0.01), ("target activations", -0.08)]
    rows = resolved_ranking(ranking, {name: name != "feedback" for name in MEASURED_COMPONENTS}, DRAFT)
    assert [(r.part, r.rank, r.effect, r.resolved) for r in rows] == [
        ("sparse KV", 1, "helps", True), ("distillation", 2, "helps", False),
        ("target activations", None, "harmful", False), ("feedback", None, "not resolved", False)]
    assert {r.scope for r in rows} == {DRAFT}
    with pytest.raises(ValueError, match="scope"):
        resolved_ranking(ranking, {}, "seeds")
