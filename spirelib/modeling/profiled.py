"""A profiled cost model of decoding on this machine, next to the paper's (issue 12, Part 2).

The paper's model (method §2, `perfmodel`) charges a forward max(2 N FLOPs, weight + KV bytes x
HOI) and nothing else; at CPU scale that misses most of the clock (fixed per-forward costs,
attention FLOPs, the unembedding, 4-byte values). This model, in the spirit of
operator-profiled simulators such as Vidur (MLSys 2024), prices one forward as

    seconds = fixed + (per_layer + per_token_layer x tokens) x layers
              + max(matmul FLOPs / flops_per_s, bytes / bytes_per_s) + attention FLOPs / attention_flops_per_s

with FLOPs and bytes from `forward_work` (body matmuls, attention over the visible keys, the
unembedding; weights and KV at the actual dtype); the per-token term is what elementwise
kernels (norms, RoPE, softmax, SwiGLU) cost per token beyond the matmuls, and attention's
FLOPs run at a rate of their own (a CPU's attention kernel reaches a fraction of the matmul
peak, and with several queries per row it is compute-bound). The coefficients are fitted
(`fit`) to timings of single forwards at a few shapes (`wallclock.profile_forwards`), never to
the speculative runs it is judged on. A speculative round is then the sum of its parts
(`round_seconds`): the draft's k passes as each method runs them (`propose_seconds`), each
followed by sampling a token from (B, V) probabilities, the target's verification of k + 1
tokens, the round's bookkeeping (`speculative.Rows.settle`: rejection sampling over
(B, k + 1, V), the emitted tokens, the rollback), and the draft's accept of the verified
positions. What a method's own code adds to its passes and its accept (its Python, MagicDec's
ring re-rotating the sink keys and copying verified keys/values in, SPIRe's memory writes) is
its `DraftOverhead`, fitted to its own timed propose and accept calls (`wallclock.profile_drafts`).
Every decode-time forward over a dense cache reads its whole capacity (`kvcache.DenseKVCache`: static shapes,
no host sync), and `speedup` prices it so.

Numpy only, like the paper's model.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import asdict, dataclass

import numpy as np

from spirelib.modeling.perfmodel import ModelShape, body_params


@dataclass(frozen=True)
class ForwardWork:
    """What one forward pass does: matmul FLOPs, bytes it moves, and its layer count."""

    flops: float
    bytes: float
    layers: int
    tokens: int = 0  # B x T: what the per-token costs scale with
    attention_flops: float = 0.0  # the part of `flops` that is attention (q.k and p.v)


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
    attention = 4.0 * shape.num_layers * n_q * shape.d_head * tokens * keys
    flops = 2.0 * (body_params(shape) + unembed) * tokens + attention
    moved = (body_params(shape) + unembed + kv_per_token * batch * (keys + new)) * bytes_per_value
    return ForwardWork(float(flops), float(moved), shape.num_layers, tokens, float(attention))


@dataclass(frozen=True)
class DraftOverhead:
    """What a drafting method costs beyond its passes' forwards and draws, fitted to its own
    timed calls (`wallclock.profile_drafts`): per pass pass_s + pass_per_row_s x B (the
    method's Python, cache bookkeeping, MagicDec's ring, SPIRe's feedback writes), and per
    round its `accept` of the verified positions, accept_s + accept_per_row_s x B (MagicDec
    copies them into its ring, SPIRe writes their memory)."""

    pass_s: float = 0.0
    pass_per_row_s: float = 0.0
    accept_s: float = 0.0
    accept_per_row_s: float = 0.0


@dataclass(frozen=True)
class ProfiledCost:
    """Fitted coefficients: seconds = fixed_s + (per_layer_s + per_token_layer_s x tokens) x layers
    + max(FLOPs / flops_per_s, bytes / bytes_per_s) per forward; a round's bookkeeping costs
    bookkeeping_s + bookkeeping_per_logit_s x B (k + 1) V, a draft pass's sampling
    sampling_s + sampling_per_logit_s x B V."""

    fixed_s: float
    per_layer_s: float
    flops_per_s: float
    bytes_per_s: float
    bookkeeping_s: float = 0.0
    bookkeeping_per_logit_s: float = 0.0
    per_token_layer_s: float = 0.0
    sampling_s: float = 0.0
    sampling_per_logit_s: float = 0.0
    attention_flops_per_s: float = float("inf")
    drafts: dict = dataclasses.field(default_factory=dict)  # method -> DraftOverhead

    def seconds(self, work: ForwardWork) -> float:
        per_layer = self.per_layer_s + self.per_token_layer_s * work.tokens
        return (self.fixed_s + per_layer * work.layers + work.attention_flops / self.attention_flops_per_s
                + max((work.flops - work.attention_flops) / self.flops_per_s, work.bytes / self.bytes_per_s))

    def bookkeeping(self, batch: int, k: int, vocab_size: int) -> float:
        return self.bookkeeping_s + self.bookkeeping_per_logit_s * batch * (k + 1) * vocab_size

    def sampling(self, batch: int, vocab_size: int) -> float:
        return self.sampling_s + self.sampling_per_logit_s * batch * vocab_size

    def draft(self, method: str) -> DraftOverhead:
        """The method's fitted overhead (none if it was not profiled)."""
        return self.drafts.get(method, DraftOverhead())

    def to_dict(self) -> dict:
        return asdict(self)


def fit(samples: list[tuple[ForwardWork, float]], *, peak_flops: float, bandwidth: float,
        bookkeeping: list[tuple[int, float]] = (), sampling: list[tuple[int, float]] = ()) -> ProfiledCost:
    """Least-squares fit of the coefficients to (work, measured seconds) samples, in relative
    error (every shape counts alike). For each (flops_per_s, bytes_per_s) on a log grid from
    1/64 to 1x of the calibrated `peak_flops` and `bandwidth`, the fixed, per-layer and
    per-token-layer costs are the non-negative least-squares solution; the pair with the
    smallest error wins (with the attention rate, a fourth free coefficient). `bookkeeping`:
    (logits per round B (k + 1) V, seconds) of a round's bookkeeping; `sampling`: (logits B V,
    seconds) of a draft pass's sampling. What each drafting method costs beyond its forwards is
    fitted afterwards (`fit_draft`)."""
    if len(samples) < 3:
        raise ValueError(f"fit needs at least 3 timed forwards, got {len(samples)}")
    attention = np.array([w.attention_flops for w, _ in samples])
    flops = np.array([w.flops for w, _ in samples]) - attention
    moved = np.array([w.bytes for w, _ in samples])
    layers = np.array([w.layers for w, _ in samples], dtype=float)
    token_layers = np.array([w.tokens * w.layers for w, _ in samples], dtype=float)
    t = np.array([s for _, s in samples])
    scales = 2.0 ** -np.arange(0, 6.25, 0.25)  # 1 .. 1/64
    best = None
    for fs, bs in itertools.product(scales, scales):
        P, W = peak_flops * fs, bandwidth * bs
        rest = t - np.maximum(flops / P, moved / W)  # what the fixed terms must explain
        a = np.stack([np.ones_like(t), layers, token_layers, attention], axis=1) / t[:, None]  # relative residuals
        coef = _nonnegative_lstsq(a, rest / t)
        err = float(np.sum((a @ coef - rest / t) ** 2))
        if best is None or err < best[0]:
            best = (err, coef, float(P), float(W))
    _, (fixed, per_layer, per_token_layer, per_attention_flop), P, W = best
    book, draw = _affine(bookkeeping), _affine(sampling)
    return ProfiledCost(float(fixed), float(per_layer), P, W, *book, float(per_token_layer), *draw,
                        attention_flops_per_s=1.0 / per_attention_flop if per_attention_flop > 0 else float("inf"))


def _affine(pairs: list[tuple[int, float]]) -> tuple[float, float]:
    """(a, b) >= 0 of seconds ~ a + b x n, fitted in relative error; (0, 0) without samples."""
    if not pairs:
        return 0.0, 0.0
    n = np.array([float(c) for c, _ in pairs])
    s = np.array([float(v) for _, v in pairs])
    a = np.stack([np.ones_like(s), n], axis=1) / s[:, None]
    return tuple(float(c) for c in _nonnegative_lstsq(a, np.ones_like(s)))


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| over x >= 0 (a few unknowns): the best least-squares solution over
    every subset of coefficients left free, the others at 0, that comes out non-negative."""
    n = a.shape[1]
    best, best_err = np.zeros(n), float(np.sum(b**2))
    for size in range(1, n + 1):
        for free in itertools.combinations(range(n), size):
            x = np.zeros(n)
            x[list(free)] = np.linalg.lstsq(a[:, list(free)], b, rcond=None)[0]
            err = float(np.sum((a @ x - b) ** 2))
            if np.all(x >= 0) and err < best_err:
                best, best_err = x, err
    return best


def relative_errors(cost: ProfiledCost, samples: list[tuple[ForwardWork, float]]) -> np.ndarray:
    """predicted / measured - 1 for every sample."""
    return np.array([cost.seconds(w) / s - 1 for w, s in samples])


# ---------------------------------------------------------------------------- decoding


@dataclass(frozen=True)
class DraftShape:
    """What the profiled model needs of a draft method: its layer stack's shape (None:
    MagicDec, the target itself), the keys one of its passes reads (None: the whole context,
    a dense cache), and how many layers write memory from the target's verified positions
    (SPIRe's target-activation memory, method §3.3)."""

    method: str
    shape: ModelShape | None
    keys: int | None = None
    memory_layers: int = 0


def ad_step_seconds(cost: ProfiledCost, target: ModelShape, vocab_size: int, batch: int, context: int,
                    bytes_per_value: float = 4.0) -> float:
    """One autoregressive step: one token per row over `context` keys, with logits."""
    return cost.seconds(forward_work(target, vocab_size, batch, 1, context, bytes_per_value=bytes_per_value))


def ad_keys(context: int, new_tokens: int) -> int:
    """The keys an AD step reads after `context`, generating G = `new_tokens`: its cache's whole
    capacity L + G (`kvcache.DenseKVCache` reads it all at decode time)."""
    return context + new_tokens


def propose_seconds(cost: ProfiledCost, draft: DraftShape, target: ModelShape, vocab_size: int, batch: int,
                    context: int, k: int, bytes_per_value: float = 4.0, dense_keys: int | None = None) -> float:
    """The draft's k passes as the engine runs them, each followed by a draw from (B, V)
    probabilities, priced by their forwards alone (no `DraftOverhead`). The vanilla draft's
    first pass runs two tokens (the one before the pending one again, `drafts.VanillaDraft`);
    a SPIRe pass also projects its feedback memory (one K/V projection per layer). `dense_keys`:
    the keys a pass over a dense cache reads (default `context`; with static reads, the capacity)."""
    shape = draft.shape if draft.shape is not None else target
    keys = (dense_keys or context) if draft.keys is None else min(context, draft.keys)
    memory = _memory_weights(draft, shape)
    seconds = k * cost.sampling(batch, vocab_size)
    for j in range(k):
        w = forward_work(shape, vocab_size, batch, 2 if (draft.method == "vanilla" and j == 0) else 1, keys,
                         bytes_per_value=bytes_per_value)
        seconds += cost.seconds(dataclasses.replace(w, flops=w.flops + 2.0 * memory * batch))
    return seconds


def accept_seconds(cost: ProfiledCost, draft: DraftShape, target: ModelShape, batch: int, k: int,
                   bytes_per_value: float = 4.0) -> float:
    """The draft's `accept` of k + 1 verified positions priced by its work alone: SPIRe
    projects their target activations into its memory keys/values (other drafts: nothing)."""
    memory = _memory_weights(draft, draft.shape if draft.shape is not None else target)
    if not memory:
        return 0.0
    return (cost.per_layer_s * draft.memory_layers
            + max(2.0 * memory * batch * (k + 1) / cost.flops_per_s, memory * bytes_per_value / cost.bytes_per_s))


def _memory_weights(draft: DraftShape, shape: ModelShape) -> int:
    """The K/V projection weights of the layers that write memory (SPIRe's, method §3.3)."""
    return draft.memory_layers * 2 * shape.n_kv * shape.d_head * shape.d_model


def round_seconds(cost: ProfiledCost, draft: DraftShape, target: ModelShape, vocab_size: int, batch: int,
                  context: int, k: int, bytes_per_value: float = 4.0, dense_keys: int | None = None) -> float:
    """One speculative round at `context`: the draft's k passes (`propose_seconds`), the target
    verifying k + 1 tokens, the bookkeeping, the draft's `accept` (`accept_seconds`), and the
    method's fitted overhead per pass and per accept (`ProfiledCost.draft`). `dense_keys`: the
    keys a forward over a dense cache reads (default: the positions it sees; the engine's caches
    read their capacity, which `speedup` passes)."""
    extra = cost.draft(draft.method)
    verify = forward_work(target, vocab_size, batch, k + 1, dense_keys or context + k + 1,
                          bytes_per_value=bytes_per_value)
    return (propose_seconds(cost, draft, target, vocab_size, batch, context, k, bytes_per_value, dense_keys)
            + k * (extra.pass_s + extra.pass_per_row_s * batch)
            + cost.seconds(verify) + cost.bookkeeping(batch, k, vocab_size)
            + accept_seconds(cost, draft, target, batch, k, bytes_per_value)
            + extra.accept_s + extra.accept_per_row_s * batch)


def fit_draft(cost: ProfiledCost, draft: DraftShape, target: ModelShape, vocab_size: int, k: int,
              samples: list[tuple[int, int, float, float]], bytes_per_value: float = 4.0) -> DraftOverhead:
    """A method's `DraftOverhead`, least squares in relative error, from timed calls
    (B, context, propose seconds, accept seconds): what its passes' forwards and draws, and
    its accept's work, leave unexplained (it may come out negative where the forwards, timed
    alone, cost more than inside the method)."""
    if len(samples) < 2:
        raise ValueError(f"fit_draft needs at least 2 timed calls at different batch sizes, got {len(samples)}")
    B = np.array([float(b) for b, _, _, _ in samples])
    propose = np.array([p for _, _, p, _ in samples])
    accept = np.array([a for _, _, _, a in samples])
    base = np.array([propose_seconds(cost, draft, target, vocab_size, b, c, k, bytes_per_value)
                     for b, c, _, _ in samples])
    a = np.stack([np.full_like(B, k), k * B], axis=1) / propose[:, None]
    pass_s, pass_per_row_s = np.linalg.lstsq(a, 1.0 - base / propose, rcond=None)[0]
    base = np.array([accept_seconds(cost, draft, target, b, k, bytes_per_value) for b, _, _, _ in samples])
    a = np.stack([np.ones_like(B), B], axis=1) / accept[:, None]
    accept_s, accept_per_row_s = np.linalg.lstsq(a, 1.0 - base / accept, rcond=None)[0]
    return DraftOverhead(float(pass_s), float(pass_per_row_s), float(accept_s), float(accept_per_row_s))


def speedup(cost: ProfiledCost, draft: DraftShape, tau: float, target: ModelShape, vocab_size: int, batch: int,
            context: int, new_tokens: int, k: int, bytes_per_value: float = 4.0) -> float:
    """SD tokens/s over AD tokens/s while G = `new_tokens` tokens are generated after a context
    of `context`: both priced at the mean context of the generation (L + G / 2), every forward
    over a dense cache reading its whole capacity: L + G for AD, L + G + 2k for speculative
    decoding (`speculative_capacity`); the sparse drafts read their sink + window."""
    mid = context + new_tokens // 2
    ad = ad_step_seconds(cost, target, vocab_size, batch, ad_keys(context, new_tokens), bytes_per_value)
    dense = context + new_tokens + 2 * k
    return tau * ad / round_seconds(cost, draft, target, vocab_size, batch, mid, k, bytes_per_value, dense)
