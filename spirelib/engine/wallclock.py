"""Decoding throughput on the clock, and what the throughput model (method §2) predicts for it.

The paper models throughput and never measures it. `time_decoding` runs autoregressive
decoding (AD) and speculative decoding (SD) with each draft on the same contexts, after one
target prefill that every method shares (prefill is not decoding and is excluded), a warm-up
run and then `repeats` timed runs, keeping every run's decode seconds, tau and the split
between draft, verify and bookkeeping (`speculative.SectionTimer`). `bench decode` reports
the best run; notebook 09 the median and spread, next to `modeled_speedups`: the paper's
G-aware throughput model for the same shapes, the tau of the same runs, and this machine's
calibrated peak FLOP/s and memory bandwidth, and `profiled_speedups`: the profiled cost
model (`spirelib.modeling.profiled`), fitted by `profile` to timings of single forwards at a few shapes
(never to the speculative runs it is then judged on).
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from spirelib.engine.kvcache import DenseKVCache, SinkWindow
from spirelib.engine.sampling import probabilities, sample
from spirelib.engine.speculative import (
    Rows,
    SectionTimer,
    TargetPass,
    autoregressive_generate,
    prefill,
    speculative_capacity,
    speculative_generate,
    stream_entries,
)
from spirelib.engine.transformer import ModelConfig, Transformer
from spirelib.modeling import perfmodel, profiled

DECODE_SECTIONS = ("draft", "verify", "bookkeeping")


@dataclass
class DecodeTiming:
    """Timed runs of one method ("ad" or a draft's name) at one (batch, context)."""

    method: str
    batch: int
    context: int
    new_tokens: int
    seconds: list[float]  # decode seconds of each timed run
    taus: list[float]  # mean accepted + 1 over each run's rounds (1 for AD)
    rounds: list[int]  # rounds (AD: steps) of each run
    sections: list[dict[str, float]]  # seconds per section of each run
    prefill_s: float  # the shared target prefill (once)
    compiled: bool = False  # decoded through compiled graphs (`Transformer.compile_decoding`: static reads)

    @property
    def tokens_per_s(self) -> list[float]:
        return [self.batch * self.new_tokens / s for s in self.seconds]

    @property
    def best(self) -> int:
        """Index of the fastest run."""
        return min(range(len(self.seconds)), key=self.seconds.__getitem__)

    def split(self, run: int) -> dict[str, float]:
        """Fractions of run `run`'s decode time per section."""
        return {s: self.sections[run].get(s, 0.0) / self.seconds[run] for s in DECODE_SECTIONS}


def time_decoding(target: Transformer, factories: Mapping[str, Callable[[torch.Generator], object]],
                  contexts: torch.Tensor, new_tokens: int, *, k: int = 4, temperature: float = 1.0,
                  repeats: int = 3, include_ad: bool = True) -> list[DecodeTiming]:
    """AD and SD with every draft factory (`drafts.draft_factory`) on contexts (B, L): one timing each."""
    device = next(target.parameters()).device
    contexts = contexts.to(device)
    B, L = contexts.shape
    layers = stream_entries(factory(torch.Generator(device)) for factory in factories.values())
    timer = SectionTimer(device)  # synchronizes a GPU before and after: the prefill's own time
    with timer("prefill"):
        shared = prefill(target, contexts, capacity=speculative_capacity(L, new_tokens, k), layers=layers)
    prefill_s = timer.seconds["prefill"]
    methods = (["ad"] if include_ad else []) + list(factories)
    timings = []
    for method in methods:
        timing = DecodeTiming(method, B, L, new_tokens, [], [], [], [], prefill_s, target.compiled_decoding)
        for run in range(repeats + 1):  # run 0 warms up
            timer = SectionTimer(device)
            gen = torch.Generator(device).manual_seed(run)
            if method == "ad":
                autoregressive_generate(target, contexts, new_tokens, temperature=temperature, generator=gen,
                                        timer=timer, prefilled=shared)
                rounds, tau = new_tokens, 1.0
            else:
                out = speculative_generate(target, factories[method](gen), contexts, new_tokens, k=k,
                                           temperature=temperature, generator=gen, timer=timer, prefilled=shared)
                done = out.accepted[out.accepted >= 0]
                rounds, tau = out.accepted.shape[1], float((done + 1).double().mean())
            if run == 0:
                continue
            timing.seconds.append(sum(timer.seconds.get(s, 0.0) for s in DECODE_SECTIONS))
            timing.sections.append({s: timer.seconds.get(s, 0.0) for s in DECODE_SECTIONS})
            timing.rounds.append(rounds)
            timing.taus.append(tau)
        timings.append(timing)
    return timings


def modeled_speedups(timings: list[DecodeTiming], target: ModelConfig, drafts: Mapping[str, ModelConfig | None], *,
                     peak_flops: float, bandwidth: float, bytes_per_value: float, k: int = 4,
                     sparse: Mapping[str, SinkWindow] | None = None) -> list[dict]:
    """Measured vs modeled speedup over AD, one cell per SD timing with an AD timing at the
    same (batch, context). Measured: median over runs of SD tokens/s / AD tokens/s (runs
    paired in order), with the lowest and highest ratio. Modeled: the G-aware throughput
    model (method §2) with the runs' mean tau, HOI = peak / bandwidth, `bytes_per_value` for
    weights and KV, and each sparse draft's (`sparse[method]`) sink + window as its cache."""
    ad = {(t.batch, t.context): t for t in timings if t.method == "ad"}
    hoi = peak_flops / bandwidth
    cells = []
    for t in timings:
        base = ad.get((t.batch, t.context))
        if t.method == "ad" or base is None:
            continue
        ratios = [sd / a for sd, a in zip(t.tokens_per_s, base.tokens_per_s)]
        tau = statistics.fmean(t.taus)
        draft = drafts.get(t.method)
        pattern = (sparse or {}).get(t.method)
        cache = dict(sink_size=pattern.sink, window=pattern.window) if pattern else {}
        model = perfmodel.throughput_multiplier_over_generation(
            t.method, min(tau, k + 1.0), t.batch, t.context, t.new_tokens, target.shape(),
            None if draft is None else draft.shape(), k=k, hoi=hoi, window_factor=None,
            bytes_per_weight=bytes_per_value, bytes_per_kv=bytes_per_value, **cache)
        measured = statistics.median(ratios)
        cells.append({"method": t.method, "B": t.batch, "L": t.context, "tau": tau, "measured_speedup": measured,
                      "measured_low": min(ratios), "measured_high": max(ratios), "modeled_speedup": float(model),
                      "error": float(model) / measured - 1.0})
    return cells


def modeled_step_seconds(cfg: ModelConfig, batch: int, context: int, *, peak_flops: float, bandwidth: float,
                         bytes_per_value: float) -> float:
    """The throughput model's seconds for one AD step of `cfg` (method §2 cost over peak FLOP/s)."""
    cost = perfmodel.step_cost(cfg.shape(), batch, context, hoi=peak_flops / bandwidth,
                               bytes_per_weight=bytes_per_value, bytes_per_kv=bytes_per_value)
    return float(cost) / peak_flops


def flops_per_token(cfg: ModelConfig, context: int) -> dict[str, float]:
    """Matmul FLOPs of one decoded token: the body (what the model counts, 2 per body
    parameter) and what it ignores: attention over `context` keys and the unembedding."""
    return {"body": 2.0 * perfmodel.body_params(cfg),
            "attention": 4.0 * cfg.num_layers * cfg.n_q * cfg.d_head * context,  # q.k and p.v
            "unembedding": 2.0 * cfg.d_model * cfg.vocab_size}


# ---------------------------------------------------------------------------- the profiled model


def repeat_seconds(fn, repeats: int, before=None, device=None) -> list[float]:
    """Wall seconds of `repeats` calls of `fn` after one untimed warm-up call; `before()`, untimed,
    runs ahead of every call (e.g. what precedes the call in a round, leaving the caches as it does).
    On a CUDA `device` each call is timed to the end of its kernels."""
    sync = torch.cuda.synchronize if device is not None and torch.device(device).type == "cuda" else None
    times = []
    for i in range(repeats + 1):
        if before is not None:
            before()
        if sync:
            sync(device)
        start = time.perf_counter()
        fn()
        if sync:
            sync(device)
        if i:
            times.append(time.perf_counter() - start)
    return times


def _median_seconds(fn, repeats: int, before=None, device=None) -> float:
    return statistics.median(repeat_seconds(fn, repeats, before, device))


@torch.no_grad()
def profile_forwards(models: Mapping[str, Transformer], *, batches=(1, 16, 64), keys=(64, 256, 960), news=(1, 5),
                     repeats: int = 5) -> list[tuple[profiled.ForwardWork, float]]:
    """Median seconds of single cached forwards of every model at every (B, keys, new tokens):
    the profiling pass the profiled cost model is fitted to (random tokens: speed does not
    depend on them). A forward writes `new` tokens after `keys` cached positions per row."""
    samples = []
    for model in models.values():
        cfg = model.cfg
        param = next(model.parameters())
        for B, S, T in itertools.product(batches, keys, news):
            cache = model.new_cache(B, S + T)
            model.hidden(torch.randint(0, cfg.vocab_size, (B, S), device=param.device), cache=cache)
            tokens = torch.randint(0, cfg.vocab_size, (B, T), device=param.device)
            lengths = torch.full((B,), S, device=param.device)

            def step():
                cache.rollback(lengths)
                model(tokens, cache.next_positions(T), cache)

            work = profiled.forward_work(cfg.shape(), cfg.vocab_size, B, T, S + T, bytes_per_value=param.element_size())
            samples.append((work, _median_seconds(step, repeats, device=param.device)))
    return samples


@torch.no_grad()
def profile_bookkeeping(vocab_size: int, *, batches=(1, 16, 64), k: int = 4, repeats: int = 5,
                        device="cpu") -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """Median seconds of one round's bookkeeping as the engine runs it (`speculative.Rows.settle`:
    probabilities of the k + 1 target positions, rejection sampling, the emitted tokens, the
    rollback) and of one draft pass's sampling (probabilities and a draw from (B, V)) at every
    batch size: two lists of (logits, seconds)."""
    samples, draws = [], []
    gen = torch.Generator(device).manual_seed(0)
    for B in batches:
        logits = torch.randn(B, k + 1, vocab_size, device=device)
        q = torch.softmax(torch.randn(B, k, vocab_size, device=device), dim=-1)
        tokens = torch.randint(0, vocab_size, (B, k + 1), device=device)
        cache = DenseKVCache(1, B, 1, 2, 2 * k + 2, device=device)  # settle only rolls its lengths back
        positions = torch.arange(k + 1, device=device).expand(B, k + 1)

        def book():
            Rows.start(tokens[:, 0], 2 * (k + 1), k).settle(cache, tokens, positions, None, q, logits, 1.0, gen)

        samples.append((B * (k + 1) * vocab_size, _median_seconds(book, repeats, device=device)))
        draws.append((B * vocab_size, _median_seconds(lambda: sample(probabilities(logits[:, 0], 1.0), gen), repeats,
                                                      device=device)))
    return samples, draws


@torch.no_grad()
def profile_drafts(target: Transformer, factories: Mapping[str, Callable[[torch.Generator], object]], *,
                   batches=(1, 16, 64), keys=(64, 256, 960), k: int = 4,
                   repeats: int = 5) -> dict[str, list[tuple[int, int, float, float]]]:
    """Median seconds of each drafting method's own calls as the engine makes them, at every
    (B, context): `propose` (k passes after the pending token) and `accept` of k + 1 verified
    positions, after one target prefill per shape that every method shares (random tokens).
    Each call follows an untimed target verification, as in a round, so that it finds the
    caches as a round leaves them (the target's weights and keys/values in, the draft's partly
    out). Returns {method: [(B, context, propose seconds, accept seconds)]}."""
    device = next(target.parameters()).device
    drafts = {m: factory(torch.Generator(device).manual_seed(0)) for m, factory in factories.items()}
    layers = stream_entries(drafts.values())
    vocab = target.cfg.vocab_size
    out = {m: [] for m in factories}
    for B, L in itertools.product(batches, keys):
        contexts = torch.randint(0, vocab, (B, L), device=device)
        shared = prefill(target, contexts, capacity=speculative_capacity(L, k + 1, k), layers=layers)
        n = shared.cache.lengths.clone()  # (B,) the pending token's position
        tokens = torch.cat([shared.pending[:, None], torch.randint(0, vocab, (B, k), device=device)], dim=1)
        positions = n[:, None] + torch.arange(k + 1, device=device)  # (B, k+1)
        stream = target.residual_stream(tokens, positions, shared.cache, layers=layers) if layers else None
        verified = TargetPass(positions, tokens, torch.ones_like(tokens, dtype=torch.bool), n + k + 1, shared.cache,
                              stream, layers)  # every draft accepted: the most an accept writes

        def verify():
            shared.cache.rollback(n)
            target.hidden(tokens, positions, shared.cache)

        for method, draft in drafts.items():
            draft.begin(shared.verified, k)
            propose = _median_seconds(lambda: draft.propose(shared.pending, n, k), repeats, verify, device)
            out[method].append((B, L, propose, _median_seconds(lambda: draft.accept(verified), repeats, verify, device)))
    return out


def profile(target: Transformer, drafts: Mapping[str, Transformer] | None = None, *, peak_flops: float,
            bandwidth: float, k: int = 4,
            methods: Mapping[str, tuple[profiled.DraftShape, Callable[[torch.Generator], object]]] | None = None,
            **grid) -> tuple[profiled.ProfiledCost, list]:
    """Time single forwards of the target and the drafts' layer stacks (`profile_forwards`) and
    the bookkeeping; fit the profiled cost model; then, for every drafting method in `methods`
    ({method: (its DraftShape, its draft factory)}), time its own propose and accept calls (`profile_drafts`) and fit its
    `profiled.DraftOverhead`. Returns (cost, forward samples)."""
    samples = profile_forwards({"target": target, **(drafts or {})}, **grid)
    device = next(target.parameters()).device
    batches = grid.get("batches", (1, 16, 64))
    book, draws = profile_bookkeeping(target.cfg.vocab_size, batches=batches, k=k, device=device)
    cost = profiled.fit(samples, peak_flops=peak_flops, bandwidth=bandwidth, bookkeeping=book, sampling=draws)
    if methods:
        calls = profile_drafts(target, {m: factory for m, (_, factory) in methods.items()}, batches=batches,
                               keys=grid.get("keys", (64, 256, 960)), k=k, repeats=grid.get("repeats", 5))
        value_bytes = next(target.parameters()).element_size()
        cost = dataclasses.replace(cost, drafts={
            m: profiled.fit_draft(cost, shape, target.cfg.shape(), target.cfg.vocab_size, k, calls[m], value_bytes)
            for m, (shape, _) in methods.items()})
    return cost, samples


def profiled_speedups(timings: list[DecodeTiming], cost: profiled.ProfiledCost, target: ModelConfig,
                      drafts: Mapping[str, profiled.DraftShape], *, bytes_per_value: float, k: int = 4) -> dict:
    """The profiled model's SD speedup over AD for every SD timing with an AD timing at the
    same (batch, context), at the runs' mean tau: {(method, B, L): speedup}."""
    ad = {(t.batch, t.context) for t in timings if t.method == "ad"}
    return {(t.method, t.batch, t.context): profiled.speedup(
                cost, drafts[t.method], statistics.fmean(t.taus), target.shape(), target.vocab_size, t.batch,
                t.context, t.new_tokens, k, bytes_per_value)
            for t in timings if t.method != "ad" and (t.batch, t.context) in ad}
