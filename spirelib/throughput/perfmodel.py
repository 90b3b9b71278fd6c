"""The paper's implementation-agnostic throughput model (method §2), and what it leaves out.

SPIRe (arXiv 2504.06419) scores a draft by its modeled *throughput multiplier* over
autoregressive decoding (AD):

    TM = tau / dt,    dt = (k * t_draft + t_verify) / t_target

where every forward pass costs f(FLOPs, bytes * HOI) FLOP-equivalents, f = max (perfect
overlap of compute and memory traffic) or f = sum (no overlap). FLOPs are 2 per body
parameter per token; bytes are the weights plus the KV cache read; HOI is the hardware's
FLOP/byte ratio (paper: 600, H100 SXM dense FP8). Only ratios of pass times matter.

Numpy only (importable without torch). `B` and `L` broadcast, so a whole heat map is one
call; scalars in give a float out. Beyond the paper: per-request context lengths in one
batch (`RequestLengths`, `LengthDistribution`), a fixed sparse window (`window=`) as the
trained drafts use, and bytes per weight / per KV value as parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from spirelib.throughput.methods import BUDGET, CARDS

MODELED_METHODS = tuple(m for m, c in CARDS.items() if c.paper)  # the paper's three
#: Beyond the paper (method §2, "Beyond the paper's three"): the verification-guided sparse
#: self-draft, prompt lookup, and a one-pass drafter of a stated tau (their cards, `methods`).
EXTRA_METHODS = tuple(m for m, c in CARDS.items() if c.priced and not c.paper)
METHODS = MODELED_METHODS + EXTRA_METHODS
SELF_DRAFTS = tuple(m for m in METHODS if CARDS[m].self_draft)  # no draft model of their own
PAPER_HOI = 600.0  # FLOP/byte; the paper's H100 SXM figure (method §2)


@dataclass(frozen=True)
class ModelShape:
    """A GQA-SwiGLU layer stack (method §2, "Models"); n_q_per_kv * n_kv * d_head may differ from d_model."""

    num_layers: int
    d_model: int
    n_q_per_kv: int
    n_kv: int
    d_head: int
    d_ff: int

    def __post_init__(self):
        for name in ("num_layers", "d_model", "n_q_per_kv", "n_kv", "d_head", "d_ff"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{type(self).__name__}.{name} must be a positive integer, got {value!r}")


def body_params(shape: ModelShape | str) -> int:
    """Body parameters (method §2): norm gains, attention and SwiGLU weights; no (un)embedding."""
    shape = resolve_shape(shape)
    d, h, kv, q = shape.d_model, shape.d_head, shape.n_kv, shape.n_q_per_kv
    per_layer = 2 * d + (q + 2) * kv * d * h + q * kv * h * d + 3 * d * shape.d_ff
    return int(shape.num_layers * per_layer)


def fused_params(method: str, shape: ModelShape | str) -> int:
    """A draft's weights beyond its layer stack's body (`body_params`) that it runs once per token:
    EAGLE-3's fusion of `fused` target hidden states (fused x d x d) and the second half of its
    W_q, W_k, W_v, which read [embedding ; feature] (2 d wide); none for the other methods."""
    fused = CARDS[method].fused
    if not fused:
        return 0
    shape = resolve_shape(shape)
    d = shape.d_model
    return int(fused * d * d + shape.num_layers * (shape.n_q_per_kv + 2) * shape.n_kv * d * shape.d_head)


def kv_values_per_token(shape: ModelShape | str) -> int:
    """Keys and values cached per token: 2 * layers * n_kv * d_head (kvb(m) at 1 byte per value)."""
    shape = resolve_shape(shape)
    return 2 * shape.num_layers * shape.n_kv * shape.d_head


PRESETS: dict[str, ModelShape] = {
    "seqax-67m": ModelShape(8, 512, 1, 8, 128, 4096),  # the paper's target
    "vanilla-draft": ModelShape(4, 256, 1, 8, 64, 2048),  # half width, half depth
    "spire-draft": ModelShape(2, 512, 1, 8, 128, 4096),  # last 2 target layers
    "llama3-70b": ModelShape(80, 8192, 8, 8, 128, 28672),
    "llama3-8b": ModelShape(32, 4096, 4, 8, 128, 14336),  # scaled vanilla draft
    "spire-draft-70b": ModelShape(20, 8192, 8, 8, 128, 28672),  # 20 layers of 70B
    "eagle3-draft": ModelShape(1, 512, 1, 8, 128, 4096),  # EAGLE-3: one layer of the target's shape
    "eagle3-draft-70b": ModelShape(1, 8192, 8, 8, 128, 28672),
}

# Which draft shape each method uses with each paper target (MagicDec drafts with the target).
PAPER_DRAFTS: dict[str, dict[str, str]] = {
    "seqax-67m": {"vanilla": "vanilla-draft", "spire": "spire-draft", "eagle3": "eagle3-draft"},
    "llama3-70b": {"vanilla": "llama3-8b", "spire": "spire-draft-70b", "eagle3": "eagle3-draft-70b"},
}

# The paper's measured tau (method §2, Table 1): k = 4, G = 64, 95% CI +-0.004; keyed by context L.
PAPER_TAU: dict[int, dict[str, float]] = {
    960: {"vanilla": 2.644, "magicdec": 3.793, "spire": 3.382},
    512: {"vanilla": 2.647, "magicdec": 3.891, "spire": 3.401},
    256: {"vanilla": 2.637, "magicdec": 4.005, "spire": 3.427},
}
PAPER_TAU_CONTEXT = 512  # every modeled figure uses the L = 512 taus at every L

# SPIRe ablations at L = 512 (method §2). "no_sparse_kv" keeps SPIRe's tau and sets Klen = L.
PAPER_ABLATION_TAU: dict[str, float] = {
    "spire": 3.401,
    "random_init": 3.105,
    "distill_only": 3.375,
    "hard_target": 3.069,
    "no_feedback": 3.352,
    "no_feedback_no_target_acts": 2.959,
    "no_sparse_kv": 3.401,
}

# The paper's stated multipliers (method §2), for side-by-side tables; never used in computation.
PAPER_MULTIPLIERS: dict[str, dict] = {
    "seqax-67m": {"B": 64, "L": 512, "spire": 2.78, "magicdec": 2.05, "vanilla": 1.36},
    "llama3-70b": {"B": 64, "L": 65536, "spire": 2.82, "magicdec": 2.14},
}


@dataclass(frozen=True, eq=False)
class RequestLengths:
    """Per-request context lengths of one batch, shape (B,): pass as `L` to model a mixed batch.

    KV reads sum over requests; a sparse draft caps each request at its own window.
    """

    lengths: np.ndarray  # (B,)

    def __post_init__(self):
        lengths = np.asarray(self.lengths)
        if lengths.ndim != 1 or lengths.size == 0:
            raise ValueError(f"L: per-request lengths must be a non-empty 1-D array, got shape {lengths.shape}")
        if not np.all(lengths >= 1) or not np.all(lengths == np.round(lengths)):
            raise ValueError("L: per-request lengths must be positive integers")
        object.__setattr__(self, "lengths", lengths.astype(np.int64))

    def __len__(self) -> int:
        return len(self.lengths)


@dataclass(frozen=True)
class LengthDistribution:
    """A seeded distribution of per-request context lengths with a given mean.

    kind "lognormal": spread is sigma of log-length (mean preserved, median below it);
    kind "uniform": lengths uniform on mean * [1 - spread, 1 + spread], 0 <= spread <= 1.
    spread 0 is a uniform batch. Sampling n requests takes the first n of one seeded
    stream, so batches of different sizes share their first requests.
    """

    mean: float
    spread: float = 1.0
    kind: str = "lognormal"
    seed: int = 0

    def __post_init__(self):
        if not self.mean >= 1:
            raise ValueError(f"LengthDistribution.mean must be >= 1, got {self.mean!r}")
        if self.kind not in ("lognormal", "uniform"):
            raise ValueError(f"LengthDistribution.kind must be 'lognormal' or 'uniform', got {self.kind!r}")
        if not self.spread >= 0 or (self.kind == "uniform" and self.spread > 1):
            raise ValueError(f"LengthDistribution.spread out of range for {self.kind}: {self.spread!r}")

    def sample(self, n: int) -> RequestLengths:
        rng = np.random.default_rng(self.seed)
        if self.kind == "lognormal":
            mu = math.log(self.mean) - self.spread**2 / 2
            raw = np.exp(mu + self.spread * rng.standard_normal(n))
        else:
            raw = self.mean * (1 + self.spread * rng.uniform(-1.0, 1.0, n))
        return RequestLengths(np.maximum(1, np.round(raw)))


def mixed_and_uniform(method, tau, B, lengths: RequestLengths, target, draft=None, **model_kwargs) -> tuple[float, float]:
    """TM of a batch whose requests have `lengths`, and TM of a uniform batch of their mean
    length (the paper's claim that SPIRe gains most when lengths vary, method §2); `model_kwargs`
    go to `throughput_multiplier`."""
    mean = float(np.mean(lengths.lengths))
    return (float(throughput_multiplier(method, tau, B, lengths, target, draft, **model_kwargs)),
            float(throughput_multiplier(method, tau, B, mean, target, draft, **model_kwargs)))


def best_method(grids: Mapping[str, np.ndarray], baseline: float | None = None) -> np.ndarray:
    """Per cell, the name of the method with the highest multiplier in `grids` (method -> array);
    with `baseline` (1.0: autoregressive decoding), "ad" where no method exceeds it."""
    names = list(grids)
    stack = np.stack([np.asarray(grids[m]) for m in names])
    best = np.asarray(names)[stack.argmax(0)]
    return best if baseline is None else np.where(stack.max(0) > baseline, best, "ad")


def klen(L, *, sink_size: int = 1, window_factor: int | None = 8, window: int | None = None):
    """Tokens a sparse (sink + sliding window) draft cache holds for a context of L (method §2).

    `Klen = sink_size + L // window_factor`; with a fixed `window` (in tokens, as the trained
    drafts use) `sink_size + window`; `window_factor=None` and `window=None`: dense, L.
    Never more than L. Broadcasts over L.
    """
    L = np.asarray(L)
    if window is not None:
        out = np.minimum(L, sink_size + window)
    elif window_factor is None:
        out = L
    else:
        out = np.minimum(L, sink_size + L // window_factor)
    return out.item() if out.ndim == 0 else out


# --- validation ------------------------------------------------------------------------


def resolve_shape(value, name: str = "shape") -> ModelShape:
    """A ModelShape, or the PRESETS entry of that name (ValueError naming `name` otherwise)."""
    if isinstance(value, str):
        if value not in PRESETS:
            raise ValueError(f"{name}: unknown preset {value!r}; known: {sorted(PRESETS)}")
        return PRESETS[value]
    if not isinstance(value, ModelShape):
        raise ValueError(f"{name} must be a ModelShape or a PRESETS name, got {type(value).__name__}")
    return value


def positive(value, name: str) -> np.ndarray:
    """`value` as a float array, refused with its `name` unless every entry is > 0 (and there is one)."""
    arr = np.asarray(value, dtype=float)
    if arr.size == 0 or not np.all(arr > 0):
        raise ValueError(f"{name} must be positive, got {value!r}")
    return arr


@dataclass(frozen=True)
class _Config:
    method: str
    target: ModelShape
    draft: ModelShape | None
    k: int
    hoi: float
    overlap: bool
    cap: Callable | None  # initial length -> sparse draft cache size; None: dense draft cache
    bytes_per_weight: float
    bytes_per_kv: float
    score_read: float = 1.0  # the guided draft: share of the target's keys its scoring reads again


# parameters: the public functions' knobs, each checked here before any arithmetic
def _config(method, target, draft, k, hoi, overlap, sink_size, window_factor, window, bytes_per_weight, bytes_per_kv,
            score_read=1.0):
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    target = resolve_shape(target, "target")
    if method in SELF_DRAFTS:
        draft = None  # MagicDec and the guided draft draft with the target itself; lookup has no model
    elif draft is None:
        raise ValueError(f"draft: method {method!r} needs a draft ModelShape")
    else:
        draft = resolve_shape(draft, "draft")
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    positive(hoi, "hoi")
    if np.ndim(hoi) != 0:
        raise ValueError(f"hoi must be a scalar, got shape {np.shape(hoi)}")
    if not isinstance(sink_size, (int, np.integer)) or sink_size < 0:
        raise ValueError(f"sink_size must be a non-negative integer, got {sink_size!r}")
    if window_factor is not None and (not isinstance(window_factor, (int, np.integer)) or window_factor < 1):
        raise ValueError(f"window_factor must be a positive integer or None, got {window_factor!r}")
    if window is not None and (not isinstance(window, (int, np.integer)) or window < 1):
        raise ValueError(f"window must be a positive integer or None, got {window!r}")
    positive(bytes_per_weight, "bytes_per_weight")
    positive(bytes_per_kv, "bytes_per_kv")
    if not 0 <= score_read <= 1:
        raise ValueError(f"score_read must lie in [0, 1], got {score_read!r}")
    sparse = CARDS[method].reads == BUDGET and (window is not None or window_factor is not None)
    cap = None
    if sparse:
        def cap(L0):
            return klen(L0, sink_size=sink_size, window_factor=window_factor, window=window)
    return _Config(method, target, draft, int(k), float(hoi), bool(overlap), cap,
                   float(bytes_per_weight), float(bytes_per_kv), float(score_read))


def _tau(tau, k: int) -> np.ndarray:
    arr = positive(tau, "tau")
    if not np.all((arr >= 1) & (arr <= k + 1)):
        raise ValueError(f"tau must lie in [1, k + 1] = [1, {k + 1}] (bonus token included), got {tau!r}")
    return arr


# --- the batch: total KV tokens read ---------------------------------------------------


def _kv_tokens(B, L, offsets: np.ndarray, cap):
    """Total KV tokens the target and the draft read across the batch, after `offsets` new tokens.

    Returns (batch, target_tokens, draft_tokens): batch has the broadcast shape S of B and L
    (or of B for per-request lengths); the token totals have shape S + (len(offsets),).
    A sparse draft's cache size is fixed by each request's initial length (method §2, G-aware).
    """
    if isinstance(L, (RequestLengths, LengthDistribution)):
        batch = positive(B, "B")
        if not np.all(batch == np.round(batch)):
            raise ValueError(f"B must be whole requests with per-request lengths, got {B!r}")
        n = int(batch.max())
        if isinstance(L, RequestLengths):
            if not np.all(batch == len(L)):
                raise ValueError(f"B must equal the number of per-request lengths ({len(L)}), got {B!r}")
            lengths = L.lengths
        else:
            lengths = L.sample(n).lengths
        lengths = lengths.astype(float)
        cur = lengths[:, None] + offsets  # (n, m)
        draft = cur if cap is None else np.minimum(cur, np.asarray(cap(lengths), float)[:, None])
        index = batch.astype(np.int64) - 1  # batches of size b hold the first b requests
        return batch, np.cumsum(cur, axis=0)[index], np.cumsum(draft, axis=0)[index]
    batch, L0 = np.broadcast_arrays(positive(B, "B"), positive(L, "L"))
    cur = L0[..., None] + offsets  # S + (m,)
    draft = cur if cap is None else np.minimum(cur, np.asarray(cap(L0), float)[..., None])
    return batch, batch[..., None] * cur, batch[..., None] * draft


# --- pass times --------------------------------------------------------------------------


def _pass_time(flops, weight_bytes, kv_bytes, cfg: _Config):
    memory = (weight_bytes + kv_bytes) * cfg.hoi
    return np.maximum(flops, memory) if cfg.overlap else flops + memory


def _target_times(batch, target_tokens, cfg: _Config):
    """(t_target, t_verify): one decode step, and one k+1-token verification pass; for the guided
    draft the verification also scores its k + 1 queries against every key (method §2)."""
    n = body_params(cfg.target)
    flops = 2.0 * n * batch[..., None]
    weights = n * cfg.bytes_per_weight
    kv = target_tokens * kv_values_per_token(cfg.target) * cfg.bytes_per_kv
    verify_flops, verify_kv = (cfg.k + 1) * flops, kv
    if CARDS[cfg.method].scores:  # the guided draft: q . k of k + 1 queries per head over every key, read again
        shape = cfg.target
        verify_flops = verify_flops + 2.0 * (cfg.k + 1) * target_tokens * shape.num_layers * shape.n_q_per_kv * shape.n_kv * shape.d_head
        verify_kv = kv + cfg.score_read * kv / 2
    return _pass_time(flops, weights, kv, cfg), _pass_time(verify_flops, weights, verify_kv, cfg)


def _draft_time(batch, draft_tokens, cfg: _Config):
    """t_draft for one draft pass (method §2 table); prompt lookup's is none."""
    method = CARDS[cfg.method]
    if method.drafter is None:
        return np.zeros(np.shape(draft_tokens))
    shape = cfg.target if method.self_draft else cfg.draft
    n = body_params(shape) + fused_params(cfg.method, shape)
    flops = 2.0 * n * batch[..., None]
    if method.memory:  # SPIRe: project each new memory vector into a key and a value per layer
        flops = flops + 2.0 * (2 * shape.num_layers * shape.n_kv * shape.d_model * shape.d_head) * batch[..., None]
    kv = draft_tokens * kv_values_per_token(shape) * cfg.bytes_per_kv
    if method.joint:  # a one-pass drafter: k positions in one pass, k times the FLOPs, weights and KV read once
        return _pass_time(cfg.k * flops, n * cfg.bytes_per_weight, kv, cfg) / cfg.k
    return _pass_time(flops, n * cfg.bytes_per_weight, kv, cfg)


def scalar_or_array(arr):
    """A 0-d result as a float, anything else as an array (the numpy model's return convention)."""
    return float(arr) if np.ndim(arr) == 0 else np.asarray(arr)


# --- public model ------------------------------------------------------------------------


# parameters: the paper's model's knobs (method §2), keyword-only, each with the paper's default
def iteration_time_multiplier(method, B, L, target, draft=None, *, k=4, hoi=PAPER_HOI, overlap=True,
                              sink_size=1, window_factor=8, window=None, bytes_per_weight=1.0, bytes_per_kv=1.0,
                              score_read=1.0):
    """dt = (k * t_draft + t_verify) / t_target (method §2): one SD round's time in AD steps.

    method: one of `METHODS` (a draft shape required except for the self-drafts, `SELF_DRAFTS`).
    B, L broadcast (L may also be `RequestLengths` or a `LengthDistribution`).
    overlap=False: f = sum instead of max. window_factor=None: no sparse KV (Klen = L);
    window: a fixed sparse window in tokens instead of L // window_factor (the guided draft's whole
    budget: sink + window + its chosen entries). score_read: the share of the target's keys the
    guided draft's scoring reads again (1 as implemented here; 0 with a kernel that writes the
    scores while it verifies).
    """
    cfg = _config(method, target, draft, k, hoi, overlap, sink_size, window_factor, window, bytes_per_weight, bytes_per_kv,
                  score_read)
    batch, target_tokens, draft_tokens = _kv_tokens(B, L, np.zeros(1), cfg.cap)
    t_target, t_verify = _target_times(batch, target_tokens, cfg)
    t_draft = _draft_time(batch, draft_tokens, cfg)
    return scalar_or_array(((cfg.k * t_draft + t_verify) / t_target)[..., 0])


def step_cost(shape, B, L, *, hoi=PAPER_HOI, overlap=True, bytes_per_weight=1.0, bytes_per_kv=1.0):
    """Cost of one autoregressive decode step of `shape` at batch B and context L, in
    FLOP-equivalents: f(2 N B, (N + KV bytes) x HOI) (method §2). Divided by a device's peak
    FLOP/s it is the modeled seconds of the step (notebook 09 checks that against the clock)."""
    cfg = _config("magicdec", shape, None, 1, hoi, overlap, 0, None, None, bytes_per_weight, bytes_per_kv)
    batch, target_tokens, _ = _kv_tokens(B, L, np.zeros(1), None)
    return scalar_or_array(_target_times(batch, target_tokens, cfg)[0][..., 0])


# parameters: the paper's model's knobs (method §2), keyword-only, each with the paper's default
def throughput_multiplier(method, tau, B, L, target, draft=None, *, k=4, hoi=PAPER_HOI, overlap=True,
                          sink_size=1, window_factor=8, window=None, bytes_per_weight=1.0, bytes_per_kv=1.0,
                          score_read=1.0):
    """TM = tau / dt (method §2): SD throughput over autoregressive decoding. tau includes the bonus token."""
    tau = _tau(tau, k)
    dt = iteration_time_multiplier(method, B, L, target, draft, k=k, hoi=hoi, overlap=overlap, sink_size=sink_size,
                                   window_factor=window_factor, window=window,
                                   bytes_per_weight=bytes_per_weight, bytes_per_kv=bytes_per_kv, score_read=score_read)
    return scalar_or_array(np.asarray(tau / np.asarray(dt)))


# parameters: the paper's model's knobs (method §2), keyword-only, each with the paper's default
def throughput_multiplier_over_generation(method, tau, B, L, G, target, draft=None, *, k=4, hoi=PAPER_HOI,
                                          overlap=True, sink_size=1, window_factor=8, window=None,
                                          bytes_per_weight=1.0, bytes_per_kv=1.0, score_read=1.0):
    """The G-aware variant (method §2): the KV cache grows while G tokens are generated.

    AD time = sum over g < G of t_target(L + g). SD time = sum over rounds i = 0, tau, 2 tau,
    ... < G of k draft passes at L + i + j (j < k; sparse drafts hold min(L + i + j, Klen(L)))
    and one verification at L + i. Returns AD time / SD time. tau must be a scalar.
    """
    cfg = _config(method, target, draft, k, hoi, overlap, sink_size, window_factor, window, bytes_per_weight, bytes_per_kv,
                  score_read)
    if np.ndim(tau) != 0:
        raise ValueError(f"tau must be a scalar for the G-aware model, got shape {np.shape(tau)}")
    tau = float(_tau(tau, cfg.k))
    if not isinstance(G, (int, np.integer)) or isinstance(G, bool) or G < 1:
        raise ValueError(f"G must be a positive integer, got {G!r}")
    rounds = tau * np.arange(math.ceil(G / tau))
    rounds = rounds[rounds < G]  # (R,)
    batch, ad_tokens, _ = _kv_tokens(B, L, np.arange(G, dtype=float), cfg.cap)
    t_ad = _target_times(batch, ad_tokens, cfg)[0].sum(-1)
    _, verify_tokens, _ = _kv_tokens(B, L, rounds, cfg.cap)
    t_verify = _target_times(batch, verify_tokens, cfg)[1].sum(-1)
    draft_offsets = (rounds[:, None] + np.arange(cfg.k)).ravel()  # (R * k,)
    _, _, draft_tokens = _kv_tokens(B, L, draft_offsets, cfg.cap)
    t_draft = _draft_time(batch, draft_tokens, cfg).sum(-1)
    return scalar_or_array(t_ad / (t_draft + t_verify))
