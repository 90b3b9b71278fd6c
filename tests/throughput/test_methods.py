"""The method cards: each method's facets in one place, read by the performance model's lists,
the winner maps, the deploy files and every round's price."""

from __future__ import annotations

import pytest

from spirelib.throughput import perfmodel as pm
from spirelib.throughput.methods import (
    BUDGET,
    BUDGETED,
    CARDS,
    CONTEXT,
    DECODED,
    DRAFT,
    TARGET,
    KVBudget,
    card,
    color,
    label,
    letter,
)


def test_the_performance_models_lists_come_from_the_cards():
    assert pm.MODELED_METHODS == ("vanilla", "magicdec", "spire")  # the paper's three (method §2)
    assert set(pm.EXTRA_METHODS) == {"guided", "recent", "lookup", "eagle3", "one_pass"}
    assert set(pm.SELF_DRAFTS) == {"magicdec", "guided", "recent", "lookup"}
    assert all(CARDS[m].needs_model != (m in pm.SELF_DRAFTS) for m in pm.METHODS)


def test_a_method_past_the_paper_is_priced_like_one_of_the_papers_three_or_at_tau_1():
    """Until its tau is measured the plan prices a decoded method at its relative's paper tau: the
    relative is one of the paper's three (it has a tau there), and a paper method needs none."""
    relatives = {c.name: c.priced_like for c in CARDS.values() if c.priced_like}
    assert relatives == {"guided": "magicdec", "recent": "magicdec", "eagle3": "vanilla"}
    assert all(CARDS[r].paper and r in pm.PAPER_TAU[pm.PAPER_TAU_CONTEXT] for r in relatives.values())
    assert not any(CARDS[m].priced_like for m in pm.MODELED_METHODS)


def test_a_round_is_the_draft_passes_then_the_verification():
    k = 4
    vanilla = card("vanilla").round(k)
    assert [(p.runs, p.new, p.reads) for p in vanilla] == [(DRAFT, 2, CONTEXT)] + [(DRAFT, 1, CONTEXT)] * 3 + [
        (TARGET, 5, CONTEXT)]
    assert vanilla[-1].verify and not any(p.verify for p in vanilla[:-1])
    guided = card("guided").round(k)
    assert all(p.runs == TARGET and p.reads == BUDGET and p.own == 1 for p in guided[:-1]) and guided[-1].scores
    assert card("lookup").round(k) == card("lookup").round(k)[-1:]  # no draft pass
    assert [p.new for p in card("one_pass").round(k)] == [k, k + 1]  # all k positions in one pass


def test_a_kv_budget_names_its_parts_and_splits_like_the_guided_draft():
    assert KVBudget(1, 64).entries == 65 and KVBudget.split(65) == KVBudget(1, 32, 32)
    assert KVBudget.split(16) == KVBudget(1, 8, 7)
    with pytest.raises(ValueError, match="at least sink \\+ 2"):
        KVBudget.split(2)
    with pytest.raises(ValueError, match="window >= 1"):
        KVBudget(1, 0)
    assert KVBudget.ring(65) == KVBudget(1, 64) and KVBudget.ring(8, 0) == KVBudget(0, 8)
    with pytest.raises(ValueError, match="at least sink \\+ 1"):
        KVBudget.ring(1)


def test_every_sparse_self_draft_says_how_it_spends_a_kv_budget_of_any_size():
    """`Series.kv_budgets` and the benchmarks budget exactly the self-drafts that read a budget
    (SPIRe's comes from its trained config), each spending every entry it is given."""
    assert BUDGETED == tuple(m for m in DECODED if card(m).drafter == TARGET and card(m).reads == BUDGET)
    assert card("magicdec").budget(65, 1) == KVBudget(1, 64) and card("guided").budget(65, 1) == KVBudget(1, 32, 32)
    for m in BUDGETED:
        assert all(card(m).budget(entries, sink).entries == entries for entries in (8, 65, 257) for sink in (0, 1, 4))


def test_labels_colours_and_letters_are_the_cards_and_unknown_keys_fall_back():
    assert (label("spire"), color("spire"), letter("spire")) == ("SPIRe", CARDS["spire"].color, "S")
    assert letter("ad") == "AD" and label("no_feedback") == "no feedback"
    assert letter("medusa") == "me" and label("medusa") == "medusa"
    with pytest.raises(ValueError, match="unknown drafting method 'medusa'"):
        card("medusa")


def test_eagle3_is_priced_as_one_layer_with_its_fusion_and_a_dense_cache_so_spire_gains_with_context():
    """EAGLE-3 (arXiv 2503.01840) beside SPIRe in the paper's model (method §2): its one layer reads
    [embedding ; feature] (2 d wide W_q, W_k, W_v) after fusing 3 target hidden states (3 d x d), and
    its own dense KV grows with L, where SPIRe's sink + window stays fixed. At one tau, SPIRe's
    margin over EAGLE-3 grows with the context, and with the batch at a long context."""
    shape = pm.PRESETS["eagle3-draft"]
    d = shape.d_model
    assert pm.fused_params("eagle3", shape) == 3 * d * d + (1 + 2) * 8 * d * 128
    assert pm.fused_params("spire", shape) == 0
    dense = pm.iteration_time_multiplier("eagle3", 64, 32768, "seqax-67m", "eagle3-draft", window_factor=None)
    assert pm.iteration_time_multiplier("eagle3", 64, 32768, "seqax-67m", "eagle3-draft", window=64) == dense

    def margin(B, L):
        return (pm.throughput_multiplier("spire", 3.0, B, L, "seqax-67m", "spire-draft", window=64)
                / pm.throughput_multiplier("eagle3", 3.0, B, L, "seqax-67m", "eagle3-draft"))
    assert margin(64, 512) < margin(64, 4096) < margin(64, 32768)
    assert margin(1, 32768) < margin(64, 32768)
