"""The verification-guided sparse self-draft: the target drafts for itself, each layer and KV head
reading a sink, a recent window and the positions the last verification attended to most
(SparseSpec's PillarAttn, Vegas; docs/method.md §4), where MagicDec reads a fixed sink + window.

Every verification records, per layer and KV head, the attention its k + 1 queries paid to each
cached position (`DenseKVCache.record_scores`: a prefill records its last k + 1 queries'). After
it, `select` keeps the sink, the `window` positions before the pending token and the `top`
highest-scoring older positions, and `SelectedKVCache.fill` copies their keys and values from the
target's cache into the draft's; the draft's k passes read only those, plus its own tokens. With
the same total budget as MagicDec (sink + window + top = MagicDec's sink + window) the two compare
like for like. Keys keep their original rotation, so the draft's attention over its entries is
exactly the target's attention restricted to them, and speculative sampling stays lossless.
"""

from __future__ import annotations

import torch

from spirelib.decoding.drafts import draft_tokens, register_method
from spirelib.decoding.speculative import TargetPass
from spirelib.model.kvcache import SelectedKVCache, reuse
from spirelib.model.transformer import Transformer


def budget_options(entries: int, sink: int = 1) -> dict[str, int]:
    """The draft's options at a KV budget of `entries` per layer and KV head (method §4; MagicDec's
    sink + window for a like-for-like comparison): the sink, and the rest split into a recent window
    and the entries chosen by attention, half each (the window takes an odd one)."""
    rest = entries - sink
    if rest < 2:
        raise ValueError(f"a KV budget of {entries} leaves {rest} entries past the sink of {sink}: the guided draft "
                         "needs at least a window of 1 and 1 chosen entry; give a budget of at least sink + 2")
    return {"sink": sink, "window": rest - rest // 2, "top": rest // 2}


def select(scores: torch.Tensor, lengths: torch.Tensor, sink: int, window: int, top: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries a draft reads, from one layer's scores (B, n_kv, C) of a cache whose rows hold
    positions 0..lengths-1 (B,): (index (B, n_kv, sink + window + top) of cache slots, chosen (B,
    sink + window + top), whether each holds an entry). The sink's positions, then the `window`
    positions before `lengths` (those not in the sink), then per KV head the `top` best-scoring
    positions between them (fewer where fewer exist: the rest not chosen)."""
    B, n_kv, C = scores.shape
    device = scores.device
    positions = torch.arange(C, device=device)
    older = (positions >= sink) & (positions[None, :] < (lengths - window)[:, None])  # (B, C) between sink and window
    best = scores.masked_fill(~older[:, None, :], -torch.inf).topk(top, dim=-1).indices  # (B, n_kv, top)
    sinks = torch.arange(sink, device=device).expand(B, sink)  # (B, sink)
    recent = lengths[:, None] - window + torch.arange(window, device=device)  # (B, window)
    index = torch.cat((sinks[:, None].expand(B, n_kv, sink), recent.clamp(min=0)[:, None].expand(B, n_kv, window),
                       best), dim=2)
    chosen = torch.cat((sinks < lengths[:, None], recent >= sink,
                        torch.arange(top, device=device)[None, :] < (lengths - window - sink)[:, None]), dim=1)
    return index, chosen


class GuidedDraft:
    """The verification-guided sparse self-draft behind the engine's `Draft` protocol (module
    docstring): `begin` and `accept` choose the entries from the verification's scores and fill
    the draft's cache; `propose` runs the target over them k times."""

    target_layers: tuple[int, ...] = ()  # reads the target's cache and its attention, not its activations
    reads_scores = True

    def __init__(self, target: Transformer, sink: int = 1, window: int = 32, top: int = 32, temperature: float = 1.0):
        if sink < 0 or window < 1 or top < 1:
            raise ValueError(f"the guided draft needs sink >= 0, window >= 1 and top >= 1, got {sink}, {window}, {top}")
        self.model, self.sink, self.window, self.top = target, sink, window, top
        self.temperature = temperature
        self.key = ("guided", id(target), sink, window, top)

    def begin(self, verified: TargetPass, k: int) -> None:
        cfg, param = self.model.cfg, next(self.model.parameters())
        B, budget = verified.tokens.shape[0], self.sink + self.window + self.top

        def build():
            return SelectedKVCache(cfg.num_layers, B, cfg.n_kv, cfg.d_head, budget, slack=k + 1, device=param.device,
                                   dtype=param.dtype)
        key = ("guided", B, budget, k + 1)
        self.cache = reuse(self.model, key, build) if self.model.compiled_decoding else build()
        self.accept(verified)

    def static_tensors(self) -> list[torch.Tensor]:
        return self.cache.static_tensors()  # the target's weights and scores are the engine's already

    def _step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(tokens[:, None], positions[:, None], self.cache)[:, -1]

    def propose(self, pending: torch.Tensor, positions: torch.Tensor, k: int, u: torch.Tensor | None):
        return draft_tokens(self._step, self._step(pending, positions), positions, k, self.temperature, u)

    def accept(self, verified: TargetPass) -> None:
        source = verified.cache
        lengths = verified.lengths.clamp(max=source.capacity)  # (B,) the verified positions per row
        chosen = [select(scores, lengths, self.sink, self.window, self.top) for scores in source.scores]
        self.cache.fill(source, [index for index, _ in chosen], chosen[0][1])


def _guided(target, model, *, temperature, sink: int = 1, window: int = 32, top: int = 32):
    return GuidedDraft(target, sink, window, top, temperature=temperature)


register_method("guided", _guided, needs_model=False)
