"""The profiled cost model: its work accounting, its rounds, its fit to sections timed in the loop."""

import dataclasses
import math
import statistics

import numpy as np
import pytest
import torch

from spirelib.model.config import ModelConfig
from spirelib.model.transformer import Transformer
from spirelib.throughput import acceptance, profile_fit, profiled
from spirelib.throughput.acceptance import alpha_from_tau, expected_rounds
from spirelib.throughput.hardware import Machine
from spirelib.throughput.methods import KVBudget
from spirelib.throughput.perfmodel import ModelShape, body_params

SHAPE = ModelShape(num_layers=2, d_model=16, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=32)


def test_forward_work_counts_body_attention_unembedding_and_kv_traffic():
    w = profiled.forward_work(SHAPE, 100, batch=3, new=2, keys=10, bytes_per_value=2)
    n = body_params(SHAPE)
    attention = 4 * 2 * 4 * 8 * (3 * 2) * 10  # layers x n_q x d_head per (token, key)
    assert w.flops == 2 * (n + 16 * 100) * 6 + attention
    assert w.bytes == (n + 16 * 100 + 2 * 2 * 2 * 8 * 3 * (10 + 2)) * 2
    assert w.layers == 2 and w.key_reads == 3 * 10 * 2
    prefill = profiled.forward_work(SHAPE, 100, batch=3, new=2, keys=10, logits=False)
    assert w.flops - prefill.flops == 2 * 16 * 100 * 6


TARGET = ModelShape(num_layers=4, d_model=16, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=32)
DRAFTS = {"vanilla": profiled.DraftShape("vanilla", SHAPE), "magicdec": profiled.DraftShape("magicdec", None, KVBudget(1, 68)),
          "spire": profiled.DraftShape("spire", SHAPE, KVBudget(1, 69), memory_layers=2)}
def priced(vocab_size: int) -> profiled.PricedTarget:
    """TARGET with a vocabulary of `vocab_size`, in fp32, as a round is priced against it."""
    return profiled.PricedTarget(TARGET, vocab_size, 4.0)


TRUE = profiled.ProfiledCost(flops_per_s=1e11, bytes_per_s=1e10, per_layer_s=5e-5, per_token_layer_s=3e-7,
                             multi_token_layer_s=4e-5, per_key_s=2e-9, attention_flops_per_s=4e10, sampling_s=3e-5,
                             sampling_per_logit_s=1e-9, bookkeeping_s=1e-4, bookkeeping_per_logit_s=2e-9,
                             drafts={"vanilla": profiled.DraftOverhead(-2e-5, 1e-6),
                                     "magicdec": profiled.DraftOverhead(4e-4, 3e-6),
                                     "spire": profiled.DraftOverhead(1e-4, -5e-7)})

COEFFICIENTS = ("per_layer_s", "per_token_layer_s", "multi_token_layer_s", "per_key_s", "attention_flops_per_s",
                "sampling_s", "sampling_per_logit_s", "bookkeeping_s", "bookkeeping_per_logit_s")  # what `fit` fits


def loop(cost, method, B, L, G=64, k=4, V=100):
    """A LoopTiming whose sections are exactly what `cost` says they take."""
    if method == "ad":
        forward = cost.seconds(profiled.forward_work(TARGET, V, B, 1, profiled.ad_keys(L, G)))
        return profile_fit.LoopTiming("ad", B, L, G, 0.0, forward, cost.sampling(B, V))
    keys = profiled.sd_keys(L, G, k)
    verify = profiled.verify_seconds(cost, priced(V), B, k, keys)
    book = cost.bookkeeping(B, k, V)
    total = profiled.round_seconds(cost, DRAFTS[method], priced(V), B, k, keys)
    if DRAFTS[method].memory_layers:  # SPIRe's verification also keeps the target's stream, priced in its overhead
        verify *= 1.1
    return profile_fit.LoopTiming(method, B, L, G, total - verify - book, verify, book)


GRID = [(B, L) for B in (1, 16, 64) for L in (64, 256, 960)]


def test_fit_recovers_the_coefficients_it_was_made_with_and_pins_the_calibrated_rates():
    timings = [loop(TRUE, m, B, L) for B, L in GRID for m in ("ad", *DRAFTS)]
    got = profile_fit.fit(timings, target=TARGET, vocab_size=100, drafts=DRAFTS, k=4, machine=Machine(1e11, 1e10, 4.0))
    assert (got.flops_per_s, got.bytes_per_s) == (1e11, 1e10)  # pinned, never fitted
    for name in COEFFICIENTS:
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    # SPIRe's round is fitted whole: its verification's stream capture goes into its overhead
    for method in ("vanilla", "magicdec"):
        assert got.draft(method).round_s == pytest.approx(TRUE.draft(method).round_s, rel=1e-6)
        assert got.draft(method).round_per_row_s == pytest.approx(TRUE.draft(method).round_per_row_s, rel=1e-6)
    for t in timings:
        assert profile_fit.modeled_sections(got, t, target=priced(100), drafts=DRAFTS, k=4) == pytest.approx(
            t.round_s, rel=1e-6)


def test_fit_recovers_each_cells_own_pace_with_the_coefficients():
    """A cell timed while the machine ran slow (or fast) takes every method's sections times one
    factor: the fit finds the factors, geometric mean 1, and the coefficients as if unslowed, and a
    modeled speedup ignores them."""
    rng = np.random.default_rng(0)
    drawn = np.exp(rng.normal(0.0, 0.1, len(GRID)))
    paces = dict(zip(GRID, drawn / np.exp(np.log(drawn).mean())))
    timings = [dataclasses.replace(t, draft_s=t.draft_s * f, verify_s=t.verify_s * f, bookkeeping_s=t.bookkeeping_s * f)
               for B, L in GRID for f in (paces[(B, L)],) for t in (loop(TRUE, m, B, L) for m in ("ad", *DRAFTS))]
    got = profile_fit.fit(timings, target=TARGET, vocab_size=100, drafts=DRAFTS, k=4, machine=Machine(1e11, 1e10, 4.0))
    for cell, pace in paces.items():
        assert got.pace(*cell) == pytest.approx(pace, rel=1e-6), cell
    assert got.pace(7, 100) == 1.0  # a cell it never saw
    for name in COEFFICIENTS:
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=1e-5), name
    for t in timings:
        assert profile_fit.modeled_sections(got, t, target=priced(100), drafts=DRAFTS, k=4) == pytest.approx(
            t.round_s, rel=1e-5)
    assert profiled.speedup(got, DRAFTS["magicdec"], 3.0, priced(100), 64, 960, 64, 4) == pytest.approx(
        profiled.speedup(TRUE, DRAFTS["magicdec"], 3.0, priced(100), 64, 960, 64, 4), rel=1e-5)


def test_a_single_token_forward_skips_the_multi_token_kernels_and_without_one_per_layer_prices_them():
    """B x T = 1 runs matrix-vector products: an AD step at B = 1 does not pay what the multi-token
    kernels cost per layer; a grid with no B = 1 cell cannot tell that cost from per_layer_s, so the
    fit puts it there and prices every forward it saw exactly."""
    one, two = (profiled.forward_work(TARGET, 100, 1, new, 500) for new in (1, 2))
    bare = dataclasses.replace(TRUE, multi_token_layer_s=0.0)
    assert TRUE.seconds(one) == bare.seconds(one)
    assert TRUE.seconds(two) == pytest.approx(bare.seconds(two) + 4e-5 * TARGET.num_layers)
    wide = [(B, L) for B, L in GRID if B > 1]
    timings = [loop(TRUE, m, B, L) for B, L in wide for m in ("ad", "vanilla", "magicdec")]
    got = profile_fit.fit(timings, target=TARGET, vocab_size=100, drafts=DRAFTS, k=4, machine=Machine(1e11, 1e10, 4.0))
    assert got.multi_token_layer_s == 0.0
    assert got.per_layer_s == pytest.approx(TRUE.per_layer_s + TRUE.multi_token_layer_s, rel=1e-6)
    for t in timings:
        assert profile_fit.modeled_sections(got, t, target=priced(100), drafts=DRAFTS, k=4) == pytest.approx(
            t.round_s, rel=1e-6)


def test_fit_refuses_timings_that_cannot_identify_it_and_says_why():
    def problems(cells, methods=("ad", "vanilla"), drafts=DRAFTS):
        timings = [loop(TRUE, m, B, L) for B, L in cells for m in methods]
        with pytest.raises(ValueError, match="cannot fit the profiled model") as err:
            profile_fit.fit(timings, target=TARGET, vocab_size=100, drafts=drafts, k=4, machine=Machine(1e11, 1e10, 4.0))
        return str(err.value)

    assert "2 (B, L) cell(s) timed; the fit needs at least 3" in problems([(1, 64), (16, 256)])
    assert "every cell is at B = 16; the per-token and per-row costs need at least two batch sizes" in problems(
        [(16, 64), (16, 256), (16, 960)])
    assert "every cell is at L = 256; attention's cost needs at least two context lengths" in problems(
        [(1, 256), (16, 256), (64, 256)])
    assert "no AD timings" in problems(GRID, methods=("vanilla",))
    assert "'spire' was timed but has no DraftShape" in problems(GRID, methods=("ad", "spire"),
                                                               drafts={"vanilla": DRAFTS["vanilla"]})
    lone = [loop(TRUE, "ad", B, L) for B, L in GRID] + [loop(TRUE, "vanilla", 16, L) for L in (64, 256)]
    assert profile_fit.fit_problems(lone, DRAFTS) == [
        "'vanilla' was timed at one batch size; its overhead per row needs two"]


def test_a_round_is_the_drafts_passes_the_verification_the_bookkeeping_the_accept_and_the_overhead():
    cost = profiled.ProfiledCost(1e11, 1e10, per_layer_s=1e-5, per_token_layer_s=1e-7, bookkeeping_s=3e-5,
                                 sampling_s=2e-5)
    verify = cost.seconds(profiled.forward_work(TARGET, 100, 8, 5, 105))
    assert profiled.verify_seconds(cost, priced(100), 8, 4, 105) == verify
    vanilla = DRAFTS["vanilla"]
    passes = cost.seconds(profiled.forward_work(SHAPE, 100, 8, 2, 105)) + 3 * cost.seconds(
        profiled.forward_work(SHAPE, 100, 8, 1, 105))
    assert profiled.round_seconds(cost, vanilla, priced(100), 8, 4, 105) == pytest.approx(
        passes + verify + 3e-5 + 4 * 2e-5)  # one draw per draft pass
    magicdec = DRAFTS["magicdec"]
    assert profiled.round_seconds(cost, magicdec, priced(100), 8, 4, 105) == pytest.approx(
        4 * (cost.seconds(profiled.forward_work(TARGET, 100, 8, 1, 70)) + 2e-5) + verify + 3e-5)
    plain = profiled.DraftShape("spire", SHAPE, KVBudget(1, 69))
    assert profiled.round_seconds(cost, DRAFTS["spire"], priced(100), 8, 4, 105) > profiled.round_seconds(
        cost, plain, priced(100), 8, 4, 105)  # its memory writes
    over = dataclasses.replace(cost, drafts={"magicdec": profiled.DraftOverhead(1e-4, 2e-6)})
    assert profiled.round_seconds(over, magicdec, priced(100), 8, 4, 105) == pytest.approx(
        profiled.round_seconds(cost, magicdec, priced(100), 8, 4, 105) + 1e-4 + 8 * 2e-6)
    # an AD step is a forward and a draw
    assert profiled.ad_step_seconds(cost, priced(100), 8, 105) == pytest.approx(
        cost.seconds(profiled.forward_work(TARGET, 100, 8, 1, 105)) + 2e-5)


def test_speedup_prices_the_rounds_a_batch_needs_until_its_slowest_row_is_done():
    """G AD steps against E[rounds] of speculative decoding, every dense read at its capacity
    (L + G for AD, L + G + 2k for SD); a larger batch needs more rounds at the same tau."""
    cost = profiled.ProfiledCost(1e11, 1e10, per_layer_s=1e-5, per_token_layer_s=1e-7)
    for draft in (DRAFTS["vanilla"], DRAFTS["magicdec"]):
        for B in (1, 64):
            got = profiled.speedup(cost, draft, 3.0, priced(100), B, 500, 64, 4)
            ad = profiled.ad_step_seconds(cost, priced(100), B, 564)
            rounds = profiled.round_seconds(cost, draft, priced(100), B, 4, 572)
            assert got == pytest.approx(64 * ad / (expected_rounds(3.0, 4, 64, B) * rounds))
    assert expected_rounds(3.0, 4, 64, 64) > expected_rounds(3.0, 4, 64, 1) > 64 / 3.0


def test_expected_rounds_is_exact_at_the_ends_and_matches_a_simulation_between():
    assert expected_rounds(1.0, 4, 64, 16) == pytest.approx(64)  # nothing accepted: one token a round
    assert expected_rounds(5.0, 4, 64, 16) == pytest.approx(13)  # everything: k + 1 a round, the last one past G
    gen = np.random.default_rng(0)
    alpha = float(alpha_from_tau(2.6, 4))
    for B in (1, 16):
        rounds = []
        for _ in range(3000):
            tokens, n = np.zeros(B), 0
            while (tokens < 64).any():
                tokens += np.minimum(gen.geometric(1 - alpha, size=B) - 1, 4) + 1
                n += 1
            rounds.append(n)
        sem = np.std(rounds) / math.sqrt(len(rounds))
        assert abs(np.mean(rounds) - expected_rounds(2.6, 4, 64, B)) < 4 * sem, B


def test_expected_rounds_has_the_closed_form_of_two_tokens_at_depth_one():
    """G = 2, k = 1: a row is done after one round iff it accepted (alpha), else after two, so the
    slowest of B rows needs 2 - alpha^B rounds; the capped last bin and the power of B both show."""
    for alpha in (0.3, 0.8):
        for B in (1, 2, 7):
            assert expected_rounds(1 + alpha, 1, 2, B) == pytest.approx(2 - alpha**B, rel=1e-12)


def test_a_schedule_convolves_each_tau_once_whatever_its_batch_sizes():
    """09's scheduling prices B = 1..64 at each tau: one row's distribution serves them all (it took
    52 s a notebook run when each batch size convolved its own)."""
    acceptance._row_done.cache_clear()
    for B in range(1, 65):
        expected_rounds(3.1, 4, 64, B)
        expected_rounds(2.2, 4, 64, B)
    assert acceptance._row_done.cache_info().misses == 2


def test_the_fit_explains_real_rounds_timed_in_the_loop():
    """time_decoding's sections at a few cells of a tiny model, fitted, then priced: the model
    explains its own fitted rounds (up to this shared machine's noise)."""
    from spirelib.decoding.builders import draft_factory
    from spirelib.measure.stopping import SpeedupRule
    from spirelib.measure.tau import DecodingProtocol
    from spirelib.measure.wallclock import loop_timings, profiled_draft_shapes, time_decoding
    from spirelib.model.config import SpireConfig, vanilla_draft_config
    from spirelib.model.spire import SpireDraftModel

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, num_layers=2, d_model=32, n_q_per_kv=1, n_kv=2, d_head=16, d_ff=64)
    target = Transformer(cfg).eval()
    vanilla = Transformer(vanilla_draft_config(cfg)).eval()
    spire_cfg = SpireConfig(num_layers=1, window=8, k=3)
    spire = SpireDraftModel.from_target(target, spire_cfg).eval()
    factories = {"vanilla": draft_factory("vanilla", target, vanilla, temperature=1.0),
                 "magicdec": draft_factory("magicdec", target, temperature=1.0, budget=KVBudget(1, 8)),
                 "spire": draft_factory("spire", target, spire, temperature=1.0)}
    seen = []
    timings = []
    for B, L in ((1, 16), (3, 16), (1, 40), (3, 40)):
        def contexts(run, B=B, L=L):
            seen.append((B, L, run))
            return torch.randint(0, 64, (B, L), generator=torch.Generator().manual_seed(run))

        timings += time_decoding(target, factories, contexts, DecodingProtocol(k=3, new_tokens=8), SpeedupRule(2, 2))
    assert seen == [(B, L, r) for B, L in ((1, 16), (3, 16), (1, 40), (3, 40)) for r in range(3)]  # fresh contexts
    shapes = profiled_draft_shapes({"vanilla": vanilla.cfg, "spire": spire.body.cfg},
                                   {"magicdec": KVBudget(1, 8), "spire": KVBudget(spire_cfg.sink, spire_cfg.window)}, spire_cfg)
    loops = loop_timings(timings)
    cost = profile_fit.fit(loops, target=cfg.shape(), vocab_size=64, drafts=shapes, k=3, machine=Machine(1e11, 1e10, 4.0))
    assert set(cost.drafts) == set(factories) and cost.per_layer_s + cost.per_token_layer_s > 0
    errors = [profile_fit.modeled_sections(cost, t, target=profiled.PricedTarget(cfg.shape(), 64), drafts=shapes, k=3) / t.round_s - 1
              for t in loops]
    assert statistics.median(abs(e) for e in errors) < 0.3  # timing noise, not a wrong model


GUIDED = profiled.DraftShape("guided", None, KVBudget.split(65))
LOOKUP = profiled.DraftShape("lookup")


def test_the_guided_draft_pays_its_scoring_in_the_verification_and_prompt_lookup_runs_no_draft_pass():
    cost = profiled.ProfiledCost(1e11, 1e10, per_layer_s=1e-5, per_token_layer_s=1e-7, per_key_s=1e-9,
                                 attention_flops_per_s=5e10, bookkeeping_s=3e-5, sampling_s=2e-5)
    w = profiled.forward_work(TARGET, 100, 8, 5, 105)
    keys_again = 8 * 105 * 4 * 2 * 8 * 4.0  # B x keys x layers x n_kv x d_head, 4 bytes each
    scored = dataclasses.replace(w, flops=w.flops + w.attention_flops / 2, attention_flops=1.5 * w.attention_flops,
                                 bytes=w.bytes + keys_again)
    assert profiled.verify_seconds(cost, priced(100), 8, 4, 105, scores=True) == pytest.approx(cost.seconds(scored))
    assert cost.seconds(scored) > cost.seconds(w)
    passes = 4 * (cost.seconds(profiled.forward_work(TARGET, 100, 8, 1, 66)) + 2e-5)
    assert profiled.round_seconds(cost, GUIDED, priced(100), 8, 4, 105) == pytest.approx(
        passes + cost.seconds(scored) + 3e-5)
    assert profiled.round_seconds(cost, LOOKUP, priced(100), 8, 4, 105) == pytest.approx(cost.seconds(w) + 3e-5)


def test_the_fit_leaves_the_guided_drafts_scoring_verification_out_of_the_forward_coefficients():
    drafts = {**DRAFTS, "guided": GUIDED, "lookup": LOOKUP}
    true = dataclasses.replace(TRUE, drafts={**TRUE.drafts, "guided": profiled.DraftOverhead(2e-4, 1e-6),
                                             "lookup": profiled.DraftOverhead(5e-5, 2e-7)})

    def timing(method, B, L, G=64, k=4, V=100):
        if method not in ("guided", "lookup"):
            return loop(true, method, B, L)
        keys = profiled.sd_keys(L, G, k)
        verify = profiled.verify_seconds(true, priced(V), B, k, keys, scores=drafts[method].scores)
        book = true.bookkeeping(B, k, V)
        total = profiled.round_seconds(true, drafts[method], priced(V), B, k, keys)
        return profile_fit.LoopTiming(method, B, L, G, total - verify - book, verify, book)

    timings = [timing(m, B, L) for B, L in GRID for m in ("ad", *drafts)]
    got = profile_fit.fit(timings, target=TARGET, vocab_size=100, drafts=drafts, k=4, machine=Machine(1e11, 1e10, 4.0))
    for name in COEFFICIENTS:
        assert getattr(got, name) == pytest.approx(getattr(true, name), rel=1e-6), name
    for method in ("guided", "lookup"):
        assert got.draft(method).round_s == pytest.approx(true.draft(method).round_s, rel=1e-6)
        assert got.draft(method).round_per_row_s == pytest.approx(true.draft(method).round_per_row_s, rel=1e-6)
