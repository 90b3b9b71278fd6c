"""tau from acceptance, and the draft depth k that maximizes modeled throughput (method §8).

Vocabulary (method §8): tau = mean tokens emitted per round, *bonus token included*, in
[1, k + 1]; acceptance rate = accepted draft tokens / drafted tokens = (tau - 1) / k;
per-position acceptance p_j = P[draft token j accepted | drafts 1..j-1 accepted].
Under i.i.d. acceptance alpha, tau = (1 - alpha^(k+1)) / (1 - alpha).
"""

from __future__ import annotations

import functools

import numpy as np

from spirelib.throughput import perfmodel
from spirelib.throughput.perfmodel import scalar_or_array


def _depth(k) -> int:
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return int(k)


def _alpha(alpha) -> np.ndarray:
    arr = np.asarray(alpha, dtype=float)
    if not np.all((arr >= 0) & (arr <= 1)):
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")
    return arr


def tau_from_alpha(alpha, k: int = 4):
    """tau = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha); k + 1 at alpha = 1."""
    a, k = _alpha(alpha), _depth(k)
    return scalar_or_array(sum(a**j for j in range(k + 1)))


def alpha_from_tau(tau, k: int = 4):
    """The i.i.d. acceptance alpha that gives tau at depth k (inverse of `tau_from_alpha`)."""
    k = _depth(k)
    t = np.asarray(tau, dtype=float)
    if not np.all((t >= 1) & (t <= k + 1)):
        raise ValueError(f"tau must lie in [1, k + 1] = [1, {k + 1}], got {tau!r}")
    lo, hi = np.zeros_like(t), np.ones_like(t)
    for _ in range(60):  # tau_from_alpha is increasing in alpha; bisection to ~1e-18
        mid = (lo + hi) / 2
        below = tau_from_alpha(mid, k) < t
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return scalar_or_array((lo + hi) / 2)


def expected_rounds(tau: float, k: int, new_tokens: int, batch: int) -> float:
    """E[rounds] for a batch of B = `batch` rows to emit G = `new_tokens` tokens each, every row
    accepting i.i.d. at the alpha of `tau` (`alpha_from_tau`): a batch decodes in lockstep until
    its slowest row has G tokens (a row's last round may emit past G), so at B > 1 it runs more
    rounds than G / tau. Exact: E[max of B rows] = sum_n (1 - P[N <= n]^B), from one row's
    P[N <= n] (`_row_done`), which does not depend on B."""
    if new_tokens < 1 or batch < 1:
        raise ValueError(f"expected_rounds needs new_tokens and batch >= 1, got {new_tokens}, {batch}")
    rounds = 0.0
    for done in _row_done(float(tau), _depth(k), int(new_tokens)):
        rounds += 1.0 - done**batch  # P[max > n] for n = 0, 1, ...
    return rounds


@functools.lru_cache(maxsize=4096)
def _row_done(tau: float, k: int, new_tokens: int) -> tuple[float, ...]:
    """P[N <= n], n = 0..G-1: that one row accepting i.i.d. at the alpha of `tau` has emitted its
    G = `new_tokens` tokens within n rounds. By convolution of the row's tokens after n rounds
    (capped at G) with one round's (1 + j accepted, P = alpha^j (1 - alpha), j < k; alpha^k for
    j = k): P[N <= n] = P[S_n >= G]. Kept per (tau, k, G): a schedule prices every batch size at
    the same few taus (`schedule.profiled_table`, 09's `scheduled_choices`)."""
    a = float(alpha_from_tau(tau, k))
    per_round = np.array([a**j * (1 - a) for j in range(k)] + [a**k])  # P[1 + j tokens], j = 0..k
    tokens = np.zeros(new_tokens + 1)  # P[S_n = s], s capped at G
    tokens[0] = 1.0
    done = [0.0]
    for _ in range(new_tokens - 1):  # a row emits at least one token a round: done after G rounds at most
        step = np.zeros_like(tokens)
        for j, p in enumerate(per_round):
            shifted = tokens * p
            step[j + 1:new_tokens] += shifted[:max(new_tokens - j - 1, 0)]  # below G: one term each
            for s in range(max(new_tokens - j - 1, 0), new_tokens + 1):  # capped at G, summed in order
                step[new_tokens] += shifted[s]
        tokens = step
        done.append(float(tokens[-1]))
    return tuple(done)


def acceptance_rate(tau, k: int = 4):
    """Accepted draft tokens / drafted tokens = (tau - 1) / k (tau includes the bonus token)."""
    k = _depth(k)
    return scalar_or_array((np.asarray(tau, dtype=float) - 1) / k)


def tau_from_per_position(per_position):
    """tau = 1 + sum_j prod_{i<=j} p_i from per-position acceptance p of shape (..., k). A position
    never reached (nan, `per_position_from_counts`) is allowed after one that accepted nothing: its
    product is 0 whatever it is."""
    p = np.asarray(per_position, dtype=float)
    q = np.nan_to_num(p, nan=0.0)
    before = np.cumprod(np.concatenate((np.ones_like(q[..., :1]), q[..., :-1]), axis=-1), axis=-1) if p.ndim else q
    ok = ((p >= 0) & (p <= 1)) | (np.isnan(p) & (before == 0))
    if p.ndim == 0 or p.shape[-1] == 0 or not np.all(ok):
        raise ValueError(f"per_position must be probabilities of shape (..., k), got {per_position!r}")
    return scalar_or_array(1 + np.cumprod(q, axis=-1).sum(axis=-1))


def _counts(counts) -> np.ndarray:
    c = np.asarray(counts, dtype=float)
    if c.ndim == 0 or c.shape[-1] < 2 or not np.all(c >= 0) or not np.all(c.sum(axis=-1) > 0):
        raise ValueError(f"counts must be non-negative round counts of shape (..., k + 1) with rounds, got {counts!r}")
    return c


def per_position_from_counts(counts):
    """Per-position acceptance p_j = #rounds(n >= j) / #rounds(n >= j - 1), shape (..., k).

    A position never reached (all earlier rounds stopped before it) gives nan.
    """
    c = _counts(counts)
    reached = np.cumsum(c[..., ::-1], axis=-1)[..., ::-1]  # reached[j] = rounds with n >= j
    with np.errstate(invalid="ignore", divide="ignore"):
        return reached[..., 1:] / reached[..., :-1]


def tau_at_depth(acceptance, k: int):
    """tau at depth k from an i.i.d. alpha (scalar) or a measured per-position acceptance (1-D).

    A per-position curve measured at depth K gives tau for every k <= K (the first k drafts
    are accepted exactly as when drafting K); it is not extrapolated past K.
    """
    k = _depth(k)
    a = np.asarray(acceptance, dtype=float)
    if a.ndim == 0:
        return tau_from_alpha(a, k)
    if a.ndim != 1 or k > a.shape[0]:
        raise ValueError(f"k={k} exceeds the depth of the per-position acceptance ({a.shape})")
    return tau_from_per_position(a[:k])


def best_k(method, acceptance, B, L, target, draft=None, *, k_max=None, **model_kwargs):
    """The depth k in 1..k_max that maximizes the modeled throughput multiplier (method §2).

    acceptance: i.i.d. alpha (scalar; k_max defaults to 8) or per-position acceptance of
    shape (K,) (k_max defaults to K). B and L broadcast; `model_kwargs` go to
    `perfmodel.throughput_multiplier` (hoi, overlap, window, ...). Returns (k, multiplier).
    """
    per_position = np.ndim(acceptance) == 1
    if k_max is None:
        k_max = len(acceptance) if per_position else 8
    k_max = _depth(k_max)
    ks = np.arange(1, k_max + 1)
    tms = np.stack([
        np.asarray(perfmodel.throughput_multiplier(method, tau_at_depth(acceptance, int(k)), B, L, target, draft,
                                                   k=int(k), **model_kwargs))
        for k in ks
    ])  # (k_max, ...)
    best = tms.argmax(axis=0)
    k_best = ks[best]
    tm_best = np.take_along_axis(tms, best[None], axis=0)[0]
    return (int(k_best), float(tm_best)) if k_best.ndim == 0 else (k_best, tm_best)
