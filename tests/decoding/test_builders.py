"""The builder table against the method cards: every decoded card has a builder and nothing else
does, a builder needs a trained model exactly when its card says so, and a steady round of each
method runs the forwards its card lists (`MethodCard.round`): who runs each, on how many tokens.
The cards price rounds everywhere (the plan, the profiled model, `bench decode`); this is what
ties that price to the engine."""

from __future__ import annotations

import pytest
import torch
from test_graph_outputs import CONTEXTS, K, drafts, models  # noqa: F401  (models: the fixture)

from spirelib.decoding.builders import BUILDERS, draft_factory
from spirelib.decoding.drafts import MagicDecDraft
from spirelib.decoding.speculative import Options, speculative_rounds
from spirelib.throughput.methods import CARDS, DECODED, DRAFT, TARGET, KVBudget, card


def test_the_builder_table_holds_every_decoded_card_and_nothing_else():
    assert set(BUILDERS) == set(DECODED) and set(DECODED) < set(CARDS)


def test_a_builder_needs_a_trained_model_exactly_when_its_card_says_so(models):  # noqa: F811
    target = models["target"]
    trained = {"vanilla": models["small"], "spire": models["spire"], "eagle3": models["eagle3"]}
    for method in DECODED:
        if card(method).needs_model:
            with pytest.raises(ValueError, match="needs its trained draft model"):
                draft_factory(method, target, temperature=1.0)
            draft_factory(method, target, trained[method], temperature=1.0)()
        else:
            draft_factory(method, target, temperature=1.0)()


def round_forwards(models, method: str) -> list[tuple[str, int]]:  # noqa: F811
    """(who, tokens a row) of every forward in the 3rd round of `method`'s generation, in order:
    each forward embeds its tokens once, so a hook on each model's embedding sees it."""
    draft = {"vanilla": models["small"], "eagle3": models["eagle3"]}.get(method, models["spire"].body)
    owners = {TARGET: models["target"].embed, DRAFT: draft.embed}
    seen, recording = [], [False]
    hooks = [module.register_forward_pre_hook(
        lambda _, args, who=who: seen.append((who, args[0].shape[-1])) if recording[0] else None)
        for who, module in owners.items()]
    try:
        rounds = speculative_rounds(models["target"], drafts(models, 1.0)[method], CONTEXTS, 40, K,
                                    Options(1.0, generator=torch.Generator().manual_seed(0)))
        for _ in range(2):
            next(rounds)
        recording[0] = True
        next(rounds)
        rounds.close()
    finally:
        for h in hooks:
            h.remove()
    return seen


@pytest.mark.parametrize("method", DECODED)
def test_a_round_runs_the_forwards_its_card_lists(models, method):  # noqa: F811
    """The card's forwards, then, for a draft that fuses the target's hidden states (EAGLE-3), its
    entries for the k newly verified positions past the pending one (`perfmodel.fused_params`)."""
    c = card(method)
    fused = [(DRAFT, K)] if c.fused else []
    assert round_forwards(models, method) == [(p.runs, p.new) for p in c.round(K)] + fused


def test_the_recent_window_is_magicdecs_ring_with_no_sink_and_as_many_entries(models):  # noqa: F811
    """The sink ablation of self-speculation: MagicDec's code over a budget of recent keys alone,
    at MagicDec's 65 entries by default and at any budget a series gives it."""
    target = models["target"]
    recent = draft_factory("recent", target, temperature=0.0)()
    assert isinstance(recent, MagicDecDraft) and recent.budget == KVBudget(0, 65)
    assert draft_factory("recent", target, temperature=0.0, budget=card("recent").budget(7, 1))().budget == KVBudget(0, 7)
