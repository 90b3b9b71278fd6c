"""The verification-guided sparse self-draft: the target drafts for itself, each layer and KV head
reading a sink, a recent window and the positions the last verification attended to most
(SparseSpec's PillarAttn, Vegas; docs/method.md §4), where MagicDec reads a fixed sink + window.

Every verification records, per layer and KV head, the attention its k + 1 queries paid to each
cached position (`DenseKVCache.record_scores`: a prefill records its last k + 1 queries'). After
it, `select` keeps the draft's `KVBudget`: the sink, the `window` positions before the pending
token and the `chosen` highest-scoring older positions, and `SelectedKVCache.fill` copies their keys and values from the
target's cache into the draft's; the draft's k passes read only those, plus its own tokens. With
the same total budget as MagicDec (`KVBudget.split` of MagicDec's sink + window) the two compare
like for like. Keys keep their original rotation, so the draft's attention over its entries is
exactly the target's attention restricted to them, and speculative sampling stays lossless.
"""

from __future__ import annotations

import torch

from spirelib.decoding.drafts import SelfDraft
from spirelib.decoding.prefill import TargetPass
from spirelib.model.kvcache import SelectedKVCache
from spirelib.model.transformer import Transformer
from spirelib.throughput.methods import MAGICDEC_BUDGET, KVBudget


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


GUIDED_BUDGET = KVBudget.split(MAGICDEC_BUDGET.entries)  # MagicDec's budget, split (module docstring)


class GuidedDraft(SelfDraft):
    """The verification-guided sparse self-draft behind the engine's `Draft` protocol (module
    docstring): `begin` and `accept` choose the entries from the verification's scores and fill
    the draft's cache; `propose` runs the target over them k times."""

    reads_scores = True

    def __init__(self, target: Transformer, budget: KVBudget = GUIDED_BUDGET, temperature: float = 1.0):
        if budget.chosen < 1:
            raise ValueError(f"the guided draft needs at least 1 chosen entry, got {budget}")
        super().__init__(target, budget, temperature, ("guided", id(target), budget))

    def _new_cache(self, batch: int, slack: int, device, dtype):
        cfg = self.model.cfg
        return SelectedKVCache(cfg.num_layers, batch, cfg.n_kv, cfg.d_head, self.budget.entries, slack=slack,
                               device=device, dtype=dtype)

    def accept(self, verified: TargetPass) -> None:
        source, b = verified.cache, self.budget
        lengths = verified.lengths.clamp(max=source.capacity)  # (B,) the verified positions per row
        chosen = [select(scores, lengths, b.sink, b.window, b.chosen) for scores in source.scores]
        self.cache.fill(source, [index for index, _ in chosen], chosen[0][1])
