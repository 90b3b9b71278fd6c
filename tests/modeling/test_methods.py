"""The method cards: each method's facets in one place, read by the performance model's lists,
the winner maps, the deploy files and every round's price."""

from __future__ import annotations

import pytest

from spirelib.modeling import perfmodel as pm
from spirelib.modeling.methods import BUDGET, CARDS, CONTEXT, DRAFT, TARGET, KVBudget, card, color, label, letter


def test_the_performance_models_lists_come_from_the_cards():
    assert pm.MODELED_METHODS == ("vanilla", "magicdec", "spire")  # the paper's three (method §2)
    assert set(pm.EXTRA_METHODS) == {"guided", "lookup", "one_pass"}
    assert set(pm.SELF_DRAFTS) == {"magicdec", "guided", "lookup"}
    assert all(CARDS[m].needs_model != (m in pm.SELF_DRAFTS) for m in pm.METHODS)


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


def test_labels_colours_and_letters_are_the_cards_and_unknown_keys_fall_back():
    assert (label("spire"), color("spire"), letter("spire")) == ("SPIRe", CARDS["spire"].color, "S")
    assert letter("ad") == "AD" and label("no_feedback") == "no feedback"
    assert letter("medusa") == "me" and label("medusa") == "medusa"
    with pytest.raises(ValueError, match="unknown drafting method 'medusa'"):
        card("medusa")
