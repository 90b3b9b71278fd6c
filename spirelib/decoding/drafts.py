"""The paper's drafts (method §4): a small separately trained model (vanilla SD), the
target drafting for itself over a sink + window of its own cache (MagicDec), and SPIRe's
draft model (`model.spire`) driven as one (`SpireDraft`).

All three implement `speculative.Draft`. Their k draft passes are sequential one-token
forwards; sampling uses the engine's temperature so that q is the distribution the
draft tokens were actually drawn from (what makes rejection sampling lossless). The
self-drafts (MagicDec here, the guided draft in `guided`) share `SelfDraft`: the target
drafting over a sparse cache of its own keys. Each method's builder is in `builders`.
"""

from __future__ import annotations

import copy

import torch

from spirelib.decoding.prefill import TargetPass
from spirelib.decoding.sampling import draw
from spirelib.model.config import SinkWindow
from spirelib.model.kvcache import SinkWindowKVCache, reuse, static_buffer
from spirelib.model.spire import SpireDraftModel
from spirelib.model.transformer import Transformer
from spirelib.throughput.methods import MAGICDEC_BUDGET, KVBudget


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


class SelfDraft:
    """The target drafting for itself over a sparse cache of its own keys (method §4): one cache
    per (batch, k) that `_new_cache` builds, pinned for the process under compiled decoding
    (`kvcache.reuse`), refilled by `accept` from each verification; the k passes are the target's
    one-token forwards over it. Subclasses say what the cache holds and how `accept` fills it."""

    target_layers: tuple[int, ...] = ()  # reads the target's cache, not its activations

    def __init__(self, target: Transformer, budget: KVBudget, temperature: float, key: tuple):
        self.model, self.budget, self.temperature, self.key = target, budget, temperature, key

    def _new_cache(self, batch: int, slack: int, device, dtype):
        raise NotImplementedError

    def begin(self, verified: TargetPass, k: int) -> None:
        param = next(self.model.parameters())
        B = verified.tokens.shape[0]

        def build():
            return self._new_cache(B, k + 1, param.device, param.dtype)
        self.cache = reuse(self.model, (*self.key, B, k + 1), build) if self.model.compiled_decoding else build()
        self.accept(verified)

    def static_tensors(self) -> list[torch.Tensor]:
        return self.cache.static_tensors()  # the target's weights (and scores) are the engine's already

    def _step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(tokens[:, None], positions[:, None], self.cache)[:, -1]

    def propose(self, pending: torch.Tensor, positions: torch.Tensor, k: int, u: torch.Tensor | None):
        return draft_tokens(self._step, self._step(pending, positions), positions, k, self.temperature, u)

    def accept(self, verified: TargetPass) -> None:
        raise NotImplementedError


class MagicDecDraft(SelfDraft):
    """Self-speculation (method §4, MagicDec): the target drafts while attending only to a sink +
    window of its own keys/values, copied from the target's cache for verified positions into
    a StreamingLLM ring (constant memory). `rope_mode="cache"` uses positions in the cache as
    MagicDec's implementation does; "original" keeps text positions."""

    def __init__(self, target: Transformer, budget: KVBudget = MAGICDEC_BUDGET, rope_mode: str = "cache",
                 temperature: float = 1.0):
        if budget.chosen:
            raise ValueError(f"MagicDec reads a sink and a window, no chosen entries; got {budget}")
        self.sparse = SinkWindow(budget.sink, budget.window)
        self.rope_mode = rope_mode
        super().__init__(target, budget, temperature, ("magicdec", id(target), self.sparse, rope_mode))

    def _new_cache(self, batch: int, slack: int, device, dtype):
        cfg = self.model.cfg
        return SinkWindowKVCache(cfg.num_layers, batch, cfg.n_kv, cfg.d_head, self.sparse, slack=slack,
                                 rope_mode=self.rope_mode, rope_base=cfg.rope_base, rope_scaling=cfg.rope_scaling,
                                 device=device, dtype=dtype)

    def accept(self, verified: TargetPass) -> None:
        self.cache.ingest(verified.cache, verified.positions, verified.valid)
        self.cache.rollback(verified.lengths)


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
