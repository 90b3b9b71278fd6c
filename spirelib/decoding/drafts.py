"""The paper's drafts (method §4): a small separately trained model (vanilla SD), the
target drafting for itself over a sink + window of its own cache (MagicDec), and SPIRe's
draft model (`model.spire`) driven as one (`SpireDraft`).

All three implement `speculative.Draft`. Their k draft passes are sequential one-token
forwards; sampling uses the engine's temperature so that q is the distribution the
draft tokens were actually drawn from (what makes rejection sampling lossless).

The registry of drafting methods lives here too: a method is a name and a builder
(`register_method`), and `draft_factory` makes the per-batch draft factories the tau
measurement and the wall-clock timing use. "vanilla", "magicdec" and "spire" are registered
here, "guided" and "lookup" in their own modules (`decoding/__init__` imports them); a new
draft plugs in the same way.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from spirelib.decoding.sampling import draw
from spirelib.decoding.speculative import Draft, TargetPass
from spirelib.model.kvcache import SinkWindow, SinkWindowKVCache, reuse, static_buffer
from spirelib.model.spire import SpireDraftModel
from spirelib.model.transformer import ModelConfig, Transformer


def draft_tokens(step, first_logits: torch.Tensor, positions: torch.Tensor, k: int, temperature: float,
                 u: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample k tokens autoregressively from uniforms u (B, k, W) (None at T = 0): `first_logits`
    (B, V) predict position+1; `step(tokens (B,), positions (B,))` runs one draft pass and returns
    the next logits (B, V)."""
    tokens, probs = [], []
    logits = first_logits
    for j in range(k):
        token, q = draw(logits, temperature, None if u is None else u[:, j])  # (B,), (B, V)
        tokens.append(token)
        probs.append(q)
        if j < k - 1:
            logits = step(token, positions + 1 + j)
    return torch.stack(tokens, dim=1), torch.stack(probs, dim=1)


def _last_verified(verified: TargetPass, previous: torch.Tensor | None) -> torch.Tensor:
    """The token at the last verified position of each row (rows with none keep `previous`)."""
    count = verified.valid.long().sum(1)  # (B,)
    last = verified.tokens.gather(1, (count - 1).clamp(min=0)[:, None]).squeeze(1)
    return last if previous is None else torch.where(count > 0, last, previous)


def vanilla_draft_config(target: ModelConfig) -> ModelConfig:
    """The vanilla SD draft's shape (method §4): half the layers and half the width of the target
    (d_model, d_head and d_ff halved, same heads and vocabulary), about 1/8 of its body
    parameters (the paper's 8,390,656 for its 67,117,056 target)."""
    if target.num_layers < 2 or target.d_model % 2 or target.d_head % 4 or target.d_ff % 2:
        raise ValueError(f"cannot halve {target}: need >= 2 layers, even d_model and d_ff, d_head divisible by 4")
    return ModelConfig(vocab_size=target.vocab_size, num_layers=target.num_layers // 2, d_model=target.d_model // 2,
                       n_q_per_kv=target.n_q_per_kv, n_kv=target.n_kv, d_head=target.d_head // 2, d_ff=target.d_ff // 2,
                       rope_base=target.rope_base, norm_eps=target.norm_eps)


class VanillaDraft:
    """A separate, smaller transformer with its own dense cache (method §4, vanilla SD), or,
    with `sparse`, reading only sink + window of it (the ablation without target activations).

    It runs on verified tokens itself. After a round where all k drafts were accepted, the
    last draft token was never run through the draft; so every round's first pass runs the
    token before the pending one again together with the pending one (2 tokens), which
    covers both cases without per-row branching.
    """

    target_layers: tuple[int, ...] = ()  # reads no target activations

    def __init__(self, model: Transformer, temperature: float = 1.0, sparse: SinkWindow | None = None):
        self.model = model
        self.temperature = temperature
        self.sparse = sparse  # attend to sink + window only (a sparse draft trained that way)
        self.key = ("vanilla", id(model), sparse)

    def begin(self, verified: TargetPass, k: int) -> None:
        B = verified.tokens.shape[0]
        self.cache = self.model.new_cache(B, verified.cache.capacity, self.sparse)
        self.model.hidden(verified.tokens, verified.positions, self.cache, valid=verified.valid)  # fills the cache
        self.previous = static_buffer(self.model, ("previous", B), (B,), torch.long, verified.tokens.device)
        self.previous.copy_(_last_verified(verified, None))  # (B,) the token before the pending one

    def static_tensors(self) -> list[torch.Tensor]:
        return [*self.cache.static_tensors(), self.previous, *self.model.parameters()]

    def _step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(tokens[:, None], positions[:, None], self.cache)[:, -1]

    def propose(self, pending: torch.Tensor, positions: torch.Tensor, k: int, u: torch.Tensor | None):
        self.cache.rollback(positions - 1)
        pair = torch.stack([self.previous, pending], dim=1)  # (B, 2)
        first = self.model(pair, torch.stack([positions - 1, positions], dim=1), self.cache)[:, -1]
        return draft_tokens(self._step, first, positions, k, self.temperature, u)

    def accept(self, verified: TargetPass) -> None:
        self.previous.copy_(_last_verified(verified, self.previous))


MAGICDEC_RING = SinkWindow(1, 64)  # MagicDec's sink + window (method §3.4), its default


class MagicDecDraft:
    """Self-speculation (method §4, MagicDec): the target drafts while attending only to a sink +
    window of its own keys/values, copied from the target's cache for verified positions into
    a StreamingLLM ring (constant memory). `rope_mode="cache"` uses positions in the cache as
    MagicDec's implementation does; "original" keeps text positions."""

    target_layers: tuple[int, ...] = ()  # reads the target's cache, not its activations

    def __init__(self, target: Transformer, sparse: SinkWindow = MAGICDEC_RING, rope_mode: str = "cache",
                 temperature: float = 1.0):
        self.model = target
        self.sparse = sparse
        self.rope_mode = rope_mode
        self.temperature = temperature
        self.key = ("magicdec", id(target), sparse, rope_mode)

    def begin(self, verified: TargetPass, k: int) -> None:
        cfg = self.model.cfg
        param = next(self.model.parameters())
        B = verified.tokens.shape[0]

        def build():
            return SinkWindowKVCache(cfg.num_layers, B, cfg.n_kv, cfg.d_head, self.sparse, slack=k + 1,
                                     rope_mode=self.rope_mode, rope_base=cfg.rope_base, rope_scaling=cfg.rope_scaling,
                                     device=param.device, dtype=param.dtype)
        key = ("magicdec", B, k + 1, self.sparse, self.rope_mode)
        self.cache = reuse(self.model, key, build) if self.model.compiled_decoding else build()
        self.accept(verified)

    def static_tensors(self) -> list[torch.Tensor]:
        return self.cache.static_tensors()  # the target's weights are the engine's already

    def _step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(tokens[:, None], positions[:, None], self.cache)[:, -1]

    def propose(self, pending: torch.Tensor, positions: torch.Tensor, k: int, u: torch.Tensor | None):
        return draft_tokens(self._step, self._step(pending, positions), positions, k, self.temperature, u)

    def accept(self, verified: TargetPass) -> None:
        self.cache.ingest(verified.cache, verified.positions, verified.valid)
        self.cache.rollback(verified.lengths)


# ---------------------------------------------------------------------------- the method registry

DraftFactory = Callable[[], Draft]
"""Builds a fresh draft (one per batch; the engine hands it its uniforms every round)."""


@dataclass(frozen=True)
class DraftMethod:
    """A named way to draft: `build(target, model, temperature=, **options)` returns a Draft;
    `model` is the method's trained draft model (None if it has none)."""

    name: str
    build: Callable[..., Draft]
    needs_model: bool


DRAFT_METHODS: dict[str, DraftMethod] = {}


def register_method(name: str, build: Callable[..., Draft], *, needs_model: bool) -> None:
    """Make `name` measurable: `build(target, model, *, temperature, **options)` returns a fresh Draft."""
    DRAFT_METHODS[name] = DraftMethod(name, build, needs_model)


def draft_factory(method: str, target: Transformer, model: torch.nn.Module | None = None, *,
                  temperature: float, dtype: torch.dtype | None = None, **options) -> DraftFactory:
    """A factory of `method`'s drafts for `target` (and its trained draft `model`). The draft
    decodes in `dtype`, by default the target's (a bf16 target decodes with a bf16 copy of its
    fp32-trained draft: the target's activations and the draft's weights meet in one dtype)."""
    if method not in DRAFT_METHODS:
        raise ValueError(f"unknown method {method!r}; registered: {sorted(DRAFT_METHODS)}")
    spec = DRAFT_METHODS[method]
    if spec.needs_model and model is None:
        raise ValueError(f"method {method!r} needs its trained draft model")
    try:  # an unknown option fails here, before any decoding
        inspect.signature(spec.build).bind(target, model, temperature=temperature, **options)
    except TypeError as e:
        raise ValueError(f"method {method!r}: {e}") from None
    if model is not None:
        model = in_dtype(model, dtype or next(target.parameters()).dtype)
    return lambda: spec.build(target, model, temperature=temperature, **options)


def in_dtype(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`model` itself if its weights are in `dtype`, else a copy in `dtype` (decoding's copy of a
    draft trained in fp32), compiled for decoding if `model` is (a copy carries no compiled graph
    and no cache of its own: `Transformer.__getstate__`, `kvcache.PINNED`)."""
    if next(model.parameters()).dtype == dtype:
        return model
    twin = copy.deepcopy(model).to(dtype)
    if model.compiled_decoding:
        twin.compile_decoding()
    return twin


def _vanilla(target, model, *, temperature):
    return VanillaDraft(model, temperature=temperature)


def _magicdec(target, model, *, temperature, sink: int = 1, window: int = 64, rope_mode: str = "cache"):
    return MagicDecDraft(target, SinkWindow(sink, window), rope_mode=rope_mode, temperature=temperature)


register_method("vanilla", _vanilla, needs_model=True)
register_method("magicdec", _magicdec, needs_model=False)


class SpireDraft:
    """The SPIRe draft behind the engine's `Draft` protocol (method §3.5): after every
    verification, memory for the verified positions comes from the target activations that
    pass already computed; its cache stays sink + window (+ k + 1) sized."""

    def __init__(self, model: SpireDraftModel, temperature: float = 1.0):
        self.model = model
        self.target_layers = model.memory_layers
        self.temperature = temperature
        self.key = ("spire", id(model))

    def begin(self, verified: TargetPass, k: int) -> None:
        self.cache = self.model.new_cache(verified.tokens.shape[0], slack=k + 1)
        self.accept(verified)

    def static_tensors(self) -> list[torch.Tensor]:
        return [*self.cache.static_tensors(), *self.model.parameters()]

    def _step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model.step(tokens, positions, self.cache)

    def propose(self, pending: torch.Tensor, positions: torch.Tensor, k: int, u: torch.Tensor | None):
        return draft_tokens(self._step, self._step(pending, positions), positions, k, self.temperature, u)

    def accept(self, verified: TargetPass) -> None:
        self.model.write_target_memory(self.cache, verified.stream(self.target_layers), verified.positions,
                                       verified.valid)
        self.cache.rollback(verified.lengths)


def spire_draft(model: SpireDraftModel, temperature: float = 1.0):
    """The engine-facing draft for a trained model. Without target activations the draft is an
    ordinary pruned transformer reading its own sink + window cache."""
    if model.cfg.target_activations:
        return SpireDraft(model, temperature)
    return VanillaDraft(model.body, temperature, sparse=model.cfg.sparse)


def _spire(target, model, *, temperature):
    return spire_draft(model, temperature=temperature)


register_method("spire", _spire, needs_model=True)
