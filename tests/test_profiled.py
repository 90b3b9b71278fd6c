"""The profiled cost model (issue 12, Part 2): its work accounting, its fit, its rounds."""

import dataclasses
import statistics

import pytest
import torch

from spirelib.engine.transformer import ModelConfig, Transformer
from spirelib.modeling import profiled
from spirelib.modeling.perfmodel import ModelShape, body_params

SHAPE = ModelShape(num_layers=2, d_model=16, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=32)


def test_forward_work_counts_body_attention_unembedding_and_kv_traffic():
    w = profiled.forward_work(SHAPE, 100, batch=3, new=2, keys=10, bytes_per_value=2)
    n = body_params(SHAPE)
    attention = 4 * 2 * 4 * 8 * (3 * 2) * 10  # layers x n_q x d_head per (token, key)
    assert w.flops == 2 * (n + 16 * 100) * 6 + attention
    assert w.bytes == (n + 16 * 100 + 2 * 2 * 2 * 8 * 3 * (10 + 2)) * 2
    assert w.layers == 2
    prefill = profiled.forward_work(SHAPE, 100, batch=3, new=2, keys=10, logits=False)
    assert w.flops - prefill.flops == 2 * 16 * 100 * 6


def test_fit_recovers_the_coefficients_it_was_made_with():
    true = profiled.ProfiledCost(fixed_s=2e-4, per_layer_s=5e-5, flops_per_s=1e11 / 4, bytes_per_s=1e10 / 2,
                                 per_token_layer_s=3e-7)
    big = ModelShape(num_layers=4, d_model=128, n_q_per_kv=1, n_kv=4, d_head=32, d_ff=512)
    works = [profiled.forward_work(s, 4096, B, T, S) for s in (SHAPE, big)
             for B in (1, 16, 64) for S in (64, 960) for T in (1, 5)]
    samples = [(w, true.seconds(w)) for w in works]
    book = [(n, 1e-4 + 2e-9 * n) for n in (5 * 4096, 80 * 4096, 320 * 4096)]
    draws = [(n, 3e-5 + 1e-9 * n) for n in (4096, 16 * 4096, 64 * 4096)]
    got = profiled.fit(samples, peak_flops=1e11, bandwidth=1e10, bookkeeping=book, sampling=draws)
    for name in ("fixed_s", "per_layer_s", "flops_per_s", "bytes_per_s", "per_token_layer_s"):
        assert getattr(got, name) == pytest.approx(getattr(true, name), rel=1e-6), name
    assert (got.bookkeeping_s, got.bookkeeping_per_logit_s) == (pytest.approx(1e-4), pytest.approx(2e-9))
    assert (got.sampling_s, got.sampling_per_logit_s) == (pytest.approx(3e-5), pytest.approx(1e-9))
    assert abs(profiled.relative_errors(got, samples)).max() < 1e-6


def test_a_round_is_the_drafts_passes_the_verification_and_the_bookkeeping():
    cost = profiled.ProfiledCost(1e-4, 1e-5, 1e11, 1e10, bookkeeping_s=3e-5, per_token_layer_s=1e-7)
    target = ModelShape(num_layers=4, d_model=16, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=32)
    verify = cost.seconds(profiled.forward_work(target, 100, 8, 5, 105))
    vanilla = profiled.DraftShape("vanilla", SHAPE)
    passes = cost.seconds(profiled.forward_work(SHAPE, 100, 8, 2, 100)) + 3 * cost.seconds(
        profiled.forward_work(SHAPE, 100, 8, 1, 100))
    assert profiled.round_seconds(cost, vanilla, target, 100, 8, 100, 4) == pytest.approx(passes + verify + 3e-5)
    sampled = profiled.ProfiledCost(1e-4, 1e-5, 1e11, 1e10, bookkeeping_s=3e-5, per_token_layer_s=1e-7, sampling_s=2e-5)
    assert profiled.round_seconds(sampled, vanilla, target, 100, 8, 100, 4) == pytest.approx(
        passes + verify + 3e-5 + 4 * 2e-5)  # one draw per draft pass
    magicdec = profiled.DraftShape("magicdec", None, keys=70)
    assert profiled.round_seconds(cost, magicdec, target, 100, 8, 100, 4) == pytest.approx(
        4 * cost.seconds(profiled.forward_work(target, 100, 8, 1, 70)) + verify + 3e-5)
    spire = profiled.DraftShape("spire", SHAPE, keys=70, memory_layers=2)
    plain = profiled.DraftShape("spire", SHAPE, keys=70)
    assert profiled.round_seconds(cost, spire, target, 100, 8, 100, 4) > profiled.round_seconds(
        cost, plain, target, 100, 8, 100, 4)
    s2, s3 = (profiled.speedup(cost, magicdec, tau, target, 100, 8, 100, 64, 4) for tau in (2.0, 3.0))
    assert s3 == pytest.approx(1.5 * s2)


def test_the_profiling_pass_times_real_forwards_and_the_fit_explains_them():
    from spirelib.engine.wallclock import profile

    torch.manual_seed(0)
    target = Transformer(ModelConfig(vocab_size=64, num_layers=2, d_model=32, n_q_per_kv=1, n_kv=2, d_head=16,
                                     d_ff=64)).eval()
    cost, samples = profile(target, peak_flops=1e11, bandwidth=1e10, batches=(1, 4), keys=(16, 64), news=(1, 3),
                            repeats=3)
    assert len(samples) == 8 and all(s > 0 for _, s in samples)
    assert cost.fixed_s + cost.per_layer_s > 0 and cost.bookkeeping_s + cost.bookkeeping_per_logit_s > 0
    assert cost.sampling_s + cost.sampling_per_logit_s > 0
    assert abs(profiled.relative_errors(cost, samples)).max() < 1.0  # timing noise, not a wrong model


def test_a_methods_fitted_overhead_is_recovered_and_priced_in_its_rounds():
    cost = profiled.ProfiledCost(1e-4, 1e-5, 1e11, 1e10, bookkeeping_s=3e-5, per_token_layer_s=1e-7, sampling_s=2e-5)
    target = ModelShape(num_layers=4, d_model=16, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=32)
    spire = profiled.DraftShape("spire", SHAPE, keys=70, memory_layers=2)
    true = profiled.DraftOverhead(pass_s=4e-5, pass_per_row_s=2e-6, accept_s=1e-4, accept_per_row_s=5e-6)
    calls = [(B, L, profiled.propose_seconds(cost, spire, target, 100, B, L, 4) + 4 * (4e-5 + 2e-6 * B),
              profiled.accept_seconds(cost, spire, target, B, 4) + 1e-4 + 5e-6 * B)
             for B in (1, 16, 64) for L in (64, 960)]
    got = profiled.fit_draft(cost, spire, target, 100, 4, calls)
    for name in ("pass_s", "pass_per_row_s", "accept_s", "accept_per_row_s"):
        assert getattr(got, name) == pytest.approx(getattr(true, name), rel=1e-6), name
    plain = profiled.round_seconds(cost, spire, target, 100, 8, 100, 4)
    fitted = profiled.round_seconds(dataclasses.replace(cost, drafts={"spire": got}), spire, target, 100, 8, 100, 4)
    assert fitted == pytest.approx(plain + 4 * (4e-5 + 2e-6 * 8) + 1e-4 + 5e-6 * 8)
    with pytest.raises(ValueError, match="at least 2"):
        profiled.fit_draft(cost, spire, target, 100, 4, calls[:1])


def test_the_profiling_pass_times_each_methods_own_propose_and_accept():
    from spirelib.engine.drafts import draft_factory, vanilla_draft_config
    from spirelib.engine.spire import SpireConfig, SpireDraftModel
    from spirelib.engine.wallclock import profile, profile_drafts

    torch.manual_seed(0)
    target = Transformer(ModelConfig(vocab_size=64, num_layers=2, d_model=32, n_q_per_kv=1, n_kv=2, d_head=16,
                                     d_ff=64)).eval()
    vanilla = Transformer(vanilla_draft_config(target.cfg)).eval()
    spire = SpireDraftModel.from_target(target, SpireConfig(num_layers=1, window=8, k=3)).eval()
    factories = {"vanilla": draft_factory("vanilla", target, vanilla, temperature=1.0),
                 "magicdec": draft_factory("magicdec", target, temperature=1.0, window=8),
                 "spire": draft_factory("spire", target, spire, temperature=1.0)}
    calls = profile_drafts(target, factories, batches=(1, 3), keys=(16, 40), k=3, repeats=2)
    assert {m: [(B, L) for B, L, _, _ in c] for m, c in calls.items()} == {
        m: [(1, 16), (1, 40), (3, 16), (3, 40)] for m in factories}
    assert all(p > 0 and a > 0 for c in calls.values() for _, _, p, a in c)
    shapes = {"vanilla": profiled.DraftShape("vanilla", vanilla.cfg.shape()),
              "magicdec": profiled.DraftShape("magicdec", None, keys=9),
              "spire": profiled.DraftShape("spire", spire.body.cfg.shape(), keys=9, memory_layers=1)}
    cost, _ = profile(target, {"vanilla": vanilla}, peak_flops=1e11, bandwidth=1e10, k=3, batches=(1, 3),
                      keys=(16, 40), news=(1, 4), repeats=2,
                      methods={m: (shapes[m], factories[m]) for m in factories})
    assert set(cost.drafts) == set(factories)
    for m, shape in shapes.items():  # the fitted overhead explains the timed proposes (up to timing noise)
        over = cost.draft(m)
        errors = [profiled.propose_seconds(cost, shape, target.cfg.shape(), 64, B, L, 3)
                  + 3 * (over.pass_s + over.pass_per_row_s * B) - p for B, L, p, _ in calls[m]]
        assert statistics.median(abs(e) / p for e, (_, _, p, _) in zip(errors, calls[m])) < 0.3, m


def test_dense_cache_forwards_read_whole_capacities():
    """AD reads its capacity L + G, every dense-cache forward of speculative decoding L + G + 2k;
    the sparse drafts read their sink + window."""
    cost = profiled.ProfiledCost(1e-4, 1e-5, 1e11, 1e10, per_token_layer_s=1e-7)
    target = ModelShape(num_layers=4, d_model=16, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=32)
    vanilla, magicdec = profiled.DraftShape("vanilla", SHAPE), profiled.DraftShape("magicdec", None, keys=70)
    for draft in (vanilla, magicdec):
        static = profiled.speedup(cost, draft, 3.0, target, 100, 64, 500, 64, 4)
        ad = profiled.ad_step_seconds(cost, target, 100, 64, 564)
        rounds = profiled.round_seconds(cost, draft, target, 100, 64, 532, 4, dense_keys=572)
        assert static == pytest.approx(3.0 * ad / rounds)
        positions_seen = 3.0 * profiled.ad_step_seconds(cost, target, 100, 64, 532) / profiled.round_seconds(
            cost, draft, target, 100, 64, 532, 4)
        assert static != pytest.approx(positions_seen)
    assert profiled.propose_seconds(cost, magicdec, target, 100, 64, 532, 4, dense_keys=572) == pytest.approx(
        profiled.propose_seconds(cost, magicdec, target, 100, 64, 532, 4))
    assert profiled.propose_seconds(cost, vanilla, target, 100, 64, 532, 4, dense_keys=572) > profiled.propose_seconds(
        cost, vanilla, target, 100, 64, 532, 4)
