"""The throughput model (method §2): every number the spec states, a plain reference, invariants."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spirelib import cli
from spirelib.throughput import perfmodel as pm
from spirelib.throughput.perfmodel import (
    PAPER_ABLATION_TAU,
    PAPER_DRAFTS,
    PAPER_TAU,
    PRESETS,
    LengthDistribution,
    ModelShape,
    RequestLengths,
    body_params,
    iteration_time_multiplier,
    klen,
    throughput_multiplier,
    throughput_multiplier_over_generation,
)

TAU = PAPER_TAU[512]


def tm(method, B, L, target="seqax-67m", **kw):
    draft = PAPER_DRAFTS[target].get(method)
    return throughput_multiplier(method, TAU[method], B, L, target, draft, **kw)


def reference_times(method, B, L, draft_len, target, draft, k=4, hoi=600.0, overlap=True, score_read=1.0):
    """Method §2's table transcribed with Python scalars: (t_target, t_verify) at context L and
    t_draft with a draft cache of draft_len tokens per request."""
    def n(m):
        return m.num_layers * (2 * m.d_model + (m.n_q_per_kv + 2) * m.n_kv * m.d_model * m.d_head
                               + m.n_q_per_kv * m.n_kv * m.d_head * m.d_model + 3 * m.d_model * m.d_ff)

    def kvb(m):
        return 2 * m.num_layers * m.n_kv * m.d_head

    def f(c, m):
        return max(c, m) if overlap else c + m

    kv_t = B * L * kvb(target)
    c_t = 2 * n(target) * B
    t_target = f(c_t, (n(target) + kv_t) * hoi)
    t_verify = f((k + 1) * c_t, (n(target) + kv_t) * hoi)
    if method == "guided":  # the verification's k + 1 queries scored against every key, the keys read again
        score = 2 * (k + 1) * B * L * target.num_layers * target.n_q_per_kv * target.n_kv * target.d_head
        t_verify = f((k + 1) * c_t + score, (n(target) + kv_t + score_read * kv_t / 2) * hoi)
    if method == "lookup":
        return t_target, t_verify, 0.0
    if method == "vanilla":
        nd, kvd, cd = n(draft), B * draft_len * kvb(draft), 2 * n(draft) * B
    elif method in ("magicdec", "guided"):
        nd, kvd, cd = n(target), B * draft_len * kvb(target), 2 * n(target) * B
    elif method == "one_pass":  # all k positions in one pass, charged as k equal shares of it
        return t_target, t_verify, f(k * 2 * n(draft) * B, (n(draft) + B * draft_len * kvb(draft)) * hoi) / k
    else:
        extra = 2 * (2 * draft.num_layers * draft.n_kv * draft.d_model * draft.d_head) * B
        nd, kvd, cd = n(draft), B * draft_len * kvb(draft), 2 * n(draft) * B + extra
    return t_target, t_verify, f(cd, (nd + kvd) * hoi)


def reference_klen(method, L, window_factor=8):
    # a cache holds no more tokens than exist: the cap binds only for window_factor 1 (sink 1)
    return L if method == "vanilla" or window_factor is None else min(L, 1 + L // window_factor)


def reference_dt(method, B, L, target, draft, k=4, hoi=600.0, overlap=True, window_factor=8, score_read=1.0):
    """dt for one (B, L) cell, from the scalar reference."""
    t_target, t_verify, t_draft = reference_times(method, B, L, reference_klen(method, L, window_factor), target,
                                                  draft, k, hoi, overlap, score_read)
    return (k * t_draft + t_verify) / t_target


def reference_over_generation(method, tau, B, L, G, target, draft, k=4):
    """The G-aware variant of method §2, written as the loops it describes."""
    cap = float("inf") if method == "vanilla" else reference_klen(method, L)  # sparse: fixed by the initial L
    ad = sum(reference_times(method, B, L + g, 0, target, draft, k)[0] for g in range(G))
    sd, i = 0.0, 0.0
    while i < G:
        sd += sum(reference_times(method, B, L + i, min(L + i + j, cap), target, draft, k)[2] for j in range(k))
        sd += reference_times(method, B, L + i, 0, target, draft, k)[1]
        i += tau
    return ad / sd


# --- the spec's numbers -------------------------------------------------------------------


@pytest.mark.parametrize("name, expected", [
    ("seqax-67m", 67_117_056), ("vanilla-draft", 8_390_656), ("spire-draft", 16_779_264),
    ("llama3-70b", 68_452_352_000), ("llama3-8b", 6_979_584_000), ("spire-draft-70b", 17_113_088_000),
])
def test_body_params_of_every_preset(name, expected):
    assert body_params(PRESETS[name]) == body_params(name) == expected
    assert isinstance(body_params(PRESETS[name]), int)


def test_headline_at_batch_64_context_512():
    got = {m: round(tm(m, 64, 512), 2) for m in pm.MODELED_METHODS}
    assert got == {"spire": 2.78, "magicdec": 2.05, "vanilla": 1.36}


def test_llama3_70b_extrapolation_at_batch_64_context_65536():
    assert round(tm("spire", 64, 65536, "llama3-70b"), 2) == 2.82
    assert round(tm("magicdec", 64, 65536, "llama3-70b"), 2) == 2.14


def test_spire_without_sparse_kv_is_1_70_at_every_context():
    L = 2 ** np.arange(3, 21)
    got = throughput_multiplier("spire", PAPER_ABLATION_TAU["no_sparse_kv"], 64, L, "seqax-67m", "spire-draft",
                                window_factor=None)
    assert np.all(np.round(got, 2) == 1.70)
    assert np.ptp(got) < 1e-12  # memory-bound everywhere: exactly flat


# --- agreement with the plain reference ---------------------------------------------------

GRID_B = 2 ** np.arange(0, 8)
GRID_L = 2 ** np.arange(5, 14)


@pytest.mark.parametrize("method", pm.MODELED_METHODS)
@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("window_factor", [8, None])
def test_vectorized_grid_equals_scalar_reference(method, overlap, window_factor):
    target = PRESETS["seqax-67m"]
    draft = PRESETS[PAPER_DRAFTS["seqax-67m"].get(method, "spire-draft")]
    grid = iteration_time_multiplier(method, GRID_B[:, None], GRID_L[None, :], target, draft, overlap=overlap,
                                     window_factor=window_factor)
    assert grid.shape == (8, 9)
    for i, B in enumerate(GRID_B):
        for j, L in enumerate(GRID_L):
            scalar = iteration_time_multiplier(method, int(B), int(L), target, draft, overlap=overlap,
                                               window_factor=window_factor)
            assert isinstance(scalar, float)
            assert scalar == grid[i, j]
            ref = reference_dt(method, int(B), int(L), target, draft, overlap=overlap, window_factor=window_factor)
            assert scalar == pytest.approx(ref, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(method=st.sampled_from(pm.MODELED_METHODS), B=st.integers(1, 4096), L=st.integers(1, 2**20),
       overlap=st.booleans(), window_factor=st.sampled_from([None, 1, 3, 8, 64]), hoi=st.floats(1.0, 5000.0))
def test_any_cell_equals_the_scalar_reference(method, B, L, overlap, window_factor, hoi):
    target = PRESETS["seqax-67m"]
    draft = PRESETS[PAPER_DRAFTS["seqax-67m"].get(method, "spire-draft")]
    got = iteration_time_multiplier(method, B, L, target, draft, overlap=overlap, window_factor=window_factor, hoi=hoi)
    ref = reference_dt(method, B, L, target, draft, overlap=overlap, window_factor=window_factor, hoi=hoi)
    assert got == pytest.approx(ref, rel=1e-12)


# --- properties -----------------------------------------------------------------------------


def test_sparse_drafts_gain_with_batch_at_long_context_while_vanilla_loses():
    B = 2 ** np.arange(0, 8)
    for method in ("spire", "magicdec"):
        assert np.all(np.diff(tm(method, B, 8192)) > 0), method
    assert np.all(np.diff(tm("vanilla", B, 8192)) < 0)


def test_spire_beats_magicdec_beats_vanilla_at_the_headline_cell():
    assert tm("spire", 64, 512) > tm("magicdec", 64, 512) > tm("vanilla", 64, 512) > 1


methods = st.sampled_from(pm.MODELED_METHODS)
batches = st.integers(1, 4096)
contexts = st.integers(1, 2**20)


@settings(max_examples=150, deadline=None)
@given(method=methods, B=batches, L=contexts, hoi=st.floats(1.0, 5000.0), overlap=st.booleans())
def test_a_round_always_costs_more_than_one_target_step(method, B, L, hoi, overlap):
    dt = iteration_time_multiplier(method, B, L, "seqax-67m", PAPER_DRAFTS["seqax-67m"].get(method), hoi=hoi,
                                   overlap=overlap)
    assert dt > 1  # so TM < tau: speculation never beats its own acceptance


@settings(max_examples=150, deadline=None)
@given(method=st.sampled_from(["spire", "magicdec"]), B=batches, L=contexts, wf=st.integers(1, 64))
def test_a_sparse_cache_never_costs_throughput(method, B, L, wf):
    sparse = tm(method, B, L, window_factor=wf)
    assert sparse >= tm(method, B, L, window_factor=None)
    assert tm(method, B, L, window_factor=wf + 1) >= sparse


@settings(max_examples=100, deadline=None)
@given(method=methods, B=batches, L=contexts, scale=st.sampled_from([0.5, 2.0, 4.0]))
def test_bytes_per_value_trade_exactly_against_hoi(method, B, L, scale):
    wide = tm(method, B, L, hoi=600.0 / scale, bytes_per_weight=scale, bytes_per_kv=scale)
    assert wide == pytest.approx(tm(method, B, L), rel=1e-12)


def test_throughput_is_linear_in_tau():
    taus = np.array([1.0, 2.0, 3.401, 5.0])
    got = throughput_multiplier("spire", taus, 64, 512, "seqax-67m", "spire-draft")
    assert np.allclose(got / taus, 1 / iteration_time_multiplier("spire", 64, 512, "seqax-67m", "spire-draft"))


def test_scalars_give_floats_and_broadcast_shapes_follow_numpy():
    assert isinstance(tm("spire", 64, 512), float)
    assert tm("spire", np.array([1, 2]), 512).shape == (2,)
    assert tm("spire", np.ones((3, 1)), np.ones((1, 4)) * 64).shape == (3, 4)


def test_presets_accept_names_or_shapes():
    shape = ModelShape(2, 512, 1, 8, 128, 4096)
    assert tm("spire", 64, 512) == throughput_multiplier("spire", 3.401, 64, 512, PRESETS["seqax-67m"], shape)


# --- sparse cache length ---------------------------------------------------------------------


def test_klen_is_sink_plus_l_over_window_factor_and_never_above_l():
    assert klen(512) == 65
    assert klen(519) == 65  # floor division: 519 // 8 = 64
    assert klen(8192) == 1025
    assert klen(512, window=64) == 65
    assert klen(40, window=64) == 40
    assert klen(512, window_factor=None) == 512
    assert klen(3, sink_size=4) == 3
    assert list(klen(np.array([8, 16, 4096]))) == [2, 3, 513]


def test_fixed_window_matches_window_factor_where_they_coincide():
    # L / 8 = 64 at L = 512: the trained 64-token window and the modeled L/8 window agree
    assert tm("spire", 64, 512, window=64) == tm("spire", 64, 512)
    assert tm("spire", 64, 8192, window=64) > tm("spire", 64, 8192)  # fixed window stays small


# --- G-aware variant --------------------------------------------------------------------------


def test_g_aware_variant_is_close_to_the_main_model_at_g_64():
    for method in pm.MODELED_METHODS:
        draft = PAPER_DRAFTS["seqax-67m"].get(method)
        g = throughput_multiplier_over_generation(method, TAU[method], 64, 512, 64, "seqax-67m", draft)
        assert g == pytest.approx(tm(method, 64, 512), rel=0.05), method


@pytest.mark.parametrize("method", pm.MODELED_METHODS)
@pytest.mark.parametrize("L, G", [(8, 64), (512, 64), (4096, 7)])
def test_g_aware_variant_equals_its_loop_reference(method, L, G):
    target = PRESETS["seqax-67m"]
    draft = PRESETS[PAPER_DRAFTS["seqax-67m"].get(method, "spire-draft")]
    got = throughput_multiplier_over_generation(method, TAU[method], 16, L, G, target, draft)
    assert got == pytest.approx(reference_over_generation(method, TAU[method], 16, L, G, target, draft), rel=1e-12)


def test_g_aware_single_round_of_a_capped_draft_is_one_over_dt():
    # G = 1: one round, one needed token; MagicDec's sparse cache is capped, so drafts cost as at L
    g = throughput_multiplier_over_generation("magicdec", 3.891, 64, 512, 1, "seqax-67m")
    assert g == pytest.approx(1 / iteration_time_multiplier("magicdec", 64, 512, "seqax-67m"), rel=1e-12)


def test_g_aware_tends_to_the_main_model_when_context_dwarfs_generation():
    # tau divides G (no partial last round) and L >> G: KV growth is negligible
    for method in pm.MODELED_METHODS:
        draft = PAPER_DRAFTS["seqax-67m"].get(method)
        g = throughput_multiplier_over_generation(method, 4.0, 64, 2**22, 64, "seqax-67m", draft)
        main = throughput_multiplier(method, 4.0, 64, 2**22, "seqax-67m", draft)
        assert g == pytest.approx(main, rel=1e-4), method


def test_g_aware_broadcasts_like_the_main_model():
    grid = throughput_multiplier_over_generation("spire", 3.401, GRID_B[:, None], GRID_L[None, :], 16,
                                                 "seqax-67m", "spire-draft")
    assert grid.shape == (8, 9)
    assert grid[6, 4] == throughput_multiplier_over_generation("spire", 3.401, 64, 512, 16, "seqax-67m",
                                                               "spire-draft")


# --- mixed-length batches -----------------------------------------------------------------------


def test_each_request_is_capped_at_its_own_window():
    # lengths 8 and 4096 with a 64-token window: the draft holds 8 + (1 + 64) tokens, the target 4104
    target, draft = PRESETS["seqax-67m"], PRESETS["spire-draft"]
    got = iteration_time_multiplier("spire", 2, RequestLengths(np.array([8, 4096])), target, draft, window=64)
    t_target, t_verify, t_draft = reference_times("spire", 2, 4104 / 2, 73 / 2, target, draft)
    assert got == pytest.approx((4 * t_draft + t_verify) / t_target, rel=1e-12)


def test_equal_per_request_lengths_are_a_uniform_batch():
    for method in pm.MODELED_METHODS:
        mixed = tm(method, 64, RequestLengths(np.full(64, 512)))
        assert mixed == pytest.approx(tm(method, 64, 512), rel=1e-12)
        assert tm(method, 64, LengthDistribution(512, spread=0.0)) == pytest.approx(mixed, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 100_000), min_size=1, max_size=64))
def test_dense_costs_depend_only_on_the_total_context(lengths):
    lengths = np.array(lengths)
    mixed = tm("vanilla", len(lengths), RequestLengths(lengths))
    assert mixed == pytest.approx(tm("vanilla", len(lengths), lengths.mean()), rel=1e-9)
    shuffled = RequestLengths(np.random.default_rng(0).permutation(lengths))
    assert tm("spire", len(lengths), shuffled) == pytest.approx(tm("spire", len(lengths), RequestLengths(lengths)))


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 4096), min_size=2, max_size=64), method=st.sampled_from(["spire", "magicdec"]))
def test_a_fixed_window_caps_each_request_so_mixing_never_hurts(lengths, method):
    lengths = np.array(lengths)
    mixed = tm(method, len(lengths), RequestLengths(lengths), window=64)
    assert mixed >= tm(method, len(lengths), lengths.mean(), window=64) * (1 - 1e-12)  # Jensen: min is concave


def test_a_length_distribution_broadcasts_over_batch_sizes_by_prefix():
    dist = LengthDistribution(1024, spread=1.5, seed=3)
    B = np.array([1, 8, 64])
    got = tm("spire", B, dist)
    for i, b in enumerate(B):
        assert got[i] == pytest.approx(tm("spire", int(b), RequestLengths(dist.sample(int(b)).lengths)), rel=1e-12)


def test_length_distributions_keep_their_mean_and_seed():
    for kind, spread in (("lognormal", 1.0), ("uniform", 0.9)):
        dist = LengthDistribution(2048, spread=spread, kind=kind, seed=7)
        sample = dist.sample(200_000).lengths
        assert sample.mean() == pytest.approx(2048, rel=0.02)
        assert np.array_equal(dist.sample(10).lengths, sample[:10])


def test_g_aware_with_per_request_lengths_matches_uniform_when_equal():
    g_mixed = throughput_multiplier_over_generation("spire", 3.401, 8, RequestLengths(np.full(8, 512)), 16,
                                                    "seqax-67m", "spire-draft")
    g_uniform = throughput_multiplier_over_generation("spire", 3.401, 8, 512, 16, "seqax-67m", "spire-draft")
    assert g_mixed == pytest.approx(g_uniform, rel=1e-12)


# --- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, name", [
    (dict(method="eagle"), "method"),
    (dict(method="spire", draft=None), "draft"),
    (dict(method="vanilla", draft=None), "draft"),
    (dict(B=0), "B"),
    (dict(B=np.array([4, -1])), "B"),
    (dict(L=0), "L"),
    (dict(k=0), "k"),
    (dict(k=2.5), "k"),
    (dict(tau=0.0), "tau"),
    (dict(tau=5.5), "tau"),
    (dict(hoi=0.0), "hoi"),
    (dict(hoi=-600.0), "hoi"),
    (dict(target="llama4"), "target"),
    (dict(window_factor=0), "window_factor"),
    (dict(bytes_per_kv=0), "bytes_per_kv"),
    (dict(L=RequestLengths(np.full(8, 512))), "B"),
])
def test_bad_arguments_raise_value_errors_that_name_them(kwargs, name):
    args = dict(method="spire", tau=3.401, B=64, L=512, target="seqax-67m", draft="spire-draft")
    args.update(kwargs)
    method, tau, B, L, target, draft = (args.pop(a) for a in ("method", "tau", "B", "L", "target", "draft"))
    with pytest.raises(ValueError, match=name):
        throughput_multiplier(method, tau, B, L, target, draft, **args)


def test_g_aware_rejects_bad_generation_length():
    with pytest.raises(ValueError, match="G"):
        throughput_multiplier_over_generation("spire", 3.401, 64, 512, 0, "seqax-67m", "spire-draft")


def test_model_shapes_and_lengths_validate():
    with pytest.raises(ValueError, match="d_ff"):
        ModelShape(2, 512, 1, 8, 128, 0)
    with pytest.raises(ValueError, match="L"):
        RequestLengths(np.array([512, 0]))
    with pytest.raises(ValueError, match="spread"):
        LengthDistribution(512, spread=1.5, kind="uniform")


def test_benchmark_runs(capsys):
    assert cli.main(["bench", "perfmodel", "--repeat", "1"]) == 0
    assert "256 x 256" in capsys.readouterr().out


def test_the_model_imports_without_torch():
    code = ("import sys; import spirelib.throughput.perfmodel, spirelib.throughput.acceptance, spirelib.throughput.costs, spirelib.throughput.hardware; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_mixed_and_uniform_compare_a_batch_with_its_mean_length_batch():
    spread = pm.LengthDistribution(512, 1.0, seed=0).sample(64)
    mixed, uniform = pm.mixed_and_uniform("spire", 3.0, 64, spread, "seqax-67m", "spire-draft", window=64)
    mean = float(spread.lengths.mean())
    assert uniform == pytest.approx(float(pm.throughput_multiplier("spire", 3.0, 64, mean, "seqax-67m", "spire-draft",
                                                                   window=64)))
    assert mixed == pytest.approx(float(pm.throughput_multiplier("spire", 3.0, 64, spread, "seqax-67m", "spire-draft",
                                                                 window=64)))
    assert mixed != pytest.approx(uniform)
    flat = pm.LengthDistribution(512, 0.0, seed=0).sample(64)
    assert pm.mixed_and_uniform("magicdec", 3.0, 64, flat, "seqax-67m")[0] == pytest.approx(
        pm.mixed_and_uniform("magicdec", 3.0, 64, flat, "seqax-67m")[1])


def test_best_method_is_the_argmax_over_methods_per_cell():
    grids = {"a": np.array([[1.0, 3.0]]), "b": np.array([[2.0, 1.0]])}
    assert pm.best_method(grids).tolist() == [["b", "a"]]
    assert pm.best_method(grids, baseline=2.5).tolist() == [["ad", "a"]]  # no draft beats AD in the first cell


# --- beyond the paper's three: the guided self-draft, prompt lookup, a one-pass drafter ----


@pytest.mark.parametrize("method, draft", [("guided", None), ("lookup", None), ("one_pass", "spire-draft")])
@pytest.mark.parametrize("B, L", [(1, 32), (16, 512), (64, 2048), (256, 8192)])
@pytest.mark.parametrize("overlap, score_read", [(True, 1.0), (False, 1.0), (True, 0.0)])
def test_the_methods_beyond_the_paper_equal_their_scalar_reference(method, draft, B, L, overlap, score_read):
    target = PRESETS["seqax-67m"]
    got = iteration_time_multiplier(method, B, L, "seqax-67m", draft, overlap=overlap, score_read=score_read)
    want = reference_dt(method, B, L, target, PRESETS.get(draft), overlap=overlap, score_read=score_read)
    assert got == pytest.approx(want, rel=1e-12)


def test_what_the_methods_beyond_the_paper_cost_against_the_papers():
    """Prompt lookup costs one verification a round; the guided draft costs MagicDec's draft plus its
    scoring, nothing more where the scores come free; a one-pass drafter's k positions cost about
    one pass of SPIRe's (weights and KV read once)."""
    B, L = 64, 512
    dt = {m: iteration_time_multiplier(m, B, L, "seqax-67m", None if m in pm.SELF_DRAFTS else "spire-draft")
          for m in pm.METHODS}
    t_target, t_verify, _ = reference_times("magicdec", B, L, 0, PRESETS["seqax-67m"], None)
    assert dt["lookup"] == pytest.approx(t_verify / t_target)
    free = iteration_time_multiplier("guided", B, L, "seqax-67m", score_read=0.0)
    assert dt["magicdec"] <= free < dt["guided"]
    assert dt["one_pass"] < dt["spire"] and dt["one_pass"] > dt["lookup"]
    with pytest.raises(ValueError, match="score_read"):
        iteration_time_multiplier("guided", B, L, "seqax-67m", score_read=1.5)
    with pytest.raises(ValueError, match="needs a draft"):
        iteration_time_multiplier("one_pass", B, L, "seqax-67m")
