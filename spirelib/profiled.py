"""A profiled cost model of decoding on this machine, next to the paper's (issue 12, Part 2).

The paper's model (spec 2, `perfmodel`) charges a forward max(2 N FLOPs, weight + KV bytes x
HOI) and nothing else; at CPU scale that misses most of the clock (fixed per-forward costs,
attention FLOPs, the unembedding, 4-byte values). This model, in the spirit of
operator-profiled simulators such as Vidur (MLSys 2024), prices one forward as

    seconds = fixed + per_layer x layers + max(FLOPs / flops_per_s, bytes / bytes_per_s)

with FLOPs and bytes from `forward_work` (body matmuls, attention over the visible keys, the
unembedding; weights and KV at the actual dtype). The four coefficients are fitted
(`fit`) to timings of single forwards at a few shapes (`wallclock.profile_forwards`, about
30 s), never to the speculative runs it is judged on. A speculative round is then the sum of
its forwards (`round_seconds`): the draft's k passes as each method runs them, the target's
verification of k + 1 tokens, and a fixed bookkeeping cost per round.

Numpy only, like the paper's model.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

import numpy as np

from spirelib.perfmodel import ModelShape, body_params


@dataclass(frozen=True)
class ForwardWork:
    """What one forward pass does: matmul FLOPs, bytes it moves, and its layer count."""

    flops: float
    bytes: float
    layers: int


def forward_work(shape: ModelShape, vocab_size: int, batch: int, new: int, keys: int, *, logits: bool = True,
                 bytes_per_value: float = 4.0) -> ForwardWork:
    """One forward of `new` tokens per row (B rows) attending to `keys` keys each.

    FLOPs: 2 per body parameter per token, attention 4 x layers x n_q x d_head per (token, key)
    (q.k and p.v), and, with `logits`, the unembedding 2 x d_model x V per token. Bytes: the
    body weights once (and the unembedding with logits), the keys/values read, and the new
    tokens' keys/values written, at `bytes_per_value`.
    """
    tokens = batch * new
    n_q = shape.n_q_per_kv * shape.n_kv
    kv_per_token = 2 * shape.num_layers * shape.n_kv * shape.d_head  # values cached per token
    unembed = shape.d_model * vocab_size if logits else 0
    flops = 2.0 * (body_params(shape) + unembed) * tokens + 4.0 * shape.num_layers * n_q * shape.d_head * tokens * keys
    moved = (body_params(shape) + unembed + kv_per_token * batch * (keys + new)) * bytes_per_value
    return ForwardWork(float(flops), float(moved), shape.num_layers)


@dataclass(frozen=True)
class ProfiledCost:
    """Fitted coefficients: seconds = fixed_s + per_layer_s x layers + max(FLOPs / flops_per_s,
    bytes / bytes_per_s) per forward; a speculative round's bookkeeping (sampling, rejection,
    rollback) costs bookkeeping_s + bookkeeping_per_logit_s x B (k + 1) V."""

    fixed_s: float
    per_layer_s: float
    flops_per_s: float
    bytes_per_s: float
    bookkeeping_s: float = 0.0
    bookkeeping_per_logit_s: float = 0.0

    def seconds(self, work: ForwardWork) -> float:
        return (self.fixed_s + self.per_layer_s * work.layers
                + max(work.flops / self.flops_per_s, work.bytes / self.bytes_per_s))

    def bookkeeping(self, batch: int, k: int, vocab_size: int) -> float:
        return self.bookkeeping_s + self.bookkeeping_per_logit_s * batch * (k + 1) * vocab_size

    def to_dict(self) -> dict:
        return asdict(self)


def fit(samples: list[tuple[ForwardWork, float]], *, peak_flops: float, bandwidth: float,
        bookkeeping: list[tuple[int, float]] = ()) -> ProfiledCost:
    """Least-squares fit of the coefficients to (work, measured seconds) samples, in relative
    error (every shape counts alike). For each (flops_per_s, bytes_per_s) on a log grid from
    1/64 to 1x of the calibrated `peak_flops` and `bandwidth`, the fixed and per-layer costs
    are the non-negative least-squares solution; the pair with the smallest error wins.
    `bookkeeping`: (logits per round B (k + 1) V, measured seconds) of a round's bookkeeping."""
    if len(samples) < 3:
        raise ValueError(f"fit needs at least 3 timed forwards, got {len(samples)}")
    flops = np.array([w.flops for w, _ in samples])
    moved = np.array([w.bytes for w, _ in samples])
    layers = np.array([w.layers for w, _ in samples], dtype=float)
    t = np.array([s for _, s in samples])
    scales = 2.0 ** -np.arange(0, 6.25, 0.25)  # 1 .. 1/64
    best = None
    for fs, bs in itertools.product(scales, scales):
        P, W = peak_flops * fs, bandwidth * bs
        rest = t - np.maximum(flops / P, moved / W)  # what fixed + per_layer x layers must explain
        a = np.stack([np.ones_like(t), layers], axis=1) / t[:, None]  # relative residuals
        coef = _nonnegative_lstsq(a, rest / t)
        err = float(np.sum((a @ coef - rest / t) ** 2))
        if best is None or err < best[0]:
            best = (err, (float(coef[0]), float(coef[1]), float(P), float(W)))
    book = (0.0, 0.0)
    if bookkeeping:
        n = np.array([float(c) for c, _ in bookkeeping])
        s = np.array([float(v) for _, v in bookkeeping])
        a = np.stack([np.ones_like(s), n], axis=1) / s[:, None]
        book = tuple(float(c) for c in _nonnegative_lstsq(a, np.ones_like(s)))
    return ProfiledCost(*best[1], *book)


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| over x >= 0 for two unknowns: the unconstrained solution, or the best
    with one coefficient at 0."""
    x = np.linalg.lstsq(a, b, rcond=None)[0]
    if np.all(x >= 0):
        return x
    options = [np.zeros(2)]
    for i in range(2):
        xi = max(0.0, float(np.dot(a[:, i], b) / np.dot(a[:, i], a[:, i])))
        options.append(np.eye(2)[i] * xi)
    return min(options, key=lambda o: float(np.sum((a @ o - b) ** 2)))


def relative_errors(cost: ProfiledCost, samples: list[tuple[ForwardWork, float]]) -> np.ndarray:
    """predicted / measured - 1 for every sample."""
    return np.array([cost.seconds(w) / s - 1 for w, s in samples])


# ---------------------------------------------------------------------------- decoding


@dataclass(frozen=True)
class DraftShape:
    """What the profiled model needs of a draft method: its layer stack's shape (None:
    MagicDec, the target itself), the keys one of its passes reads (None: the whole context,
    a dense cache), and how many layers write memory from the target's verified positions
    (SPIRe's target-activation memory, spec 3.3)."""

    method: str
    shape: ModelShape | None
    keys: int | None = None
    memory_layers: int = 0


def ad_step_seconds(cost: ProfiledCost, target: ModelShape, vocab_size: int, batch: int, context: int,
                    bytes_per_value: float = 4.0) -> float:
    """One autoregressive step: one token per row over `context` keys, with logits."""
    return cost.seconds(forward_work(target, vocab_size, batch, 1, context, bytes_per_value=bytes_per_value))


def round_seconds(cost: ProfiledCost, draft: DraftShape, target: ModelShape, vocab_size: int, batch: int,
                  context: int, k: int, bytes_per_value: float = 4.0) -> float:
    """One speculative round at `context`: the draft's k passes as the engine runs them, the
    target verifying k + 1 tokens, and the bookkeeping. The vanilla draft's first pass runs two
    tokens (the one before the pending one again, `drafts.VanillaDraft`); SPIRe also projects
    the k + 1 verified positions into its memory keys/values."""
    shape = draft.shape if draft.shape is not None else target
    keys = context if draft.keys is None else min(context, draft.keys)
    memory = draft.memory_layers * 2 * shape.n_kv * shape.d_head * shape.d_model  # K/V projection weights
    seconds = 0.0
    for j in range(k):
        w = forward_work(shape, vocab_size, batch, 2 if (draft.method == "vanilla" and j == 0) else 1, keys,
                         bytes_per_value=bytes_per_value)
        # SPIRe stores each pass's feedback memory: one K/V projection per layer
        seconds += cost.seconds(ForwardWork(w.flops + 2.0 * memory * batch, w.bytes, w.layers))
    if memory:  # and, after verification, the memory of the k + 1 verified positions
        seconds += (cost.per_layer_s * draft.memory_layers
                    + max(2.0 * memory * batch * (k + 1) / cost.flops_per_s, memory * bytes_per_value / cost.bytes_per_s))
    verify = forward_work(target, vocab_size, batch, k + 1, context + k + 1, bytes_per_value=bytes_per_value)
    return seconds + cost.seconds(verify) + cost.bookkeeping(batch, k, vocab_size)


def speedup(cost: ProfiledCost, draft: DraftShape, tau: float, target: ModelShape, vocab_size: int, batch: int,
            context: int, new_tokens: int, k: int, bytes_per_value: float = 4.0) -> float:
    """SD tokens/s over AD tokens/s while G = `new_tokens` tokens are generated after a context
    of `context`: both priced at the mean context of the generation (L + G / 2)."""
    mid = context + new_tokens // 2
    ad = ad_step_seconds(cost, target, vocab_size, batch, mid, bytes_per_value)
    return tau * ad / round_seconds(cost, draft, target, vocab_size, batch, mid, k, bytes_per_value)
