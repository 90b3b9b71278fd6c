"""The tau protocol (method §5, 8): the metrics from accept counts, the method registry, the
measurement loop end to end, and sharding over processes."""

import dataclasses
import json
import math
import os
import textwrap
from pathlib import Path

import pytest
import torch
from torchrun import ranks_and_reference

from spirelib.decoding.builders import BUILDERS, draft_factory
from spirelib.decoding.drafts import VanillaDraft
from spirelib.measure.intervals import t_quantile
from spirelib.measure.stopping import StoppingRule
from spirelib.measure.tau import AcceptCounts, DecodingProtocol, TauProtocol, measure_tau, summarize
from spirelib.model.config import ModelConfig
from spirelib.model.transformer import Transformer
from spirelib.throughput.methods import CARDS, KVBudget

CFG = ModelConfig(vocab_size=29, num_layers=2, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=64)
DRAFT = ModelConfig(vocab_size=29, num_layers=1, d_model=16, n_q_per_kv=2, n_kv=2, d_head=4, d_ff=32)


def model(cfg, seed):
    torch.manual_seed(seed)
    return Transformer(cfg).double().eval()


@pytest.mark.parametrize("dof, expected", [(1, 12.7062047), (4, 2.7764451), (9, 2.2621572), (30, 2.0422725), (10**6, 1.9599663)])
def test_t_quantile_matches_tables(dof, expected):
    assert t_quantile(0.975, dof) == pytest.approx(expected, abs=2e-6)


def test_a_tau_protocol_is_a_decoding_protocol_batched_and_both_refuse_what_cannot_decode():
    """TauProtocol's k, G and T are a DecodingProtocol's (what the wall clock's cells take too), checked
    as one checks them; its batch size is its own."""
    protocol = TauProtocol(k=3, new_tokens=16, temperature=0.7, batch_size=8, seed=2)
    assert protocol.decoding == DecodingProtocol(k=3, new_tokens=16, temperature=0.7)
    for bad in ({"k": 0}, {"new_tokens": 0}, {"temperature": -0.1}):
        with pytest.raises(ValueError, match="a decoding protocol needs k, new_tokens >= 1 and temperature >= 0"):
            DecodingProtocol(**bad)
        with pytest.raises(ValueError, match="a decoding protocol needs"):
            TauProtocol(**bad)
    with pytest.raises(ValueError, match="a tau protocol needs batch_size >= 1"):
        TauProtocol(batch_size=0)
    DecodingProtocol(temperature=0.0)  # greedy


def test_stats_from_hand_counted_rounds():
    k = 4
    accepted = torch.tensor([
        [4, 4, 0, 2, -1],  # 5 + 5 + 1 + 3 = 14 tokens in 4 rounds; the last round counts in full
        [1, 0, 3, 3, 4],  # 2 + 1 + 4 + 4 + 5 = 16 tokens in 5 rounds
    ])
    stats = AcceptCounts(accepted, k).stats()
    assert AcceptCounts(accepted, k).tau_per_context().tolist() == [14 / 4, 16 / 5]
    assert stats.mean == pytest.approx(30 / 9)  # pooled: all tokens over all rounds, not (3.5 + 3.2) / 2
    # delta method: d_i = Y_i - tau X_i = (14 - 4 * 30/9, 16 - 5 * 30/9) = (2/3, -2/3); s_d = sqrt(8/9); mean X = 4.5
    assert stats.std == pytest.approx(math.sqrt(8 / 9) / 4.5)
    assert stats.ci95 == pytest.approx(12.7062047 * stats.std / math.sqrt(2), rel=1e-6)
    assert stats.rounds == 9 and stats.n_contexts == 2
    assert stats.acceptance_rate == pytest.approx(21 / 36) == pytest.approx((stats.mean - 1) / k)
    # rounds with a >= j: j=1: 7 of 9; j=2: 6 of 7; j=3: 5 of 6; j=4: 3 of 5
    assert stats.accepted_at == (7, 6, 5, 3) and stats.reached == (9, 7, 6, 5)
    assert stats.per_position == pytest.approx((7 / 9, 6 / 7, 5 / 6, 3 / 5))


def sharp(seed):
    """A target whose distributions are far from uniform (weights of std 0.5, random norm gains)."""
    m = model(CFG, seed)
    m.reset_parameters(0.5)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
    return m


def test_iid_acceptance_recovers_alpha_and_the_closed_form_tau():
    """Rounds with i.i.d. acceptance alpha: per-position acceptance ~ alpha, and the CI of
    tau covers (1 - alpha^(k+1)) / (1 - alpha) (method §8)."""
    gen = torch.Generator().manual_seed(0)
    k, alpha, n, R = 4, 0.7, 400, 20
    accepted = (torch.rand(n, R, k, generator=gen) < alpha).long().cumprod(-1).sum(-1)  # (n, R)
    stats = AcceptCounts(accepted, k).stats()
    tau = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert abs(stats.mean - tau) < stats.ci95 < 0.1
    for p, reached in zip(stats.per_position, stats.reached):
        assert abs(p - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / reached)


def stopped_rows(alpha: float, n: int, k: int, G: int, seed: int) -> AcceptCounts:
    """n contexts under the engine's stopping rule: rounds of i.i.d. acceptance (draft j
    accepted with probability alpha while 1..j-1 were: a geometric count truncated at k),
    each emitting accepted + 1 tokens; a context stops after the round that brings it to G
    tokens (that round in full), then -1 (the layout of `Generation.accepted`)."""
    gen = torch.Generator().manual_seed(seed)
    accepted = (torch.rand(n, G, k, generator=gen) < alpha).long().cumprod(-1).sum(-1)  # (n, G): G rounds always suffice
    before = (accepted + 1).cumsum(1) - (accepted + 1)  # tokens a context had before each round
    return AcceptCounts(torch.where(before < G, accepted, -1), k)


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.85])
def test_tau_under_the_stopping_rule_covers_the_closed_form(alpha):
    """Issue 14: a context stops once it has G tokens, so a lucky context finishes in few
    rounds; the mean of per-context tau is then biased upwards (here by about 7 of its CI
    half-widths at 20,000 contexts), while tokens / rounds pooled over contexts is not
    (Wald's identity). The estimate must cover the closed form within its own 95% CI."""
    k, G, n = 4, 64, 20_000
    counts = stopped_rows(alpha, n, k, G, seed=int(alpha * 100))
    tokens = torch.where(counts.accepted >= 0, counts.accepted + 1, 0).sum(1)
    last = counts.accepted.gather(1, ((counts.accepted >= 0).sum(1) - 1)[:, None]).squeeze(1)
    assert (tokens >= G).all() and (tokens - last - 1 < G).all(), "every row stops at G tokens"
    stats = counts.stats()
    tau = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert stats.n_contexts == n and stats.ci95 < 0.01
    assert abs(stats.mean - tau) < stats.ci95, (stats.mean, stats.ci95, tau)
    mean_of_ratios = float(counts.tau_per_context().mean())
    assert mean_of_ratios - tau > 3 * stats.ci95, "the check has power: the old estimator is outside the CI"


def test_tau_ci_has_its_nominal_coverage_with_contexts_as_the_unit():
    """Many small repetitions of the stopped simulation: the 95% delta-method t-interval
    covers the closed form about 95% of the time (without the division by the mean round
    count, or over sqrt(rounds) instead of sqrt(contexts), it would not)."""
    k, G, n, reps, alpha = 4, 24, 60, 300, 0.7
    tau = (1 - alpha ** (k + 1)) / (1 - alpha)
    covered = sum(abs((s := stopped_rows(alpha, n, k, G, seed=10_000 + r).stats()).mean - tau) < s.ci95
                  for r in range(reps))
    assert 0.91 * reps <= covered <= 0.985 * reps, covered


def test_a_draft_identical_to_the_target_accepts_everything():
    """End to end: when q == p every draft is accepted, so tau = k + 1 exactly, for the
    vanilla path (a copy of the target as draft), MagicDec with a window covering everything,
    and a SPIRe draft that computes exactly the target (all its layers pruned, a window
    covering everything, no feedback: each layer reads its own input, as the target's does).
    The target's weights are far from uniform (std 0.5, random norm gains), so q == p is no
    coincidence of flat distributions: an unrelated draft of the same shape accepts far less."""
    from spirelib.model.config import SpireConfig
    from spirelib.model.spire import SpireDraftModel

    target, other = sharp(0), sharp(1)
    L, G, k = 9, 12, 3
    window = L + G + 2 * k
    contexts = {L: torch.randint(0, CFG.vocab_size, (5, L), generator=torch.Generator().manual_seed(1))}
    pruned_whole = SpireDraftModel.from_target(target, SpireConfig(num_layers=CFG.num_layers, window=window, k=k,
                                                                   feedback=False)).double().eval()
    methods = {"vanilla": draft_factory("vanilla", target, target, temperature=1.0),
               "magicdec": draft_factory("magicdec", target, temperature=1.0, budget=KVBudget(1, window)),
               "spire": draft_factory("spire", target, pruned_whole, temperature=1.0),
               "unrelated": draft_factory("vanilla", target, other, temperature=1.0)}
    stats = summarize(measure_tau(target, methods, contexts, TauProtocol(k=k, new_tokens=G, batch_size=2)).counts)
    assert stats["unrelated"][L].acceptance_rate < 0.5
    for name in ("vanilla", "magicdec", "spire"):
        s = stats[name][L]
        assert s.mean == k + 1 and s.acceptance_rate == 1.0 and s.n_contexts == 5, name
        assert s.per_position == (1.0,) * k and s.rounds == 5 * math.ceil(G / (k + 1))


def test_same_contexts_and_seed_give_the_same_result_and_every_context_gets_g_tokens():
    target, small = model(CFG, 0), model(DRAFT, 1)
    G, k = 10, 4
    contexts = {L: torch.randint(0, CFG.vocab_size, (5, L), generator=torch.Generator().manual_seed(L)) for L in (6, 11)}
    methods = {"vanilla": draft_factory("vanilla", target, small, temperature=1.0),
               "magicdec": draft_factory("magicdec", target, temperature=1.0, budget=KVBudget(1, 3))}
    protocol = TauProtocol(k=k, new_tokens=G, batch_size=2, seed=3)
    a, b = measure_tau(target, methods, contexts, protocol).counts, measure_tau(target, methods, contexts, protocol).counts
    for name in methods:
        for L in contexts:
            counts = a[name][L].accepted
            assert torch.equal(counts, b[name][L].accepted)
            assert counts.shape[0] == 5
            tokens = torch.where(counts >= 0, counts + 1, 0).sum(1)
            last = counts.gather(1, ((counts >= 0).sum(1) - 1)[:, None]).squeeze(1)
            assert (tokens >= G).all() and (tokens - last - 1 < G).all(), "a context stops once it has G tokens"
    other = measure_tau(target, methods, contexts, TauProtocol(k=k, new_tokens=G, batch_size=2, seed=4)).counts
    assert not torch.equal(other["vanilla"][6].accepted, a["vanilla"][6].accepted)


def test_a_method_stops_once_its_tau_is_resolved_and_the_others_go_on():
    """Under a stopping rule the target's own copy as a draft (tau = k + 1 on every context, no
    spread) stops at the first batch that reaches the floor, at each L; an unrelated draft (tau
    1.02-1.04, its first context above the rest: never resolved to 0.01) goes on to all n. A stopped method's counts are the first rows of a full run's (the
    same contexts and streams), the target's loss covers the longest-running method's contexts,
    and `summarize` reports the wider of the t half-width and the rule's. When every method
    resolves at once, the loss stops with them."""
    target, other = sharp(0), sharp(1)
    k, G, n = 3, 8, 7
    contexts = {L: torch.randint(0, CFG.vocab_size, (n, L), generator=torch.Generator().manual_seed(L)) for L in (9, 12)}
    continuations = {L: torch.randint(0, CFG.vocab_size, (n, 5), generator=torch.Generator().manual_seed(L + 50))
                     for L in contexts}
    methods = {"same": draft_factory("vanilla", target, target, temperature=1.0),
               "other": draft_factory("vanilla", target, other, temperature=1.0)}
    protocol = TauProtocol(k=k, new_tokens=G, batch_size=2, seed=1)
    full = measure_tau(target, methods, contexts, protocol, continuations=continuations)
    rule = StoppingRule(half_width=0.01, floor=3)
    stopped = measure_tau(target, methods, contexts, protocol, continuations=continuations, rule=rule)
    assert full.n_contexts == {"same": {9: n, 12: n}, "other": {9: n, 12: n}}
    assert stopped.n_contexts == {"same": {9: 4, 12: 4}, "other": {9: n, 12: n}}
    for name, by_l in stopped.counts.items():
        for L, c in by_l.items():
            rows, width = c.accepted.shape
            prefix = full.counts[name][L].accepted[:rows]
            assert rows == stopped.n_contexts[name][L]
            assert torch.equal(c.accepted, prefix[:, :width]) and (prefix[:, width:] == -1).all()
        assert torch.equal(stopped.losses[L], full.losses[L])
    stats = summarize(stopped.counts, rule)
    assert stats["same"][9].ci95 == 0.01 and stats["same"][9].mean == k + 1 and stats["same"][9].n_contexts == 4
    assert stats["other"][9].ci95 == summarize(full.counts)["other"][9].ci95 > 0.01
    every = measure_tau(target, methods, {9: contexts[9]}, protocol, continuations={9: continuations[9]},
                        rule=StoppingRule(half_width=100.0, floor=3))
    assert every.n_contexts == {"same": {9: 4}, "other": {9: 4}} and every.losses[9].shape == (4,)


def test_the_builder_table_rejects_bad_requests_and_any_draft_with_a_card_is_measured(monkeypatch):
    target, small = model(CFG, 0), model(DRAFT, 1)
    with pytest.raises(ValueError, match="unknown method"):
        draft_factory("medusa", target, temperature=1.0)
    with pytest.raises(ValueError, match="needs its trained draft model"):
        draft_factory("vanilla", target, temperature=1.0)
    with pytest.raises(ValueError, match="magicdec.*windw"):
        draft_factory("magicdec", target, temperature=1.0, windw=8)
    monkeypatch.setitem(CARDS, "test-greedy-draft", dataclasses.replace(CARDS["vanilla"], name="test-greedy-draft"))
    monkeypatch.setitem(BUILDERS, "test-greedy-draft", lambda t, m, *, temperature: VanillaDraft(m, 0.0))
    factory = draft_factory("test-greedy-draft", target, small, temperature=1.0)
    contexts = {7: torch.randint(0, CFG.vocab_size, (3, 7), generator=torch.Generator().manual_seed(2))}
    stats = summarize(measure_tau(target, {"test-greedy-draft": factory}, contexts, TauProtocol(new_tokens=6)).counts)
    assert 1 <= stats["test-greedy-draft"][7].mean <= 5


WORKER = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    from spirelib.model.config import ModelConfig
    from spirelib.model.transformer import Transformer
    from spirelib.decoding.builders import draft_factory
    from spirelib.measure.stopping import StoppingRule
    from spirelib.measure.tau import TauProtocol, measure_tau
    from spirelib.throughput.methods import KVBudget

    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    target = Transformer(ModelConfig(vocab_size=29, num_layers=2, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=64)).eval()
    torch.manual_seed(1)
    small = Transformer(ModelConfig(vocab_size=29, num_layers=1, d_model=16, n_q_per_kv=2, n_kv=2, d_head=4, d_ff=32)).eval()
    contexts = {L: torch.randint(0, 29, (7, L), generator=torch.Generator().manual_seed(L)) for L in (8, 13)}
    continuations = {L: torch.randint(0, 29, (7, 4), generator=torch.Generator().manual_seed(L + 50)) for L in contexts}
    methods = {"vanilla": draft_factory("vanilla", target, small, temperature=1.0),
               "magicdec": draft_factory("magicdec", target, temperature=1.0, budget=KVBudget(1, 4))}
    protocol = TauProtocol(k=3, new_tokens=9, batch_size=2, seed=5)
    counts = measure_tau(target, methods, contexts, protocol).counts
    out = {f"{m}/{L}": c.accepted.tolist() for m, by_l in counts.items() for L, c in by_l.items()}
    # under a stopping rule: the target as its own draft stops at the floor; at one L, a round of two
    # batches holds batches the rule then drops (every method of "floor" stops after batch 0)
    same = {**methods, "same": draft_factory("vanilla", target, target, temperature=1.0)}
    for run, L, rule in (("stop", 8, StoppingRule(0.5, 2)), ("floor", 13, StoppingRule(1e3, 2))):
        got = measure_tau(target, same, {L: contexts[L]}, protocol, continuations={L: continuations[L]}, rule=rule)
        out[run] = {"n": got.n_contexts, "loss": got.losses[L].tolist(),
                    "counts": {m: by_l[L].accepted.tolist() for m, by_l in got.counts.items()}}
    if not dist.is_initialized() or dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f)
    if dist.is_initialized():
        dist.barrier()  # no rank tears gloo down while the other is still in a collective
        dist.destroy_process_group()
        # Out without the interpreter's finalization: there gloo's worker threads, still holding
        # finished work with Python references, now and then abort a rank (SIGABRT, "terminate called
        # without an active exception") after everything it measured is written.
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(0)
""")


def test_sharding_over_two_processes_equals_one_process(tmp_path):
    """Two processes measure what one does: without a rule, and under a stopping rule (rounds of
    two batches, decided after gathering, later batches of a round dropped where the rule stops)."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    two, one = ranks_and_reference(script, [str(tmp_path / "two.json")], [str(tmp_path / "one.json")], env, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, two.stderr[-3000:]
    one, two = json.loads((tmp_path / "one.json").read_text()), json.loads((tmp_path / "two.json").read_text())
    assert one.keys() == {"vanilla/8", "vanilla/13", "magicdec/8", "magicdec/13", "stop", "floor"}
    assert all(len(v) == 7 for key, v in one.items() if "/" in key)
    assert one["stop"]["n"]["same"] == {"8": 2} and len(one["stop"]["loss"]) == max(
        n["8"] for n in one["stop"]["n"].values())
    assert one["floor"]["n"] == {m: {"13": 2} for m in ("vanilla", "magicdec", "same")} and len(one["floor"]["loss"]) == 2
    def rounds(rows):  # each context's accepted counts, without the -1 after it finished
        return [[a for a in row if a >= 0] for row in rows]

    for m in ("vanilla", "magicdec"):  # a stopped run decodes the first contexts of a full one, on the same streams
        stopped = rounds(one["stop"]["counts"][m])
        assert stopped == rounds(one[f"{m}/8"])[:len(stopped)]
    assert one == two


def test_spire_is_registered_and_measurable():
    from spirelib.model.config import SpireConfig
    from spirelib.model.spire import SpireDraftModel

    target = model(CFG, 0)
    spire = SpireDraftModel.from_target(target, SpireConfig(num_layers=1, window=4)).eval()
    contexts = {8: torch.randint(0, CFG.vocab_size, (3, 8), generator=torch.Generator().manual_seed(2))}
    counts = measure_tau(target, {"spire": draft_factory("spire", target, spire, temperature=1.0)}, contexts,
                         TauProtocol(k=3, new_tokens=7)).counts
    stats = counts["spire"][8].stats()
    assert stats.n_contexts == 3 and 1 <= stats.mean <= 4


def common_rows(alphas, n, k, G, seed):
    """`stopped_rows` for several acceptance rates from the same uniform draws (common random
    numbers: what measure_tau gives two drafts decoding the same batches)."""
    u = torch.rand(n, G, k, generator=torch.Generator().manual_seed(seed))
    out = []
    for alpha in alphas:
        accepted = (u < alpha).long().cumprod(-1).sum(-1)
        before = (accepted + 1).cumsum(1) - (accepted + 1)
        out.append(AcceptCounts(torch.where(before < G, accepted, -1), k))
    return out


def test_paired_delta_tau_covers_the_true_difference_and_is_sharper_than_unpaired():
    from spirelib.measure.tau import delta_tau

    k, G, n = 4, 64, 2000
    a, b = common_rows([0.72, 0.70], n, k, G, seed=1)
    d = delta_tau([a], [b])
    truth = (1 - 0.72 ** 5) / 0.28 - (1 - 0.70 ** 5) / 0.30
    assert abs(d.mean - truth) < d.ci95 and d.excludes_zero
    assert d.scope == "draft" and not d.resolved  # one seed: about these two drafts, never over training
    unpaired = math.hypot(a.stats().ci95, b.stats().ci95)
    assert d.ci95 < unpaired / 3, (d.ci95, unpaired)  # common random numbers pay off
    same = delta_tau([a], [a])
    assert same.mean == 0 and same.ci95 == 0 and not same.excludes_zero and not same.resolved


def test_delta_tau_over_seeds_adds_the_spread_between_seeds():
    from spirelib.measure.tau import delta_tau

    k, G, n = 4, 64, 500
    a0, b0 = common_rows([0.72, 0.70], n, k, G, seed=2)
    a1, b1 = common_rows([0.62, 0.70], n, k, G, seed=3)  # seed 1's variant came out much worse
    one = delta_tau([a0], [b0])
    both = delta_tau([a0, a1], [b0, b1])
    assert both.per_seed == pytest.approx((one.mean, delta_tau([a1], [b1]).mean))
    assert both.mean == pytest.approx(sum(both.per_seed) / 2)
    assert both.ci95 > 1.9 * abs(both.per_seed[0] - both.per_seed[1]) / 2 and not both.resolved
    with pytest.raises(ValueError, match="same contexts"):
        delta_tau([a0], [common_rows([0.7], n + 1, k, G, seed=4)[0]])
