"""Speculative decoding is exactly lossless: statistical tests of rejection sampling and of the
whole engine, and token-for-token equality with greedy autoregressive decoding."""

import math

import pytest
import torch

from spirelib.decoding.builders import draft_factory
from spirelib.decoding.drafts import MagicDecDraft, VanillaDraft
from spirelib.decoding.sampling import rejection_sample, sample, uniform_width
from spirelib.decoding.speculative import autoregressive_generate, speculative_generate
from spirelib.model.config import ModelConfig
from spirelib.model.transformer import Transformer
from spirelib.throughput.methods import BUDGETED, KVBudget, card


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square goodness of fit (cells with expected count < 5 merged into one)."""
    n = counts.sum()
    expected = probs.double() * n
    small = expected < 5
    obs = torch.cat([counts[~small].double(), counts[small].double().sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    obs, exp = obs[exp > 0], exp[exp > 0]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = len(obs) - 1
    # Survival function of chi-square via the regularized upper incomplete gamma.
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0, dtype=torch.float64)))


def uniforms(gen, *shape, V):
    """Uniforms (*shape, W) for a draw over V tokens (`sampling.uniform_width`) or up to 8 acceptances."""
    return torch.rand(*shape, max(uniform_width(V), 8), generator=gen)


def random_dists(rows, k, V, gen, sharp=2.0):
    return torch.softmax(sharp * torch.randn(rows, k, V, generator=gen, dtype=torch.float64), -1).float()


def emitted_first_two(sampler, p, q, gen, n):
    """Sample n rounds for fixed (p, q); return the first emitted token and, for rounds that
    accepted the first draft, the second emitted token."""
    P, Q = p.expand(n, -1, -1), q.expand(n, -1, -1)
    V = p.shape[-1]
    drafts = sample(Q, uniforms(gen, *Q.shape[:2], V=V))  # (n, k)
    n_acc, nxt = sampler(drafts, Q, P, uniforms(gen, n, 2, V=V))
    first = torch.where(n_acc >= 1, drafts[:, 0], nxt)
    second = torch.where(n_acc >= 2, drafts[:, 1], nxt)[n_acc >= 1]
    return first, second


def naive_rejection_sample(drafts, q, p, u):
    """Rejection without the correction step: resample from p at the first rejection (biased)."""
    B, k = drafts.shape
    ratio = p[:, :k].gather(2, drafts[..., None]).squeeze(-1) / q.gather(2, drafts[..., None]).squeeze(-1)
    n_acc = (u[:, 0, :k] < ratio).long().cumprod(1).sum(1)
    return n_acc, sample(p[torch.arange(B), n_acc], u[:, 1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rejection_sampling_reproduces_the_target_distribution(seed):
    gen = torch.Generator().manual_seed(seed)
    V, k, n = 12, 3, 60_000
    p, q = random_dists(1, k + 1, V, gen), random_dists(1, k, V, gen)
    first, second = emitted_first_two(rejection_sample, p, q, gen, n)
    assert chi_square_pvalue(torch.bincount(first, minlength=V), p[0, 0]) > 1e-3
    assert chi_square_pvalue(torch.bincount(second, minlength=V), p[0, 1]) > 1e-3


def test_the_chi_square_check_catches_a_missing_correction_step():
    gen = torch.Generator().manual_seed(0)
    V, k, n = 12, 3, 60_000
    p, q = random_dists(1, k + 1, V, gen), random_dists(1, k, V, gen)
    first, _ = emitted_first_two(naive_rejection_sample, p, q, gen, n)
    assert chi_square_pvalue(torch.bincount(first, minlength=V), p[0, 0]) < 1e-6


def test_greedy_rejection_accepts_exactly_the_argmax_prefix():
    V = 7
    target = torch.nn.functional.one_hot(torch.tensor([[3, 1, 4, 5]]), V).float()  # (1, k+1, V)
    drafts = torch.tensor([[3, 1, 2]])
    q = torch.nn.functional.one_hot(drafts, V).float()
    u = uniforms(torch.Generator().manual_seed(0), 1, 2, V=V)
    n_acc, nxt = rejection_sample(drafts, q, target, u)
    assert n_acc.tolist() == [2] and nxt.tolist() == [4]
    n_acc, nxt = rejection_sample(torch.tensor([[3, 1, 4]]), torch.nn.functional.one_hot(torch.tensor([[3, 1, 4]]), V).float(),
                                  target, u)
    assert n_acc.tolist() == [3] and nxt.tolist() == [5]  # bonus token


CFG = ModelConfig(vocab_size=23, num_layers=2, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=64)


def peaky_model(cfg=CFG, seed=0, std=0.3):
    """A random model in float64 with confident predictions: argmax ties between a one-token
    and a multi-token forward are then impossible in practice."""
    torch.manual_seed(seed)
    model = Transformer(cfg).double().eval()
    model.reset_parameters(std)
    return model


def perturbed(model, scale, seed):
    """A draft that agrees with the target often but not always (ragged acceptance)."""
    torch.manual_seed(seed)
    copy = Transformer(model.cfg).double().eval()
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(scale * torch.randn_like(p) * p.std())
    return copy


def drafts_for(target):
    small = ModelConfig(vocab_size=CFG.vocab_size, num_layers=1, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8, d_ff=32)
    return {
        "vanilla-perturbed": lambda t: VanillaDraft(perturbed(target, 0.3, 1), temperature=t),
        "vanilla-small": lambda t: VanillaDraft(peaky_model(small, 5), temperature=t),
        "magicdec": lambda t: MagicDecDraft(target, KVBudget(1, 6), rope_mode="cache", temperature=t),
        "magicdec-original": lambda t: MagicDecDraft(target, KVBudget(2, 5), rope_mode="original", temperature=t),
        **{m: lambda t, m=m: budgeted(m, target, t, 7) for m in OTHER_BUDGETED},
    }


def budgeted(method: str, target, temperature: float, entries: int):
    """A budgeted self-draft (`methods.BUDGETED`) over `entries` keys with a sink of 1, as its card spends them."""
    return draft_factory(method, target, temperature=temperature, budget=card(method).budget(entries, 1))()


OTHER_BUDGETED = [m for m in BUDGETED if m != "magicdec"]  # the guided draft, and any new one


@pytest.mark.parametrize("name", ["vanilla-perturbed", "vanilla-small", "magicdec", "magicdec-original",
                                  *OTHER_BUDGETED])
def test_greedy_speculative_equals_greedy_autoregressive(name):
    target = peaky_model()
    B, L, G = 5, 14, 25
    contexts = torch.randint(0, CFG.vocab_size, (B, L), generator=torch.Generator().manual_seed(3))
    lengths = torch.tensor([14, 9, 12, 2, 14])  # ragged contexts, right-padded
    ad = autoregressive_generate(target, contexts, G, temperature=0.0, lengths=lengths)
    sd = speculative_generate(target, drafts_for(target)[name](0.0), contexts, G, k=4, temperature=0.0, lengths=lengths)
    assert torch.equal(sd.tokens, ad.tokens)
    accepted = sd.accepted[sd.accepted >= 0]
    assert accepted.min() < 4 and accepted.max() > 0, "the test needs ragged acceptance"


def test_rows_stop_independently_and_accept_counts_add_up():
    target = peaky_model()
    B, L, G, k = 6, 8, 17, 3
    contexts = torch.randint(0, CFG.vocab_size, (B, L), generator=torch.Generator().manual_seed(4))
    gen = torch.Generator().manual_seed(0)
    sd = speculative_generate(target, VanillaDraft(perturbed(target, 0.5, 2), temperature=1.0), contexts, G,
                              k=k, temperature=1.0, generator=gen)
    assert sd.tokens.shape == (B, G)
    for row in sd.accepted:
        done = row[row >= 0]
        assert (row[len(done):] == -1).all(), "a finished row stays finished"
        assert int((done + 1).sum()) >= G > int((done[:-1] + 1).sum()), "a row stops once it has G tokens"


def test_end_of_text_stops_a_row():
    target = peaky_model()
    contexts = torch.randint(0, CFG.vocab_size, (3, 6), generator=torch.Generator().manual_seed(5))
    free = autoregressive_generate(target, contexts, 30, temperature=0.0)
    row = free.tokens[0].tolist()
    step = next(i for i in range(2, 30) if row[i] not in row[:i])  # row 0 first emits this token here
    eos = row[step]
    sd = speculative_generate(target, MagicDecDraft(target, KVBudget(1, 4), temperature=0.0), contexts, 30, k=3,
                              temperature=0.0, eos_token=eos)
    rounds = (sd.accepted[0] >= 0).sum()
    assert int((sd.accepted[0, :rounds] + 1).sum()) < 30
    assert torch.equal(sd.tokens[0, : step + 1], free.tokens[0, : step + 1])


def exact_two_token_distribution(target, context, temperature=1.0):
    """P(t1, t2 | context) by enumeration (V x V), each token from softmax(logits / temperature)."""
    with torch.no_grad():
        p1 = torch.softmax(target(context[None])[0, -1] / temperature, -1)  # (V,)
        V = p1.shape[0]
        seqs = torch.cat([context.expand(V, -1), torch.arange(V)[:, None]], dim=1)
        p2 = torch.softmax(target(seqs)[:, -1] / temperature, -1)  # (V, V)
    return p1[:, None] * p2


def assert_two_token_law(target, context, tokens, temperature) -> None:
    """The first two tokens generated after `context`, one sample per row of `tokens` (n, >= 2),
    follow the target's exact two-token distribution at `temperature` (chi-square); at T != 1 the
    T = 1 distribution is rejected, so the check has power."""
    vocab = target.cfg.vocab_size
    joint = exact_two_token_distribution(target, context, temperature).flatten()
    counts = torch.bincount(tokens[:, 0] * vocab + tokens[:, 1], minlength=vocab ** 2)
    assert chi_square_pvalue(counts, joint) > 1e-3
    assert math.isclose(float(joint.sum()), 1.0, rel_tol=1e-9)
    if temperature != 1.0:
        assert chi_square_pvalue(counts, exact_two_token_distribution(target, context).flatten()) < 1e-6


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
@pytest.mark.parametrize("name", ["vanilla-small", *BUDGETED])
def test_sampled_speculative_decoding_matches_the_target_distribution(name, temperature):
    """At T = 1, and at temperatures that sharpen (0.7) or flatten (1.5) the target, the first
    two generated tokens follow the target's exact joint distribution at that temperature,
    softmax(logits / T) computed here by hand."""
    cfg = ModelConfig(vocab_size=6, num_layers=2, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8, d_ff=32)
    target = peaky_model(cfg, std=0.15)
    small = ModelConfig(vocab_size=6, num_layers=1, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8, d_ff=32)
    gen = torch.Generator().manual_seed(11)
    draft = (VanillaDraft(peaky_model(small, 7, std=0.15), temperature=temperature) if name == "vanilla-small"
             else budgeted(name, target, temperature, 4))  # MagicDec: a sink and 3 recent keys
    context = torch.tensor([1, 4, 2, 2, 5, 0, 3, 1])
    n = 20_000
    sd = speculative_generate(target, draft, context.expand(n, -1), 2, k=3, temperature=temperature, generator=gen)
    assert_two_token_law(target, context, sd.tokens, temperature)


def test_sample_follows_unnormalized_weights_and_never_draws_a_zero():
    gen = torch.Generator().manual_seed(0)
    V, n = 37, 60_000  # 6 blocks of 7 tokens, the last one padded
    w = 3 * torch.rand(V, generator=gen)
    w[[0, 5, 36]] = 0
    draws = sample(w.expand(n, V), uniforms(gen, n, V=V))
    assert chi_square_pvalue(torch.bincount(draws, minlength=V), w / w.sum()) > 1e-3
    assert not torch.isin(draws, torch.tensor([0, 5, 36])).any()
    hot = torch.randint(0, V, (n,), generator=gen)
    assert torch.equal(sample(torch.nn.functional.one_hot(hot, V).float(), uniforms(gen, n, V=V)), hot)
    skewed = w.clone()
    skewed[1] *= 1.2  # a 20% error in one token's weight must be caught
    assert chi_square_pvalue(torch.bincount(sample(skewed.expand(n, V), uniforms(gen, n, V=V)), minlength=V),
                             w / w.sum()) < 1e-6
