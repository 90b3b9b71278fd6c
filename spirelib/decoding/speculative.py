"""Batched speculative decoding and its autoregressive reference (method §1, 3.5, 5).

B rows with ragged contexts decode in lockstep. A round: the draft proposes k tokens per
row, the target scores the pending token and the k drafts in one forward (k+1 positions),
rejection sampling accepts a prefix per row, and every cache rolls back per row by
resetting lengths. Rows stop independently at `max_new_tokens` (or end-of-text) while the
batch goes on: finished rows are frozen, their results ignored.

State between rounds, per row: the target's cache holds positions 0..n-1 and the *pending*
token at position n (emitted, not yet run through the target). After prefill of all but
the last context token, the last context token is pending.

The draft protocol (`Draft`) is what the engine sees of every draft: vanilla, MagicDec, SPIRe,
the verification-guided draft and prompt lookup.
Every target pass hands the draft a `TargetPass` with what the target already computed
for the newly verified positions, so no draft needs a target pass of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from spirelib.decoding.sampling import probabilities, sample, verify
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


class Draft(Protocol):
    """What the engine needs of a draft model."""

    target_layers: tuple[int, ...]  # residual-stream entries of the target the draft reads (SPIRe); () for none
    # A draft that reads which keys the verification attended to (`DenseKVCache.record_scores`, the
    # verification-guided draft) sets `reads_scores = True`; the engine reads it with getattr (default False).

    def begin(self, verified: TargetPass, k: int) -> None:
        """Start on fresh contexts; `verified` is the target's prefill pass."""

    def propose(self, pending: torch.Tensor, positions: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft k tokens after the pending tokens (B,) at positions (B,): tokens (B, k), probs (B, k, V)."""

    def accept(self, verified: TargetPass) -> None:
        """Learn which positions were verified; roll back to `verified.lengths`."""


@dataclass
class Generation:
    """Generated tokens (B, G) and, for speculative decoding, the accepted draft count of every
    round (B, R), -1 once a row had finished (method §8: tau = mean of accepted + 1)."""

    tokens: torch.Tensor
    accepted: torch.Tensor | None = None


class SectionTimer:
    """Accumulates time per named section (`with timer("verify"): ...`). On the CPU, wall time.
    On a GPU, the device's own time between a section's start and end: a CUDA event recorded at
    each on the current stream, their elapsed times read only when `seconds` is asked for, after
    the generation, with one synchronize for every section recorded since. Timing so adds no host
    sync to a generation, and AD and SD pay alike: a synchronize before and after every section, as
    timed before, made AD wait 4 times a token (2 sections) and SD 8 times a round (4 sections)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self._seconds: dict[str, float] = {}
        self._recorded: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []  # on the device, not read yet

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.device.type != "cuda":
            start = time.perf_counter()
            yield
            self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - start
            return
        stream = torch.cuda.current_stream(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        yield
        end.record(stream)
        self._recorded.append((name, start, end))

    @property
    def seconds(self) -> dict[str, float]:
        """Seconds per section so far; on a GPU this waits once for the device to finish the sections
        recorded since the last read."""
        if self._recorded:
            torch.cuda.synchronize(self.device)
        return self.finished_seconds()

    def finished_seconds(self) -> dict[str, float]:
        """Seconds per section of the sections the device has finished, without waiting for the rest:
        a look while a generation runs (`wallclock`'s round-by-round interleaving)."""
        while self._recorded and self._recorded[0][2].query():
            name, start, end = self._recorded.pop(0)
            self._seconds[name] = self._seconds.get(name, 0.0) + start.elapsed_time(end) / 1000  # ms
        return self._seconds


def _no_timer(name: str):
    return contextlib.nullcontext()


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
            capacity: int, layers: tuple[int, ...] = (), scored: int = 0) -> Prefill:
    """Run all but the last token of every context (B, L) (right-padded to L when `lengths`
    (B,) is given) through a fresh target cache of `capacity` positions per row, keeping the
    residual-stream entries `layers` (what the drafts read: `Draft.target_layers`), no others,
    and the attention of the last `scored` queries per row if > 0 (`prefill_needs`)."""
    B, L = contexts.shape
    lengths = _context_lengths(contexts, lengths)
    if int(lengths.min()) < 2:  # once per prefill, not per round
        raise ValueError("every context needs at least 2 tokens")
    cache = target.new_cache(B, capacity, scored=scored)
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


def _reuse(prefilled: Prefill, capacity: int, layers: tuple[int, ...], scored: int = 0
           ) -> tuple[DenseKVCache, torch.Tensor]:
    """The prefill's cache rolled back to the end of the contexts, with the attention the prefill
    recorded if the generation reads it, recording that of `scored` queries per row from now on
    (none for a generation whose draft reads none), and the pending tokens."""
    if prefilled.cache.capacity < capacity:
        raise ValueError(f"the prefill's cache holds {prefilled.cache.capacity} positions per row; "
                         f"this generation needs {capacity}: prefill with capacity={capacity}")
    if not set(layers) <= set(prefilled.verified.layer_ids):
        raise ValueError(f"this draft reads the target's residual-stream entries {layers}: prefill with layers={layers}")
    if scored > prefilled.cache.scored and not prefilled.cache.scores:
        raise ValueError(f"this draft reads the verification's attention: prefill with scored={scored}")
    prefilled.cache.rollback(prefilled.verified.lengths)
    prefilled.cache.scored = scored if prefilled.cache.scores else 0
    if prefilled.cache.scored:
        for now, recorded in zip(prefilled.cache.scores, prefilled.scores):
            now.copy_(recorded)
    return prefilled.cache, prefilled.pending


def speculative_capacity(context_length: int, max_new_tokens: int, k: int) -> int:
    """Target cache positions per row that speculative decoding needs: a row finishes at
    position <= L + G + k - 1 and, frozen, is still verified there (k more)."""
    return context_length + max_new_tokens + 2 * k


def _context_lengths(contexts: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    if lengths is None:
        return torch.full((contexts.shape[0],), contexts.shape[1], device=contexts.device, dtype=torch.long)
    return lengths.to(device=contexts.device, dtype=torch.long)


@dataclass
class Rows:
    """What speculative decoding keeps per row between rounds: the output so far, how many
    tokens each row has produced, which rows still decode, the pending tokens, and every
    round's accepted count."""

    out: torch.Tensor  # (B, G + k + 1) generated tokens, room for one overshooting round
    produced: torch.Tensor  # (B,)
    active: torch.Tensor  # (B,) bool
    pending: torch.Tensor  # (B,) emitted, not yet run through the target
    offsets: torch.Tensor  # (k + 1,) 0..k
    max_new_tokens: int
    rounds: list[torch.Tensor]  # per round (B,): accepted drafts, -1 for a finished row

    @classmethod
    def start(cls, pending: torch.Tensor, max_new_tokens: int, k: int) -> Rows:
        B, dev = pending.shape[0], pending.device
        return cls(torch.zeros(B, max_new_tokens + k + 1, dtype=torch.long, device=dev),
                   torch.zeros(B, dtype=torch.long, device=dev), torch.ones(B, dtype=torch.bool, device=dev),
                   pending, torch.arange(k + 1, device=dev), max_new_tokens, [])

    def settle(self, cache: DenseKVCache, tokens: torch.Tensor, positions: torch.Tensor, layers: torch.Tensor | None,
               q: torch.Tensor, logits: torch.Tensor, temperature: float, generator: torch.Generator | None,
               eos_token: int | None = None, layer_ids: tuple[int, ...] = ()) -> TargetPass:
        """A round's bookkeeping after the target scored `tokens` (B, k+1) (the pending token and
        k drafts) at `positions` (B, k+1) into `logits` (B, k+1, V): rejection sampling against
        the draft's probabilities q (B, k, V), the emitted tokens, the cache rolled back per row
        to the verified positions, the next pending tokens. Returns what was verified."""
        G, offsets, active = self.max_new_tokens, self.offsets, self.active
        drafts, n = tokens[:, 1:], positions[:, 0]
        n_acc, next_token = verify(drafts, q, logits, temperature, generator)
        n_acc = torch.where(active, n_acc, 0)
        emitted = torch.cat([drafts, drafts[:, :1]], dim=1).scatter(1, n_acc[:, None], next_token[:, None])  # (B, k+1)
        keep = (offsets <= n_acc[:, None]) & active[:, None]  # (B, k+1)
        if eos_token is not None:  # a row ends at its first end-of-text token
            eos = keep & (emitted == eos_token)
            keep &= (eos.long().cumsum(1) - eos.long()) == 0
            ended = eos.any(1)
        slots = (self.produced[:, None] + offsets).clamp(max=G + offsets.shape[0] - 1)
        self.out.scatter_(1, slots, torch.where(keep, emitted, self.out.gather(1, slots)))
        self.rounds.append(torch.where(active, n_acc, -1))
        self.produced += keep.sum(1)
        new_lengths = torch.where(active, n + n_acc + 1, n)
        cache.rollback(new_lengths)
        self.pending = torch.where(active, next_token, self.pending)
        verified = TargetPass(positions, tokens, (offsets <= n_acc[:, None]) & active[:, None], new_lengths, cache,
                              layers, layer_ids)
        self.active = active & (self.produced < G)
        if eos_token is not None:
            self.active &= ~ended
        return verified


def finish(rounds: Iterator[None]) -> Generation:
    """Run a generation's rounds (`speculative_rounds`, `autoregressive_rounds`) to the end: its result."""
    while True:
        try:
            next(rounds)
        except StopIteration as end:
            return end.value


def speculative_generate(target: Transformer, draft: Draft, contexts: torch.Tensor, max_new_tokens: int,
                         k: int = 4, **options) -> Generation:
    """Generate `max_new_tokens` per row after `contexts` (B, L) (right-padded to L when
    `lengths` (B,) is given) with speculative decoding; every token is a sample from the
    target at `temperature` (0: greedy), whatever the draft proposes. `prefilled`: the
    target's `prefill` of these same contexts, to share it between generations. Options:
    those of `speculative_rounds`."""
    return finish(speculative_rounds(target, draft, contexts, max_new_tokens, k, **options))


@torch.no_grad()
def speculative_rounds(
    target: Transformer,
    draft: Draft,
    contexts: torch.Tensor,
    max_new_tokens: int,
    k: int = 4,
    temperature: float = 1.0,
    lengths: torch.Tensor | None = None,
    eos_token: int | None = None,
    generator: torch.Generator | None = None,
    timer: SectionTimer | None = None,
    prefilled: Prefill | None = None,
) -> Iterator[None]:
    """`speculative_generate` a round at a time: the iterator pauses after every round and
    returns the `Generation` when done (`finish`), so that a caller can interleave generations
    round by round (`wallclock.time_cells`)."""
    timer = timer or _no_timer
    G = max_new_tokens
    wanted = tuple(draft.target_layers)  # the residual-stream entries the draft reads
    scored = scored_queries(draft, k)  # and the verification's attention, if it reads that
    last = target.cfg.num_layers  # the logits' entry
    stream_ids = wanted if last in wanted else (*wanted, last)
    with timer("prefill"):
        capacity = speculative_capacity(contexts.shape[1], G, k)
        if prefilled is None:
            prefilled = prefill(target, contexts, lengths, capacity=capacity, layers=wanted, scored=scored)
        cache, pending = _reuse(prefilled, capacity, wanted, scored)
        draft.begin(prefilled.verified, k)
    rows = Rows.start(pending, G, k)
    # A round emits at most k + 1 tokens per row, so no row is done before round ceil(G / (k + 1))
    # (an end-of-text token aside: finished rows are frozen, so rounds past their end change
    # nothing). Only from then on does the loop ask whether a row is still active: the one host
    # sync of a round, and none before.
    certain = -(-G // (k + 1))
    while len(rows.rounds) < certain or bool(rows.active.any()):
        n = cache.lengths  # (B,) position of the pending token (a view: the verification updates it)
        with timer("draft"):
            drafts, q = draft.propose(rows.pending, n, k)  # (B, k), (B, k, V)
        with timer("verify"):
            tokens = torch.cat([rows.pending[:, None], drafts], dim=1)  # (B, k+1)
            positions = n[:, None] + rows.offsets
            if wanted:
                layers = target.residual_stream(tokens, positions, cache, layers=stream_ids)  # (n_ids, B, k+1, d)
                logits = target.head(layers[stream_ids.index(last)])  # (B, k+1, V)
            else:
                layers, logits = None, target(tokens, positions, cache)
        with timer("bookkeeping"):
            verified = rows.settle(cache, tokens, positions, layers, q, logits, temperature, generator, eos_token,
                                   stream_ids if wanted else ())
        with timer("draft"):
            draft.accept(verified)
        yield
    cache.check()
    accepted = torch.stack(rows.rounds, dim=1)  # (B, R)
    if eos_token is not None:  # rounds run after every row had ended (before the loop looked) are dropped
        accepted = accepted[:, : int((accepted >= 0).any(0).nonzero().max()) + 1]
    return Generation(rows.out[:, :G], accepted)


def autoregressive_generate(target: Transformer, contexts: torch.Tensor, max_new_tokens: int,
                            **options) -> Generation:
    """The reference: one target forward per token, same sampling code (method §4, AD): the
    first token from the prefill's logits, then G - 1 forwards of one token. `prefilled`: the
    target's `prefill` of these same contexts (all but their last tokens), to share it; then G
    forwards. Options: those of `autoregressive_rounds`."""
    return finish(autoregressive_rounds(target, contexts, max_new_tokens, **options))


@torch.no_grad()
def autoregressive_rounds(
    target: Transformer,
    contexts: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    lengths: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    timer: SectionTimer | None = None,
    prefilled: Prefill | None = None,
) -> Iterator[None]:
    """`autoregressive_generate` a step at a time (pausing after each, like `speculative_rounds`).
    At temperature 0 a step's forward ends in the argmax (inside its compiled graph, under
    compiled decoding); otherwise it returns the logits, sampled here. Each step's token is copied
    into the generation's own buffer, which the next step reads: under CUDA graphs a replay's
    output lives in the graphs' pool until the next replay, of any graph, overwrites it."""
    timer = timer or _no_timer
    greedy = temperature == 0
    B = contexts.shape[0]
    tokens = torch.empty(B, max_new_tokens, dtype=torch.long, device=contexts.device)  # (B, G)

    def emit(out: torch.Tensor) -> torch.Tensor:  # a forward's `last_logits` -> the next tokens (B,)
        return out if greedy else sample(probabilities(out, temperature), generator)

    first = 0  # the next token to emit
    with timer("prefill"):
        capacity = contexts.shape[1] + max_new_tokens
        if prefilled is None:  # the whole contexts, the first new token read from the prefill's logits
            L = contexts.shape[1]
            lengths = _context_lengths(contexts, lengths)
            cache = target.new_cache(B, capacity)
            positions = torch.arange(L, device=contexts.device).expand(B, L)
            tokens[:, 0] = emit(target.last_logits(contexts, positions, cache, valid=positions < lengths[:, None],
                                                   last=lengths - 1, greedy=greedy))
            pending, first = tokens[:, :1], 1  # (B, 1)
        else:
            cache, pending = _reuse(prefilled, capacity, ())
            pending = pending[:, None]  # (B, 1)
        # Every step's position, decided once: a step's forward updates cache.lengths in place.
        positions = cache.lengths[:, None] + torch.arange(max_new_tokens - first, device=contexts.device)  # (B, G')
    for j in range(first, max_new_tokens):
        with timer("verify"):
            out = target.last_logits(pending, positions[:, j - first : j - first + 1], cache,
                                     greedy=greedy)  # (B,) | (B, V)
        with timer("bookkeeping"):
            tokens[:, j] = emit(out)
            pending = tokens[:, j : j + 1]  # (B, 1)
        yield
    cache.check()
    return Generation(tokens)
