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
for the newly verified positions, so no draft needs a target pass of its own; a generation starts
from a `Prefill` (both in `prefill`) and may be timed section by section (`sections`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from spirelib.decoding.graphs import GRAPHS, LateFlag, addresses
from spirelib.decoding.prefill import (
    Prefill,
    TargetPass,
    context_lengths,
    prefill,
    scored_queries,
    speculative_capacity,
    stage,
)
from spirelib.decoding.sampling import Noise, probabilities, sample, verify
from spirelib.decoding.sections import SectionTimer, no_timer
from spirelib.model.kvcache import DenseKVCache, reuse
from spirelib.model.transformer import Transformer


class Draft(Protocol):
    """What the engine needs of a draft model. `propose` and `accept` run inside a round, which
    under compiled decoding replays as one graph (`graphs`): they update the draft's state in
    place (`static_tensors`, kept at fixed addresses), never replace it, and ask the device nothing."""

    target_layers: tuple[int, ...]  # residual-stream entries of the target the draft reads (SPIRe); () for none
    key: tuple  # what its rounds' Python decides (kind, model, options): names its graph with its state's addresses
    # A draft that reads which keys the verification attended to (`DenseKVCache.record_scores`, the
    # verification-guided draft) sets `reads_scores = True`; the engine reads it with getattr (default False).

    def begin(self, verified: TargetPass, k: int) -> None:
        """Start on fresh contexts; `verified` is the target's prefill pass."""

    def propose(self, pending: torch.Tensor, positions: torch.Tensor, k: int,
                u: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft k tokens after the pending tokens (B,) at positions (B,), drawing from uniforms u
        (B, k, W) (None at temperature 0): tokens (B, k), probs (B, k, V)."""

    def accept(self, verified: TargetPass) -> None:
        """Learn which positions were verified; roll back to `verified.lengths`."""

    def static_tensors(self) -> list[torch.Tensor]:
        """Every tensor of its own that a round reads or writes (its caches' and buffers')."""


@dataclass
class Generation:
    """Generated tokens (B, G) and, for speculative decoding, the accepted draft count of every
    round (B, R), -1 once a row had finished (method §8: tau = mean of accepted + 1)."""

    tokens: torch.Tensor
    accepted: torch.Tensor | None = None


@dataclass(frozen=True)
class Options:
    """How a generation decodes besides its contexts, its G tokens a row and its k drafts a round
    (method §5): what a caller hands AD and SD alike (the generations of a timed cell after one
    shared prefill, `wallclock.time_cells`). `speculative_rounds` takes it as one value;
    `autoregressive_rounds` and both `..._generate` take its fields as keywords."""

    temperature: float = 1.0  # every token a sample from the target at it (0: greedy)
    lengths: torch.Tensor | None = None  # (B,): the contexts right-padded to L; None: every row L long
    generator: torch.Generator | None = None  # draws the generation's uniforms, all before its first round
    timer: SectionTimer | None = None  # its sections' seconds (`sections`)
    prefilled: Prefill | None = None  # the target's `prefill` of these same contexts, shared between generations


@dataclass
class Rows:
    """What decoding keeps per row between rounds, in place at fixed addresses (a round replayed as
    a graph reads and writes them there): the output so far, how many tokens each row has
    produced, which rows still decode, the pending tokens, every round's accepted count, and how
    many rounds have run. AD keeps the same with k = 0 (one token a step)."""

    out: torch.Tensor  # (B, G + k + 1) generated tokens, room for one overshooting round
    produced: torch.Tensor  # (B,)
    active: torch.Tensor  # (B,) bool
    pending: torch.Tensor  # (B,) emitted, not yet run through the target
    accepted: torch.Tensor  # (B, G + 1) accepted drafts per round, -1 for a finished row or a round not run
    step: torch.Tensor  # () rounds run so far
    finished: torch.Tensor  # () bool: no row is active any more
    offsets: torch.Tensor  # (k + 1,) 0..k
    max_new_tokens: int

    @classmethod
    def start(cls, batch: int, max_new_tokens: int, k: int, device) -> Rows:
        rows = cls(torch.zeros(batch, max_new_tokens + k + 1, dtype=torch.long, device=device),
                   torch.zeros(batch, dtype=torch.long, device=device), torch.ones(batch, dtype=torch.bool, device=device),
                   torch.zeros(batch, dtype=torch.long, device=device),
                   torch.full((batch, max_new_tokens + 1), -1, dtype=torch.long, device=device),
                   torch.zeros((), dtype=torch.long, device=device), torch.zeros((), dtype=torch.bool, device=device),
                   torch.arange(k + 1, device=device), max_new_tokens)
        for t in rows.static_tensors():
            torch._dynamo.mark_static_address(t)
        return rows

    def static_tensors(self) -> list[torch.Tensor]:
        return [self.out, self.produced, self.active, self.pending, self.accepted, self.step, self.finished]

    def reset(self) -> None:
        """Fresh rows, for the next generation of the same shape (`kvcache.reuse`)."""
        self.out.zero_()
        self.produced.zero_()
        self.active.fill_(True)
        self.accepted.fill_(-1)
        self.step.zero_()
        self.finished.zero_()

    def settle(self, tokens: torch.Tensor, positions: torch.Tensor, q: torch.Tensor, logits: torch.Tensor,
               temperature: float, u: torch.Tensor | None,
               eos_token: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' bookkeeping of a round (method §1) after the target scored `tokens` (B, k+1)
        (the pending token and k drafts) at `positions` (B, k+1) into `logits` (B, k+1, V):
        rejection sampling against the draft's probabilities q (B, k, V) from the uniforms u
        (B, 2, W), the emitted tokens, the next pending tokens, all in place. Returns what was
        verified: which positions (B, k+1) and the verified lengths (B,) the caches roll back to."""
        G, offsets, active = self.max_new_tokens, self.offsets, self.active.clone()
        drafts, n = tokens[:, 1:], positions[:, 0]
        n_acc, next_token = verify(drafts, q, logits, temperature, u)
        n_acc = torch.where(active, n_acc, 0)
        emitted = torch.cat([drafts, drafts[:, :1]], dim=1).scatter(1, n_acc[:, None], next_token[:, None])  # (B, k+1)
        keep = (offsets <= n_acc[:, None]) & active[:, None]  # (B, k+1)
        if eos_token is not None:  # a row ends at its first end-of-text token
            eos = keep & (emitted == eos_token)
            keep &= (eos.long().cumsum(1) - eos.long()) == 0
            ended = eos.any(1)
        slots = (self.produced[:, None] + offsets).clamp(max=G + offsets.shape[0] - 1)
        self.out.scatter_(1, slots, torch.where(keep, emitted, self.out.gather(1, slots)))
        column = self.step.clamp(max=self.accepted.shape[1] - 1).view(1)
        self.accepted.index_copy_(1, column, torch.where(active, n_acc, -1)[:, None])
        self.produced += keep.sum(1)
        new_lengths = torch.where(active, n + n_acc + 1, n)  # (B,)
        self.pending.copy_(torch.where(active, next_token, self.pending))
        verified = (offsets <= n_acc[:, None]) & active[:, None]  # (B, k+1)
        still = active & (self.produced < G)
        self.active.copy_(still & ~ended if eos_token is not None else still)
        self.finished.copy_(~self.active.any())
        self.step += 1
        return verified, new_lengths

    def emit(self, token: torch.Tensor) -> None:
        """An AD step's token (B,) for every row: written at `step`, pending next."""
        self.out.index_copy_(1, self.step.view(1), token[:, None])
        self.pending.copy_(token)
        self.step += 1

    def accepted_counts(self) -> torch.Tensor:
        """Every round's accepted count (B, R) up to the last round any row was active in (rounds
        run after every row had finished, which the late stop check allows, are dropped): one
        host sync, once per generation."""
        ran = (self.accepted >= 0).any(0)  # (G + 1,)
        return self.accepted[:, : int(ran.nonzero().max()) + 1 if bool(ran.any()) else 0].clone()


def finish(rounds: Iterator[None]) -> Generation:
    """Run a generation's rounds (`speculative_rounds`, `autoregressive_rounds`) to the end: its result."""
    while True:
        try:
            next(rounds)
        except StopIteration as end:
            return end.value


def speculative_generate(target: Transformer, draft: Draft, contexts: torch.Tensor, max_new_tokens: int,
                         k: int = 4, eos_token: int | None = None, **options) -> Generation:
    """Generate `max_new_tokens` per row after `contexts` (B, L) (right-padded to L when
    `lengths` (B,) is given) with speculative decoding; every token is a sample from the
    target at `temperature` (0: greedy), whatever the draft proposes. `prefilled`: the
    target's `prefill` of these same contexts, to share it between generations. Options:
    the fields of `Options`, as keywords; `eos_token`: as `speculative_rounds`'."""
    return finish(speculative_rounds(target, draft, contexts, max_new_tokens, k, Options(**options), eos_token))


@dataclass
class _Generation:
    """A generation's static state, pinned for the process under compiled decoding (the same
    buffers every generation of its shape and method, so its round's graph replays): the target's
    cache, the rows and the uniforms; `key` names its graph (`graphs.RoundGraphs.run`)."""

    cache: DenseKVCache
    rows: Rows
    noise: Noise
    key: tuple = ()


def _pinned(target: Transformer, slot: tuple, batch: int, steps: int, k: int, temperature: float,
            device) -> tuple[Rows, Noise]:
    """The rows and uniforms of a generation in `slot` (one per method), reused under compiled
    decoding (`kvcache.reuse`), new otherwise."""
    V = target.cfg.vocab_size

    def rows():
        return Rows.start(batch, steps, k, device)

    def noise():
        return Noise(steps + 1, batch, k + 2 if k else 1, V, temperature, device)
    if not target.compiled_decoding:
        return rows(), noise()
    return (reuse(target, ("rows", slot, batch, steps, k), rows),
            reuse(target, ("noise", slot, batch, steps, k, temperature == 0), noise))


def _prepared(target: Transformer, slot: tuple, contexts: torch.Tensor, options: Options, *,
              layers: tuple[int, ...], scored: int, steps: int, k: int) -> tuple[_Generation, Prefill]:
    """A generation's state after its prefill (its own, or `options.prefilled` staged into its cache)
    in a cache of `speculative_capacity` positions a row (AD's: k = 0) and its uniforms drawn; with
    the prefill it started from, its cache replaced by the generation's."""
    B, device = contexts.shape[0], contexts.device
    capacity = speculative_capacity(contexts.shape[1], steps, k)
    prefilled, own = options.prefilled, None
    if prefilled is None:  # into the generation's own cache
        prefilled = prefill(target, contexts, options.lengths, capacity=capacity, layers=layers, scored=scored,
                            slot=slot)
    elif target.compiled_decoding:  # copied into it
        own = target.new_cache(B, prefilled.cache.capacity, scored=scored, slot=slot)
    cache = stage(prefilled, capacity, layers, scored, own)
    rows, noise = _pinned(target, slot, B, steps, k, options.temperature, device)
    rows.reset()
    rows.pending.copy_(prefilled.pending)
    noise.draw(options.generator)
    state = _Generation(cache, rows, noise)
    return state, dataclasses.replace(prefilled, verified=dataclasses.replace(prefilled.verified, cache=cache))


def _sd_round(target: Transformer, draft: Draft, state: _Generation, k: int, temperature: float,
              eos_token: int | None, wanted: tuple[int, ...], timer) -> None:
    """One speculative round over `state`, in place (method §1, 3.5): the draft proposes k tokens,
    the target scores the pending token and them in one forward, rejection sampling accepts a
    prefix per row, the caches roll back, the draft catches up. No host sync and no new state, so
    that it replays as one graph."""
    cache, rows = state.cache, state.rows
    last = target.cfg.num_layers  # the logits' entry
    stream_ids = wanted if last in wanted else (*wanted, last)
    u = state.noise.at(rows.step)  # (B, k + 2, W) or None: this round's uniforms
    n = cache.lengths.clone()  # (B,) position of the pending token
    with timer("draft"):
        drafts, q = draft.propose(rows.pending, n, k, None if u is None else u[:, :k])  # (B, k), (B, k, V)
    with timer("verify"):
        tokens = torch.cat([rows.pending[:, None], drafts], dim=1)  # (B, k+1)
        positions = n[:, None] + rows.offsets
        if wanted:
            layers = target.residual_stream(tokens, positions, cache, layers=stream_ids)  # (n_ids, B, k+1, d)
            logits = target.head(layers[stream_ids.index(last)])  # (B, k+1, V)
        else:
            layers, logits = None, target(tokens, positions, cache)
    with timer("bookkeeping"):
        valid, lengths = rows.settle(tokens, positions, q, logits, temperature, None if u is None else u[:, k:],
                                     eos_token)  # (B, k+1), (B,)
        cache.rollback(lengths)
        verified = TargetPass(positions, tokens, valid, lengths, cache, layers, stream_ids if wanted else ())
    with timer("draft"):
        draft.accept(verified)


def _rounds(target: Transformer, state: _Generation, fn, args: tuple, timer) -> Callable[[], None]:
    """A callable that runs one round `fn(*args, timer)`: as a replayed graph (`graphs.GRAPHS`)
    where the target decodes through compiled graphs, timed whole on a device that captures it."""
    device = state.rows.out.device
    if not target.compiled_decoding:
        return lambda: fn(*args, timer)
    if not GRAPHS.captures(device):
        return lambda: GRAPHS.run(state.key, fn, *args, timer, device=device)

    def replay():
        with timer("round"):
            GRAPHS.run(state.key, fn, *args, no_timer, device=device)
    return replay


def _graph_key(target: Transformer, state: _Generation, kind: tuple, tensors) -> tuple:
    """What a generation's round graph depends on: `kind` (what its Python decided) and the
    addresses of every tensor it reads or writes (the models' weights, the caches, the rows, the uniforms)."""
    noise = [] if state.noise.buffer is None else [state.noise.buffer]
    return (kind, addresses([*target.parameters(), *state.cache.static_tensors(), *state.rows.static_tensors(),
                             *noise, *tensors]))


@torch.no_grad()
def speculative_rounds(
    target: Transformer,
    draft: Draft,
    contexts: torch.Tensor,
    max_new_tokens: int,
    k: int = 4,
    options: Options = Options(),
    eos_token: int | None = None,
) -> Iterator[None]:
    """`speculative_generate` a round at a time: the iterator pauses after every round and
    returns the `Generation` when done (`finish`), so that a caller can interleave generations
    round by round (`wallclock.time_cells`). `options.generator` draws the generation's uniforms,
    all of them before its first round (`sampling.Noise`); a row stops at `max_new_tokens` or at
    its first `eos_token`. Under compiled decoding a round is one graph replay (`graphs`) and its
    state the generation's own for the process (one per method and shape)."""
    timer, temperature = options.timer or no_timer, options.temperature
    G = max_new_tokens
    wanted = tuple(draft.target_layers)  # the residual-stream entries the draft reads
    scored = scored_queries(draft, k)  # and the verification's attention, if it reads that
    slot = ("sd", *draft.key)
    with timer("prefill"):
        state, started = _prepared(target, slot, contexts, options, layers=wanted, scored=scored, steps=G, k=k)
        draft.begin(started.verified, k)
    if target.compiled_decoding:
        state.key = _graph_key(target, state, (slot, k, G, temperature, eos_token), draft.static_tensors())
    round_ = _rounds(target, state, _sd_round, (target, draft, state, k, temperature, eos_token, wanted), timer)
    # A round emits at most k + 1 tokens per row, so no row is done before round ceil(G / (k + 1))
    # (an end-of-text token aside: finished rows are frozen, so rounds past their end change
    # nothing). From then on the loop reads whether any row is still active one round late
    # (`LateFlag`): a round never waits for the device.
    certain, flag, ran = -(-G // (k + 1)), LateFlag(contexts.device), 0
    while ran < certain or not flag.previous():
        round_()
        ran += 1
        flag.post(state.rows.finished)
        yield
    state.cache.check()
    return Generation(state.rows.out[:, :G].clone(), state.rows.accepted_counts())


def autoregressive_generate(target: Transformer, contexts: torch.Tensor, max_new_tokens: int,
                            **options) -> Generation:
    """The reference: one target forward per token, same sampling code (method §4, AD): the
    first token from the prefill's logits, then G - 1 forwards of one token. `prefilled`: the
    target's `prefill` of these same contexts (all but their last tokens), to share it; then G
    forwards. Options: those of `autoregressive_rounds`."""
    return finish(autoregressive_rounds(target, contexts, max_new_tokens, **options))


def _ad_step(target: Transformer, state: _Generation, temperature: float, timer) -> None:
    """One AD step over `state`, in place: the pending tokens' forward, its token drawn (at
    temperature 0 the argmax, inside the forward's graph), written and pending next."""
    cache, rows = state.cache, state.rows
    with timer("verify"):
        out = target.last_logits(rows.pending[:, None], cache.lengths[:, None].clone(), cache,
                                 greedy=temperature == 0)  # (B,) | (B, V)
    with timer("bookkeeping"):
        if temperature != 0:
            out = sample(probabilities(out, temperature), state.noise.at(rows.step)[:, 0])
        rows.emit(out)


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
    """`autoregressive_generate` a step at a time (pausing after each, like `speculative_rounds`),
    its keywords the fields of `Options`. Without `prefilled` the first token comes from the
    prefill's logits over the whole contexts; then one forward a token, each step one graph replay
    under compiled decoding (`graphs`), its token sampled inside it from uniforms drawn ahead
    (`sampling.Noise`)."""
    timer = timer or no_timer
    B, L = contexts.shape
    slot = ("ad",)
    with timer("prefill"):
        first = 0  # tokens emitted before the first step
        if prefilled is None:  # the whole contexts, the first new token read from the prefill's logits
            lengths = context_lengths(contexts, lengths)
            cache = target.new_cache(B, L + max_new_tokens, slot=slot)
            positions = torch.arange(L, device=contexts.device).expand(B, L)
            out = target.last_logits(contexts, positions, cache, valid=positions < lengths[:, None],
                                     last=lengths - 1, greedy=temperature == 0)  # (B,) | (B, V)
            rows, noise = _pinned(target, slot, B, max_new_tokens, 0, temperature, contexts.device)
            rows.reset()
            noise.draw(generator)
            state = _Generation(cache, rows, noise)
            rows.emit(out if temperature == 0 else sample(probabilities(out, temperature), noise.at(rows.step)[:, 0]))
            first = 1
        else:
            state, _ = _prepared(target, slot, contexts, Options(temperature, lengths, generator, timer, prefilled),
                                 layers=(), scored=0, steps=max_new_tokens, k=0)
    if target.compiled_decoding:
        state.key = _graph_key(target, state, (slot, max_new_tokens, temperature), [])
    step = _rounds(target, state, _ad_step, (target, state, temperature), timer)
    for _ in range(first, max_new_tokens):
        step()
        yield
    state.cache.check()
    return Generation(state.rows.out[:, :max_new_tokens].clone())
