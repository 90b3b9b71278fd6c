"""What the target hands the drafts, and the prefill that starts every generation (method §3.5, 5).

`TargetPass`: one target forward as a draft sees it: its positions and tokens, which of them are
verified, the cache holding their keys and values, and the residual-stream entries the drafts asked
for (no draft runs a target pass of its own). `prefill`: the target's pass over all but the last
token of every context, into a cache sized for the generation (`speculative_capacity`), keeping
what the drafts will read (`prefill_needs`: their target layers, the attention of the last
queries); one `Prefill` serves several generations over the same contexts (`stage` rolls a
generation's cache back to the end of the contexts, or copies the prefill into the generation's
own, kept cache).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from spirelib.model.kvcache import DenseKVCache
from spirelib.model.transformer import Transformer


@dataclass
class TargetPass:
    """A target forward over `positions` (B, T); `valid` (B, T) marks the verified ones
    (accepted drafts and the pending token; prefill: the real context tokens)."""

    positions: torch.Tensor  # (B, T)
    tokens: torch.Tensor  # (B, T)
    valid: torch.Tensor  # (B, T) bool
    lengths: torch.Tensor  # (B,) verified positions per row after this pass
    cache: DenseKVCache  # the target's cache, holding these positions' keys/values
    layers: torch.Tensor | None  # (len(layer_ids), B, T, d_model): the residual-stream entries drafts asked for
    layer_ids: tuple[int, ...] = ()  # which entries `layers` holds (0: the embedding, i: after block i)

    def stream(self, ids: tuple[int, ...]) -> torch.Tensor:
        """The residual-stream entries `ids`, (len(ids), B, T, d_model), of those this pass kept."""
        missing = set(ids) - set(self.layer_ids)
        if missing:
            raise ValueError(f"the target pass kept residual-stream entries {self.layer_ids}, not {sorted(missing)}")
        if tuple(ids) == self.layer_ids[: len(ids)]:
            return self.layers[: len(ids)]  # a view: the common case, the draft's own entries first
        return self.layers[[self.layer_ids.index(i) for i in ids]]


@dataclass
class Prefill:
    """The target's pass over all but the last token of every context: its cache, what it
    computed (`verified`, handed to a draft's `begin`) and the pending last tokens (B,).

    One prefill serves several generations over the same contexts (e.g. every method of a
    tau measurement): decoding writes only positions after the context and starts by
    rolling the cache back to `verified.lengths`, so the context's keys stay intact; a
    generation whose draft reads the attention starts from the prefill's own (`scores`), not
    from the last verification of the generation before it.
    """

    cache: DenseKVCache
    verified: TargetPass
    pending: torch.Tensor  # (B,)
    scores: tuple[torch.Tensor, ...] = ()  # per layer (B, n_kv, capacity): the attention the prefill recorded

    def copy(self) -> Prefill:
        """The same prefill over a copy of its cache: generations that run at the same time
        (interleaved round by round) each need their own."""
        cache = self.cache.copy()
        return Prefill(cache, dataclasses.replace(self.verified, cache=cache), self.pending, self.scores)


def scored_queries(draft, k: int) -> int:
    """How many queries per row the target's cache records the attention of for `draft`
    (`DenseKVCache.record_scores`): a verification's k + 1 if the draft reads them, else none."""
    return k + 1 if getattr(draft, "reads_scores", False) else 0


def prefill_needs(drafts, k: int) -> dict:
    """What a prefill `drafts` share keeps, as `prefill`'s keywords: the target's residual-stream
    entries any of them reads (`Draft.target_layers`, sorted) and the attention scores any reads."""
    drafts = list(drafts)
    return {"layers": tuple(sorted({i for d in drafts for i in d.target_layers})),
            "scored": max((scored_queries(d, k) for d in drafts), default=0)}


def prefill(target: Transformer, contexts: torch.Tensor, lengths: torch.Tensor | None = None, *,
            capacity: int, layers: tuple[int, ...] = (), scored: int = 0, slot: tuple | None = None) -> Prefill:
    """Run all but the last token of every context (B, L) (right-padded to L when `lengths`
    (B,) is given) through a fresh target cache of `capacity` positions per row, keeping the
    residual-stream entries `layers` (what the drafts read: `Draft.target_layers`), no others,
    and the attention of the last `scored` queries per row if > 0 (`prefill_needs`). `slot`: the
    generation whose own cache this is, under compiled decoding (`Transformer.new_cache`)."""
    B, L = contexts.shape
    lengths = context_lengths(contexts, lengths)
    if int(lengths.min()) < 2:  # once per prefill, not per round
        raise ValueError("every context needs at least 2 tokens")
    cache = target.new_cache(B, capacity, scored=scored, slot=slot)
    positions = torch.arange(L - 1, device=contexts.device).expand(B, L - 1)
    valid = positions < (lengths - 1)[:, None]
    stream = None
    with torch.no_grad():
        if layers:
            stream = target.residual_stream(contexts[:, :-1], positions, cache, valid=valid, layers=tuple(layers))
        else:
            target.hidden(contexts[:, :-1], positions, cache, valid=valid)  # fills the cache; no logits
    pending = contexts.gather(1, (lengths - 1)[:, None]).squeeze(1)  # (B,)
    verified = TargetPass(positions, contexts[:, :-1], valid, cache.lengths.clone(), cache, stream, tuple(layers))
    return Prefill(cache, verified, pending, tuple(s.clone() for s in cache.scores))


def stage(prefilled: Prefill, capacity: int, layers: tuple[int, ...], scored: int = 0,
           own: DenseKVCache | None = None) -> DenseKVCache:
    """The cache a generation decodes in, after `prefilled`'s contexts: the prefill's own, or a
    copy of it into `own` (a generation whose rounds replay as graphs keeps its cache for the
    process: `Transformer.new_cache(slot=)`), rolled back to the end of the contexts, with the
    attention the prefill recorded if the generation reads it, recording that of `scored` queries
    per row from now on (none for a generation whose draft reads none)."""
    source = prefilled.cache
    if source.capacity < capacity:
        raise ValueError(f"the prefill's cache holds {source.capacity} positions per row; "
                         f"this generation needs {capacity}: prefill with capacity={capacity}")
    if not set(layers) <= set(prefilled.verified.layer_ids):
        raise ValueError(f"this draft reads the target's residual-stream entries {layers}: prefill with layers={layers}")
    if scored > source.scored and not source.scores:
        raise ValueError(f"this draft reads the verification's attention: prefill with scored={scored}")
    cache = source if own is None or own is source else own.load(source)
    cache.rollback(prefilled.verified.lengths)
    cache.scored = scored if cache.scores else 0
    if cache.scored:
        for now, recorded in zip(cache.scores, prefilled.scores):
            now.copy_(recorded)
    return cache


def speculative_capacity(context_length: int, max_new_tokens: int, k: int) -> int:
    """Target cache positions per row that speculative decoding needs: a row finishes at
    position <= L + G + k - 1 and, frozen, is still verified there (k more)."""
    return context_length + max_new_tokens + 2 * k


def context_lengths(contexts: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    if lengths is None:
        return torch.full((contexts.shape[0],), contexts.shape[1], device=contexts.device, dtype=torch.long)
    return lengths.to(device=contexts.device, dtype=torch.long)
