"""KV caches for batched decoding with ragged rows, and the attention visibility rule (method §2
"Klen", 3.4, 4). Every cache shares one mechanism (`KVCache`):

- `DenseKVCache`: slot = position; holds every position up to `capacity`.
- `SinkWindowKVCache` (StreamingLLM): `sink` first positions plus a ring over the most
  recent ones, `sink + window + slack` slots in all, so its memory never grows with the
  context; `rope_mode="cache"` emulates MagicDec's positions-in-cache.
- `SelectedKVCache`: the entries a draft chose from a dense cache, refilled every round.

Each stores, per slot, the position of the key it holds (`key_positions`, -1 = empty), and
visibility is decided from positions alone (`visibility`), so ragged rows, rollback and
eviction need no special cases.
"""

from __future__ import annotations

import copy
import math
import weakref

import torch
from torch.nn.attention.flex_attention import BlockMask

from spirelib.model.config import SinkWindow
from spirelib.model.rope import apply_rope, rope_rotation

#: Key slots per block of a live-length read (`DenseKVCache.live_mask`): FlexAttention's default block.
LIVE_BLOCK = 128


def visibility(
    q_pos: torch.Tensor, k_pos: torch.Tensor, sparse: SinkWindow | None, include_self: bool = True
) -> torch.Tensor:
    """Which keys each query may attend to: (B, 1, T, S) bool.

    q_pos (B, T) are the query positions, k_pos (B, S) the key positions (-1 = empty slot).
    Causal: keys at earlier positions, and the query's own position if `include_self`
    (an ordinary transformer) but not for SPIRe's memory, which at the query's position
    does not exist yet (method §9). With `sparse`, only the sink and the window before the query.
    """
    q = q_pos[:, :, None]  # (B, T, 1)
    k = k_pos[:, None, :]  # (B, 1, S)
    visible = (k >= 0) & ((k <= q) if include_self else (k < q))
    if sparse is not None:
        visible &= (k < sparse.sink) | (k >= q - sparse.window)
    return visible[:, None]  # (B, 1, T, S)


class KVCache:
    """Storage and bookkeeping shared by every cache: one trailing "trash" slot receives
    writes of positions that are not kept (padding of ragged inputs, evicted prefill); no read
    covers it (it never holds a visible key, and at a capacity of 2^n one slot more would cost
    attention kernels that work in blocks of keys a whole block more).

    Every forward calls `prepare(positions)` once, which records where the new keys go, then each
    layer `write`s its keys/values and reads them back with `layer_kv`. A compiled forward runs
    `prepare` in two parts: `plan` on the host before its graph (what only the host decides),
    `register` inside it; the bookkeeping tensors are updated in place at fixed addresses, so that
    a CUDA graph replays them and keeps no output of its own in the cache. Rollback only resets
    `lengths`: rejected entries stay in place, are invisible to every query before their position,
    and are overwritten by the next write at the same positions (writes always continue at
    `lengths`, per row). Keys are stored already rotated by their original position.
    `slack` (of a cache with a ring) must cover the most positions one forward writes (k + 1 for a
    verify pass) so that writes never evict a key a query of the same forward still needs."""

    sparse: SinkWindow | None = None

    def __init__(self, num_layers: int, batch: int, n_kv: int, d_head: int, slots: int, *, device=None, dtype=torch.float32):
        # One tensor per layer (B, n_kv, S+1, d_head), not one (layers, ...) tensor: a compiled forward
        # (`Transformer.compile_decoding`) writes a layer in place; into a view of a bigger tensor it copies it.
        self.k = [torch.zeros(batch, n_kv, slots + 1, d_head, device=device, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(batch, n_kv, slots + 1, d_head, device=device, dtype=dtype) for _ in range(num_layers)]
        self.key_positions = torch.full((batch, slots + 1), -1, device=device, dtype=torch.long)  # (B, S+1)
        self.lengths = torch.zeros(batch, device=device, dtype=torch.long)  # (B,) positions 0..len-1 valid
        self._rows = torch.arange(batch, device=device)[:, None]  # (B, 1)
        self.trash = slots
        for t in KVCache.static_tensors(self):  # a compiled forward writes them in place: CUDA graphs keep their addresses
            torch._dynamo.mark_static_address(t)

    def static_tensors(self) -> list[torch.Tensor]:
        """Every tensor a compiled forward updates in place: keys, values and the bookkeeping."""
        return [*self.k, *self.v, self.key_positions, self.lengths]

    def reset(self) -> None:
        """Empty again, for the next batch of the same shape (`reuse`): no key is visible."""
        self.key_positions.fill_(-1)
        self.lengths.zero_()

    @property
    def batch(self) -> int:
        return self.key_positions.shape[0]

    def next_positions(self, num_tokens: int) -> torch.Tensor:
        """Positions (B, T) that continue every row."""
        return self.lengths[:, None] + torch.arange(num_tokens, device=self.lengths.device)

    def _slots(self, positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def prepare(self, positions: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Register keys at `positions` (B, T) (entries with `valid` False are dropped);
        returns the slots (B, T) every layer then writes to. Rows end at their last valid
        position + 1. `plan`, then `register`."""
        self.plan(positions, valid)
        return self.register(positions, valid)

    def plan(self, positions: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """What the host decides about a forward over `positions` before it runs (outside any
        compiled graph): nothing here; the dense cache's first forward (`DenseKVCache.plan`)."""

    def register(self, positions: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """`prepare`'s tensor work, in place (inside a compiled forward): the slots (B, T) of
        `positions`, their key positions and the rows' lengths. `positions` must not be a view of
        `lengths`, which this updates."""
        if valid is None:
            valid = torch.ones_like(positions, dtype=torch.bool)
        slots = self._slots(positions, valid)
        self.key_positions[self._rows, slots] = torch.where(valid, positions, -1)
        self.key_positions[:, self.trash] = -1
        last = torch.where(valid, positions, -1).amax(dim=1)
        self.lengths.copy_(torch.where(last >= 0, last + 1, self.lengths))
        return slots

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store keys/values (B, n_kv, T, d_head) of one layer at `slots` (B, T)."""
        self.k[layer][self._rows, :, slots] = k.transpose(1, 2)
        self.v[layer][self._rows, :, slots] = v.transpose(1, 2)

    def layer_kv(self, layer: int, q_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, n_kv, S', d_head) of one layer as queries at q_pos (B, T) see them:
        all S slots but the trash, or (dense cache) those a first forward over 0..T-1 wrote."""
        return self.k[layer][:, :, : self.trash], self.v[layer][:, :, : self.trash]

    def record_scores(self, layer: int, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor) -> None:
        """Keep what this forward's queries attend to, for a draft that chooses its keys by it
        (`DenseKVCache.record_scores`); nothing here."""

    def mask(self, q_pos: torch.Tensor, include_self: bool = True) -> torch.Tensor | None:
        """Visibility (B, 1, T, S') of the slots `layer_kv` returns for queries at q_pos (B, T);
        None means causal (query t sees keys 0..t; only where T queries read T keys)."""
        return visibility(q_pos, self.key_positions[:, : self.trash], self.sparse, include_self)

    def rollback(self, lengths: torch.Tensor) -> None:
        """Forget positions >= lengths (B,) per row; free (the entries are overwritten later)."""
        self.lengths.copy_(lengths)

    def copy(self):
        """An independent cache holding the same entries, in its own storage (static addresses
        too: CUDA graphs record their replays over a copy anew, rather than skip them)."""
        twin = copy.copy(self)
        for name, value in vars(self).items():
            if name != "_rows" and isinstance(value, torch.Tensor):
                setattr(twin, name, value.clone())
            elif isinstance(value, list) and all(isinstance(t, torch.Tensor) for t in value):  # per layer
                setattr(twin, name, [t.clone() for t in value])
        for t in twin.static_tensors():
            torch._dynamo.mark_static_address(t)
        return twin


#: What each model decoding through compiled graphs keeps for the process (`reuse`), by key; held
#: beside the model, not on it, so a copy of the model (`drafts.in_dtype`) starts with none.
PINNED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def reuse(owner, key, build):
    """The state `owner` (a model decoding through compiled graphs) built for `key`, emptied (its
    `reset`, where it has one), or a new one from `build()`. A round replayed as a graph reads and
    writes the buffers it was recorded over, so a compiled model keeps its caches, and a
    generation's rows and uniforms, per key for the whole process (`graphs.RoundGraphs`: a new
    buffer would record a new graph); the key names the generation they serve (`slot`) wherever
    two may decode at once. The previous user of a key must be done with it."""
    pool = PINNED.setdefault(owner, {})
    state = pool.get(key)
    if state is None:
        state = pool[key] = build()
    elif hasattr(state, "reset"):
        state.reset()
    return state


def static_buffer(owner, key, shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    """A buffer a decoding round updates in place (a draft's own state): kept per `key` by `owner`
    (a `Transformer`) while it decodes through compiled graphs (`reuse`), new otherwise; a static
    address either way, as a graph's in-place writes must be."""
    def build():
        t = torch.zeros(shape, dtype=dtype, device=device)
        torch._dynamo.mark_static_address(t)
        return t
    return reuse(owner, key, build) if owner.compiled_decoding else build()


def release(owner) -> None:
    """Drop every cache and buffer `owner` keeps (`reuse`): between benchmarks of other shapes."""
    PINNED.pop(owner, None)


class DenseKVCache(KVCache):
    """Every position 0..capacity-1 of every row. With `sparse`, reads see only sink + window
    (the slow, obviously correct way to run sparse attention; a reference in tests).

    Decode-time forwards read the whole capacity (not the trash slot), the slots not yet written
    masked out: every
    forward of a kind has the same shapes (one compiled graph serves them all,
    `Transformer.compile_decoding`) and none asks the device how far the rows have come, so a
    forward makes no host sync. Writing a position at or beyond the capacity is caught on the
    device (the entry goes to the trash slot) and reported by `check` (the engine calls it once
    per generation). Prefill fast path: when the cache's first forward writes positions 0..T-1
    with a valid prefix per row (a prefill of right-padded contexts), the mask is plain causal
    (None) over those T slots, so attention skips the masked half; deciding that costs one host
    sync, once per cache.
    """

    # parameters: the cache's shape (layers, rows, heads, head width, slots), then keyword-only options
    def __init__(self, num_layers: int, batch: int, n_kv: int, d_head: int, capacity: int, *,
                 sparse: SinkWindow | None = None, scored: int = 0, live_reads: bool = False, device=None,
                 dtype=torch.float32):
        super().__init__(num_layers, batch, n_kv, d_head, capacity, device=device, dtype=dtype)
        self.capacity = capacity
        self.sparse = sparse
        # Decode-time reads through a block mask (`live_mask`): attention reads the key blocks up to
        # the furthest query's position, not the whole capacity (a split-KV kernel on a GPU).
        self.live_reads = live_reads
        # `scored` > 0: every forward records, per layer, how much its last `scored` queries per row
        # attend to each slot (`record_scores`), what a verification-guided draft chooses its keys by.
        self.scored = scored
        self.scores = [torch.zeros(batch, n_kv, capacity, device=device, dtype=torch.float32)
                       for _ in range(num_layers if scored else 0)]  # per layer (B, n_kv, capacity)
        for t in self.scores:
            torch._dynamo.mark_static_address(t)
        self._written = False
        self._read = capacity  # slots that reads cover
        self._causal = False  # this forward is a first one over 0..T-1: attention is plain causal
        self._overflow = torch.zeros((), dtype=torch.long, device=device)  # the highest position refused, or 0
        torch._dynamo.mark_static_address(self._overflow)

    def static_tensors(self) -> list[torch.Tensor]:
        return [*super().static_tensors(), self._overflow, *self.scores]

    def record_scores(self, layer: int, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor) -> None:
        """With `scored` > 0: the attention the last `scored` valid queries of each row (of q (B,
        n_q, T, d_head) at q_pos (B, T)) pay to each of the keys k (B, n_kv, S, d_head) they see,
        summed over those queries and over the query heads that share a KV head, into
        `scores[layer]` (B, n_kv, capacity). A verification's k + 1 queries are all scored; of a
        prefill, the last k + 1 of each row. The fused attention kernels return no probabilities,
        so they are computed again here: the scored queries' logits over every key, one more read
        of the layer's keys (docs/method.md §2, the verification-guided draft)."""
        if not self.scored:
            return
        B, n_q, T, d_head = q.shape
        n_kv, S, m = k.shape[1], k.shape[2], min(T, self.scored)
        last = self.lengths - 1 - q_pos[:, 0]  # (B,) each row's last valid query of this forward
        index = (last[:, None] - (m - 1) + torch.arange(m, device=q.device)).clamp(min=0)  # (B, m)
        queries = q.gather(2, index[:, None, :, None].expand(B, n_q, m, d_head))  # (B, n_q, m, d_head)
        logits = queries.view(B, n_kv, (n_q // n_kv) * m, d_head) @ k.transpose(2, 3)  # (B, n_kv, g m, S)
        visible = visibility(q_pos.gather(1, index), self.key_positions[:, :S], None)  # (B, 1, m, S)
        visible = visible.repeat(1, 1, n_q // n_kv, 1)  # (B, 1, g m, S): row g * m + i is group g's query i
        probs = (logits.float() / math.sqrt(d_head)).masked_fill(~visible, -math.inf).softmax(-1)
        self.scores[layer].copy_(torch.nn.functional.pad(probs.sum(2), (0, self.capacity - S)))

    def _slots(self, positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        beyond = valid & (positions >= self.capacity)
        self._overflow.copy_(torch.maximum(self._overflow, torch.where(beyond, positions, 0).amax()))
        return torch.where(valid & ~beyond, positions, self.trash)

    def reset(self) -> None:
        super().reset()
        self._written, self._read, self._causal = False, self.capacity, False
        self._overflow.zero_()

    def load(self, source: DenseKVCache) -> DenseKVCache:
        """This cache, holding `source`'s entries, copied in place (a generation's own cache, at
        the addresses its graphs replay over, after a prefill it shares); `source`'s shape."""
        for mine, theirs in zip([*self.k, *self.v, self.key_positions, self.lengths, self._overflow],
                                [*source.k, *source.v, source.key_positions, source.lengths, source._overflow]):
            mine.copy_(theirs)
        self._written, self._read, self._causal = True, self.capacity, False
        return self

    def check(self) -> None:
        """Raise if any forward since the cache was made wrote past its capacity (a host sync)."""
        top = int(self._overflow)
        if top:
            raise ValueError(f"position {top} exceeds the cache capacity {self.capacity}")

    def plan(self, positions: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """The first forward, if it writes positions 0..T-1 with a valid prefix per row, reads
        only its own T slots, plain causal (one host sync, once per cache); every later one reads
        the whole capacity, masked."""
        T = positions.shape[1]
        first = not self._written and T <= self.capacity and bool(
            (positions == torch.arange(T, device=positions.device)).all()
            & (True if valid is None else (valid[:, 1:] <= valid[:, :-1]).all()))  # padding only at the ends
        self._causal = first
        self._read = T if first else self.capacity
        self._written = True

    def layer_kv(self, layer: int, q_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer][:, :, : self._read], self.v[layer][:, :, : self._read]

    def mask(self, q_pos: torch.Tensor, include_self: bool = True) -> torch.Tensor | BlockMask | None:
        if self._causal and include_self and self.sparse is None:
            return None  # a prefill: causal over its own keys
        if self.live_reads:
            return self.live_mask(q_pos, include_self)
        return visibility(q_pos, self.key_positions[:, : self._read], self.sparse, include_self)

    def live_mask(self, q_pos: torch.Tensor, include_self: bool = True) -> BlockMask:
        """`visibility` as a FlexAttention block mask over the `_read` slots, whose kernel reads, per
        row, only the key blocks of `LIVE_BLOCK` slots up to the row's furthest query (slot =
        position: no later slot holds a key the row's queries see), so its work grows with the live
        length, not the capacity, and the kernel splits the live keys across the GPU (FlexAttention's
        decoding kernel); its shapes stay static, so a round's graph replays it at any length."""
        B, T = q_pos.shape
        S = self._read
        blocks = -(-S // LIVE_BLOCK)
        live = (q_pos.amax(1) // LIVE_BLOCK + 1).clamp(max=blocks)  # (B,) key blocks a row reads
        counts = live.view(B, 1, 1).to(torch.int32)  # (B, 1 head, 1 query block)
        order = torch.arange(blocks, device=q_pos.device, dtype=torch.int32).expand(B, 1, 1, blocks)
        keys, sparse = self.key_positions, self.sparse

        def visible(b, h, q, kv):  # `visibility`, one (query, key) at a time
            k, p = keys[b, kv], q_pos[b, q]
            seen = (k >= 0) & ((k <= p) if include_self else (k < p))
            return seen if sparse is None else seen & ((k < sparse.sink) | (k >= p - sparse.window))
        return BlockMask.from_kv_blocks(counts, order.contiguous(), BLOCK_SIZE=(max(T, 1), LIVE_BLOCK),
                                        mask_mod=visible, seq_lengths=(T, S))


class SinkWindowKVCache(KVCache):
    """StreamingLLM cache: `sink` first positions plus a ring of `window + slack` recent ones.

    `rope_mode="original"` keeps original-text positions (SPIRe, method §3.4);
    `rope_mode="cache"` reads keys as if positions were indices in a cache holding exactly
    sink + window + the query (MagicDec's implementation): window keys keep their distance
    to the query, and the sink moves up to sit just before the window. That re-rotation
    depends on the query, so "cache" mode serves one query position per row (drafting).
    """

    # parameters: the cache's shape (layers, rows, heads, head width, pattern), then keyword-only options
    def __init__(self, num_layers: int, batch: int, n_kv: int, d_head: int, sparse: SinkWindow, slack: int, *,
                 rope_mode: str = "original", rope_base: float = 10000.0, rope_scaling: tuple | None = None,
                 device=None, dtype=torch.float32):
        if rope_mode not in ("original", "cache"):
            raise ValueError(f"rope_mode must be 'original' or 'cache', got {rope_mode!r}")
        if slack < 1:
            raise ValueError(f"slack must be >= 1 (the most positions one forward writes), got {slack}")
        self.ring = sparse.window + slack
        super().__init__(num_layers, batch, n_kv, d_head, sparse.sink + self.ring, device=device, dtype=dtype)
        self.sparse = sparse
        self.slack = slack
        self.rope_mode = rope_mode
        self.rope_base = rope_base
        self.rope_scaling = rope_scaling

    def _slots(self, positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        sink = self.sparse.sink
        slots = torch.where(positions < sink, positions, sink + (positions - sink) % self.ring)
        # Of a long run of new positions only the sink and the last `ring` survive; the rest
        # would collide in the ring, so they go to the trash slot.
        last = torch.where(valid, positions, -1).amax(dim=1, keepdim=True)  # (B, 1)
        kept = valid & ((positions < sink) | (positions > last - self.ring))
        return torch.where(kept, slots, self.trash)

    def layer_kv(self, layer: int, q_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = super().layer_kv(layer, q_pos)
        if self.rope_mode == "original" or self.sparse.sink == 0:
            return k, v
        if q_pos.shape[1] != 1:
            raise ValueError("rope_mode='cache' re-rotates the sink per query: use it for one query per row")
        sink = self.sparse.sink
        # The query sits at cache index sink + window; a sink key i then sits at distance
        # sink + window - i instead of q - i: rotate it forward by q - window - sink (>= 0).
        shift = (q_pos - self.sparse.window - sink).clamp(min=0).expand(-1, sink)  # (B, sink)
        rotation = rope_rotation(shift, k.shape[-1], self.rope_base, self.rope_scaling)  # (B, 1, sink, d_head/2)
        k = torch.cat((apply_rope(k[:, :, :sink], rotation), k[:, :, sink:]), dim=2)
        return k, v

    def ingest(self, source: DenseKVCache, positions: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """Copy every layer's keys/values at `positions` (B, T) from a dense cache (a target's
        verified positions into its own sparse drafting cache; a prefill)."""
        slots = self.prepare(positions, valid)
        src = positions.clamp(0, source.capacity - 1)  # dropped entries read anything, land in trash
        for layer in range(len(self.k)):
            self.write(layer, slots, source.k[layer][self._rows, :, src].transpose(1, 2),
                       source.v[layer][self._rows, :, src].transpose(1, 2))


class SelectedKVCache(KVCache):
    """A drafting cache refilled every round with entries a draft chose from a dense cache, each
    layer and KV head its own (`fill`: the verification-guided draft, `decoding.guided`), plus a
    ring of `slack` slots for the draft's own tokens. Keys keep their original rotation. Every
    chosen entry precedes every draft query, so visibility needs only whether a slot holds one:
    a chosen slot's `key_positions` is 0 (its positions differ per head; 0 precedes every query),
    an empty one's -1; the ring's slots hold their tokens' positions (causal among the drafts)."""

    def __init__(self, num_layers: int, batch: int, n_kv: int, d_head: int, budget: int, slack: int, *,
                 device=None, dtype=torch.float32):
        if budget < 1 or slack < 1:
            raise ValueError(f"SelectedKVCache needs budget >= 1 and slack >= 1, got {budget}, {slack}")
        super().__init__(num_layers, batch, n_kv, d_head, budget + slack, device=device, dtype=dtype)
        self.budget, self.slack = budget, slack

    def _slots(self, positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        return torch.where(valid, self.budget + positions % self.slack, self.trash)

    def fill(self, source: DenseKVCache, index: list[torch.Tensor], chosen: torch.Tensor) -> None:
        """Every layer's chosen entries of `source`: `index[layer]` (B, n_kv, budget) the source
        slots, `chosen` (B, budget) which of them hold an entry; the ring is emptied and the rows'
        lengths become the source's."""
        d_head = self.k[0].shape[-1]
        for layer, idx in enumerate(index):
            gather = idx[..., None].expand(-1, -1, -1, d_head)  # (B, n_kv, budget, d_head)
            self.k[layer][:, :, : self.budget] = source.k[layer].gather(2, gather)
            self.v[layer][:, :, : self.budget] = source.v[layer].gather(2, gather)
        self.key_positions[:, : self.budget] = torch.where(chosen, 0, -1)
        self.key_positions[:, self.budget :] = -1
        self.lengths.copy_(source.lengths)
