"""Compiled decoding under CUDA graphs' rules (`graph_pool.GraphPool`): every output a replay
returns is garbage after the next replay, of any graph, and a replay writes in place only static
addresses. Through that stand-in, where each speculative round and each AD step is one replay,
AD (greedy and sampled), speculative decoding with every draft over ragged rows, a prefill shared
by several generations, generations interleaved round by round, and the tau protocol all equal
eager decoding, token for token and count for count, at 8 target layers and k = 4."""

from __future__ import annotations

import pytest
import torch
from graph_pool import GraphPool
from test_speculative import CFG, assert_two_token_law, peaky_model

from spirelib.decoding.builders import draft_factory
from spirelib.decoding.drafts import SpireDraft, VanillaDraft, spire_draft
from spirelib.decoding.eagle3 import Eagle3Draft
from spirelib.decoding.lookup import LookupDraft
from spirelib.decoding.prefill import prefill, prefill_needs, speculative_capacity
from spirelib.decoding.speculative import (
    Options,
    autoregressive_generate,
    autoregressive_rounds,
    speculative_generate,
    speculative_rounds,
)
from spirelib.measure.tau import TauProtocol, measure_tau
from spirelib.model.config import Eagle3Config, ModelConfig, SpireConfig
from spirelib.model.eagle3 import Eagle3DraftModel, draft_vocabulary
from spirelib.model.spire import SpireDraftModel
from spirelib.throughput.methods import BUDGETED, card

G, K = 12, 4
TARGET = ModelConfig(vocab_size=CFG.vocab_size, num_layers=8, d_model=16, n_q_per_kv=2, n_kv=2, d_head=4, d_ff=32)


@pytest.fixture(scope="module")
def models():
    target = peaky_model(TARGET, std=0.15)  # sampled tokens vary: an overwritten distribution shows
    small = peaky_model(ModelConfig(vocab_size=CFG.vocab_size, num_layers=1, d_model=16, n_q_per_kv=1, n_kv=2,
                                    d_head=8, d_ff=32), seed=5, std=0.15)
    spire = SpireDraftModel.from_target(target, SpireConfig(num_layers=1, window=6, k=K)).eval()
    plain = SpireDraftModel.from_target(target, SpireConfig(num_layers=1, window=6, k=K, feedback=False,
                                                            target_activations=False)).eval()
    torch.manual_seed(6)
    eagle3 = Eagle3DraftModel.from_target(target, Eagle3Config(draft_vocab=CFG.vocab_size // 2),
                                          draft_vocabulary(CONTEXTS, CFG.vocab_size // 2, CFG.vocab_size)).eval()
    return {"target": target, "small": small, "spire": spire, "plain": plain, "eagle3": eagle3}


def budgeted(target, temperature, entries: int) -> dict:
    """Every budgeted self-draft (`methods.BUDGETED`: MagicDec, the guided draft, any new one) over
    `entries` keys with a sink of 1, spent as its card says, built by its builder."""
    return {m: draft_factory(m, target, temperature=temperature, budget=card(m).budget(entries, 1))()
            for m in BUDGETED}


def drafts(models, temperature):
    """Every kind of draft the engine decodes with, sampling at `temperature` (MagicDec over a sink
    and 6 recent keys, the guided draft over a sink, 3 recent and 3 chosen)."""
    target = models["target"]
    return {"vanilla": VanillaDraft(models["small"], temperature), **budgeted(target, temperature, 7),
            "spire": SpireDraft(models["spire"], temperature),
            "spire, no target activations": spire_draft(models["plain"], temperature),
            "lookup": LookupDraft(target), "eagle3": Eagle3Draft(models["eagle3"], temperature)}


CONTEXTS = torch.randint(0, CFG.vocab_size, (4, 16), generator=torch.Generator().manual_seed(3))
LENGTHS = torch.tensor([16, 13, 16, 11])  # ragged: the prefill's padding is masked


def decode_all(models, temperature):
    """{name: (tokens (B, G), accepted (B, R) or None)} for AD and SD with every draft, each from
    its own seed, the prefill compiled (ragged contexts)."""
    out = {}
    gen = torch.Generator().manual_seed(1)
    ad = autoregressive_generate(models["target"], CONTEXTS, G, temperature=temperature, lengths=LENGTHS,
                                 generator=gen)
    out["ad"] = (ad.tokens, None)
    for i, (name, draft) in enumerate(drafts(models, temperature).items()):
        gen = torch.Generator().manual_seed(10 + i)
        sd = speculative_generate(models["target"], draft, CONTEXTS, G, k=K, temperature=temperature,
                                  lengths=LENGTHS, generator=gen)
        out[name] = (sd.tokens, sd.accepted)
    return out


def through_pool(models, run):
    pool = GraphPool().install(*models.values())
    try:
        return run(), pool.replays
    finally:
        GraphPool.uninstall(*models.values())


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_every_decoding_path_equals_eager_when_each_replay_overwrites_the_outputs_before_it(models, temperature):
    eager = decode_all(models, temperature)
    pooled, replays = through_pool(models, lambda: decode_all(models, temperature))
    assert replays > 5 * G  # every forward ran as a replay
    for name, (tokens, accepted) in eager.items():
        assert torch.equal(pooled[name][0], tokens), name
        assert accepted is None or torch.equal(pooled[name][1], accepted), name


def test_a_shared_prefill_and_generations_interleaved_round_by_round_equal_eager(models):
    target = models["target"]

    def interleaved():
        """AD and SD with every draft over one prefill's copies, a round of each in turn (as
        wallclock times them), sampled."""
        capacity = speculative_capacity(CONTEXTS.shape[1], G, K)
        every = drafts(models, 1.0)
        shared = prefill(target, CONTEXTS, LENGTHS, capacity=capacity, **prefill_needs(every.values(), K))
        gens = {name: torch.Generator().manual_seed(20 + i) for i, name in enumerate(["ad", *every])}
        made = drafts(models, 1.0)
        runs = {"ad": autoregressive_rounds(target, CONTEXTS, G, temperature=1.0, generator=gens["ad"],
                                            prefilled=shared.copy())}
        for name in every:
            runs[name] = speculative_rounds(target, made[name], CONTEXTS, G, K,
                                            Options(1.0, generator=gens[name], prefilled=shared.copy()))
        done = {}
        while runs:
            for name in list(runs):
                try:
                    next(runs[name])
                except StopIteration as end:
                    done[name] = end.value.tokens
                    del runs[name]
        return done

    eager = interleaved()
    pooled, _ = through_pool(models, interleaved)
    for name, tokens in eager.items():
        assert torch.equal(pooled[name], tokens), name


def test_the_tau_protocol_counts_equal_eager(models):
    target = models["target"]
    protocol = TauProtocol(k=K, new_tokens=G, temperature=1.0, batch_size=3, seed=4)
    contexts = {16: torch.randint(0, CFG.vocab_size, (5, 16), generator=torch.Generator().manual_seed(8))}

    def tau():
        factories = {name: (lambda name=name: drafts(models, 1.0)[name]) for name in drafts(models, 1.0)}
        return measure_tau(target, factories, contexts, protocol).counts

    eager = tau()
    pooled, _ = through_pool(models, tau)
    for name, by_length in eager.items():
        assert torch.equal(pooled[name][16].accepted, by_length[16].accepted), name


def test_the_pool_catches_an_output_kept_past_the_next_replay(models):
    """The stand-in itself: a caller that keeps a replay's output sees it overwritten."""
    target = models["target"]
    GraphPool().install(target)
    try:
        cache = target.new_cache(2, 8)
        first = target.last_logits(CONTEXTS[:2, :4], None, cache, greedy=True)  # (2,) tokens, in the pool
        kept, copied = first, first.clone()
        target.last_logits(copied[:, None], torch.full((2, 1), 4), cache, greedy=True)
        assert not torch.equal(kept, copied) and torch.all(kept < 0)
    finally:
        GraphPool.uninstall(target)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_rounds_through_graphs_follow_the_target_distribution(temperature):
    """Lossless through the graphed path: with every round one replay of the stand-in (its
    uniforms read from the generation's buffer, drawn ahead), the first two tokens of every
    draft's generations follow the target's exact two-token law at `temperature` (chi-square)."""
    cfg = ModelConfig(vocab_size=6, num_layers=2, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8, d_ff=32)
    target = peaky_model(cfg, std=0.15)
    small = peaky_model(ModelConfig(vocab_size=6, num_layers=1, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8, d_ff=32),
                        seed=7, std=0.15)
    spire = SpireDraftModel.from_target(target, SpireConfig(num_layers=1, window=3, k=3)).eval()
    context = torch.tensor([1, 4, 2, 2, 5, 0, 3, 1, 4, 2])
    made = {"vanilla": VanillaDraft(small, temperature), "spire": SpireDraft(spire, temperature),
            **budgeted(target, temperature, 5), "lookup": LookupDraft(target)}
    pool = GraphPool().install(target, small, spire)
    try:
        for i, (name, draft) in enumerate(made.items()):
            replays = pool.replays
            sd = speculative_generate(target, draft, context.expand(8_000, -1), 2, k=3, temperature=temperature,
                                      generator=torch.Generator().manual_seed(30 + i))
            rounds = sd.accepted.shape[1] + 1  # and the one the late stop check lets run
            # the prefill, the draft's start (the vanilla draft's own prefill), then one replay a round
            assert rounds + 1 <= pool.replays - replays <= rounds + 2, (name, pool.replays - replays, rounds)
            assert (sd.accepted[:, 0] > 0).float().mean() > 0.05, f"{name}: the check needs accepted proposals"
            assert_two_token_law(target, context, sd.tokens, temperature)
    finally:
        GraphPool.uninstall(target, small, spire)
