"""Prompt lookup drafting (spirelib.decoding.lookup): its proposals are the tokens after the longest,
earliest recurring suffix n-gram (checked against a direct recomputation in plain Python), and
speculative decoding with it stays exact: greedy equals AD, sampling follows the target's
distribution (chi-square, several temperatures), each row decodes as if alone."""

from __future__ import annotations

import random

import pytest
import torch
from test_drafts import (
    assert_rows_as_if_alone,
    check_rounds_against_fresh_drafts,
    contexts_and_lengths,
    random_target,
)
from test_speculative import assert_two_token_law, peaky_model

from spirelib.decoding.builders import draft_factory
from spirelib.decoding.lookup import LookupDraft, propose_lookup
from spirelib.decoding.speculative import autoregressive_generate, speculative_generate
from spirelib.model.config import ModelConfig


def reference_proposal(context: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The rule, token by token: the longest n in [min_n, max_n] whose last-n tokens occur earlier
    (ending before the last token), its earliest occurrence, then the k tokens after it, reading
    the proposal itself once past the context; no match: the last token k times."""
    for n in range(max_n, min_n - 1, -1):
        if len(context) < n:
            continue
        suffix = context[-n:]
        starts = [i for i in range(len(context) - n) if context[i:i + n] == suffix]
        if starts:
            text = list(context)
            for j in range(k):
                text.append(text[starts[0] + n + j])
            return text[len(context):]
    return [context[-1]] * k


@pytest.mark.parametrize("min_n,max_n", [(1, 1), (1, 3), (2, 5), (3, 3)])
def test_proposals_equal_a_direct_recomputation_of_the_rule(min_n, max_n):
    rng = random.Random(min_n * 10 + max_n)
    k, C = 4, 40
    for _ in range(30):
        B = 6
        lengths = [rng.randint(1, C) for _ in range(B)]
        vocab = rng.choice([2, 3, 5, 50])  # small vocabularies recur, a large one mostly not
        rows = [[rng.randrange(vocab) for _ in range(C)] for _ in range(B)]
        history = torch.tensor(rows)
        got = propose_lookup(history, torch.tensor(lengths), k, min_n, max_n)
        want = [reference_proposal(row[:n], k, min_n, max_n) for row, n in zip(rows, lengths)]
        assert got.tolist() == want


def test_a_repeating_text_is_proposed_in_full():
    history = torch.tensor([[7, 1, 2, 3, 1, 2, 3, 1, 2, 0, 0, 0]])
    assert propose_lookup(history, torch.tensor([9]), 5, 1, 3).tolist() == [[3, 1, 2, 3, 1]]


def lookup(target):
    return LookupDraft(target, min_n=1, max_n=3)


def repetitive(B: int, L: int, seed: int, V: int) -> torch.Tensor:
    """Contexts (B, L) over V tokens that repeat a short random phrase with noise, so that lookup
    finds matches."""
    gen = torch.Generator().manual_seed(seed)
    phrase = torch.randint(0, V, (B, 5), generator=gen)
    text = phrase.repeat(1, L // 5 + 1)[:, :L].clone()
    noise = torch.rand(B, L, generator=gen) < 0.2
    return torch.where(noise, torch.randint(0, V, (B, L), generator=gen), text)


def test_greedy_speculative_decoding_with_lookup_equals_autoregressive():
    target = peaky_model()
    contexts = repetitive(5, 30, 1, target.cfg.vocab_size)
    lengths = torch.tensor([30, 21, 26, 4, 30])
    ad = autoregressive_generate(target, contexts, 25, temperature=0.0, lengths=lengths)
    sd = speculative_generate(target, lookup(target), contexts, 25, k=4, temperature=0.0, lengths=lengths)
    assert torch.equal(sd.tokens, ad.tokens)
    accepted = sd.accepted[sd.accepted >= 0]
    assert accepted.max() > 0 and accepted.min() < 4, "the test needs ragged acceptance"


@pytest.mark.parametrize("temperature", [1.0, 1.5])
def test_every_round_proposes_what_a_fresh_lookup_over_the_accepted_prefix_proposes(temperature):
    target = random_target()
    contexts, lengths = contexts_and_lengths(4, 11, 1, [11, 6, 9, 3])
    accepted = check_rounds_against_fresh_drafts(target, lambda: lookup(target), contexts, lengths, 24, 4,
                                                 temperature)
    assert (accepted >= 0).any()


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_sampled_speculative_decoding_with_lookup_matches_the_target_distribution(temperature):
    """The first two tokens follow the target's exact joint distribution at that temperature; the
    context repeats, so lookup proposes real tokens (a one-hot q), which the target accepts often."""
    cfg = ModelConfig(vocab_size=6, num_layers=2, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8, d_ff=32)
    target = peaky_model(cfg, std=0.15)
    gen = torch.Generator().manual_seed(11)
    context = torch.tensor([1, 4, 2, 2, 5, 0, 3, 1, 4, 2])
    n = 20_000
    sd = speculative_generate(target, LookupDraft(target, 1, 3), context.expand(n, -1), 2, k=3, temperature=temperature,
                              generator=gen)
    assert (sd.accepted[:, 0] > 0).float().mean() > 0.05, "the check needs accepted proposals"
    assert_two_token_law(target, context, sd.tokens, temperature)


def test_ragged_rows_decode_greedily_as_if_alone():
    target = random_target()
    contexts = repetitive(4, 16, 6, target.cfg.vocab_size)
    lengths = torch.tensor([16, 5, 11, 2])
    run = lambda c, n: speculative_generate(target, lookup(target), c, 18, k=4, temperature=0.0, lengths=n)  # noqa: E731
    assert_rows_as_if_alone(run, contexts, lengths)


def test_the_registry_builds_it_and_refuses_bad_n():
    target = random_target()
    draft = draft_factory("lookup", target, temperature=1.0, min_n=2, max_n=4)()
    assert (draft.min_n, draft.max_n, draft.vocab_size) == (2, 4, target.cfg.vocab_size)
    with pytest.raises(ValueError, match="1 <= min_n <= max_n"):
        draft_factory("lookup", target, temperature=1.0, min_n=3, max_n=2)()
