"""`spire bench decode`: batched decoding throughput, AD vs SD with each draft.

At every context length L and batch size B: one target prefill of B random contexts, shared by
every method, then G new tokens per row by autoregressive decoding (AD) and by speculative
decoding with each draft, best of `--repeats` (`run_case`): tokens/s, time per round, tau and the
split between draft, verify and bookkeeping. Goal: bookkeeping under 10% at B = 64. Weights are
random (speed does not depend on them), so tau, and with it SD's tokens/s, is not a trained
model's: per-round time is what carries over, and tokens/s = tau / round.

`--roofline` times every forward kind and each method's whole round against this machine's
roofline of the bytes each reads (a dense cache's whole capacity; `roofline_rows`); `--profiled`
judges the profiled cost model as notebook 09 does (`profiled_rows`). `--dtype bf16` decodes in
bf16. Runs that would not fit the free memory are refused first (`memory_problems`). Measured
results, dated, with the machine and the command: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import torch

from spirelib.bench import (
    DTYPES,
    MODEL_OPTIONS,
    add_model_arguments,
    device_problems,
    model_config,
    positive,
    replayed,
    torch_dtype,
)
from spirelib.bench.decode_memory import memory_problems
from spirelib.bench.decode_models import TIMED, build_methods, compile_all, draft_options
from spirelib.bench.roofline import (
    WARM_ROUNDS,
    RooflineTiming,
    capacities,
    forward_shapes,
    kv_budgets,
    model_cfgs,
    roofline_row,
    rooflines,
    round_count,
    round_forwards,
    round_tokens,
    step_kind,
    verify_kind,
)
from spirelib.decoding.builders import draft_factory
from spirelib.decoding.eagle3 import Eagle3Draft
from spirelib.decoding.prefill import TargetPass
from spirelib.decoding.speculative import Options, autoregressive_rounds, speculative_rounds
from spirelib.measure.stopping import SpeedupRule
from spirelib.measure.tau import DecodingProtocol
from spirelib.measure.wallclock import (
    loop_timings,
    profiled_cells,
    profiled_draft_shapes,
    profiled_verdict,
    repeat_seconds,
    time_cells,
)
from spirelib.model.config import SpireConfig, vanilla_draft_config
from spirelib.model.transformer import Transformer
from spirelib.throughput import profile_fit
from spirelib.throughput.hardware import Machine
from spirelib.throughput.profiled import PricedTarget
from spirelib.throughput.recorded import RecordedCell


def decoding(args: argparse.Namespace) -> DecodingProtocol:
    """What the benchmark's generations decode: `--new-tokens`, `-k` and `--temperature`."""
    return DecodingProtocol(args.k, args.new_tokens, args.temperature)


def time_case(target: Transformer, factories: dict, methods: list[str], cells: list[tuple[int, int]],
              protocol: DecodingProtocol, rule: SpeedupRule, **more) -> list:
    """Every method at every (B, L) of `cells`: `wallclock.time_cells` over fresh random contexts
    every run, each cell stopped by `rule`."""
    def random_contexts(batch: int, context: int):
        return lambda run: torch.randint(0, target.cfg.vocab_size, (batch, context),
                                         generator=torch.Generator().manual_seed(run))

    return time_cells(target, {m: factories[m] for m in methods if m != "ad"},
                      [random_contexts(B, L) for B, L in cells], protocol, rule, include_ad="ad" in methods, **more)


def run_case(target: Transformer, factories: dict, methods: list[str], batch: int, context: int,
             protocol: DecodingProtocol, repeats: int, interleave: str = "rounds") -> list[dict]:
    """Every method at one (B, L), best of `repeats`: rows of results. Per method: generated
    tokens/s of the decode phase (B x G / decode time, prefill excluded), the time of one round
    (one token step for AD), tau, the shared prefill's seconds (timed once, as in the tau
    protocol) and the split of decode time between draft, verify and bookkeeping (sampling,
    rejection, rollback, gathers; `sections.SectionTimer`). Timings are wall clock; on a
    machine shared with other jobs, best-of-n is the fair figure."""
    timings = time_case(target, factories, methods, [(batch, context)], protocol, SpeedupRule(repeats, repeats),
                        interleave=interleave)
    rows = []
    for t in timings:
        best = t.best
        rows.append({"method": t.method, "batch": batch, "context": context,
                     "tokens_per_s": t.tokens_per_s[best], "round_ms": 1e3 * t.seconds[best] / t.rounds[best],
                     "rounds": t.rounds[best], "tau": t.taus[best], "prefill_s": t.prefill_s, "split": t.split(best)})
    return rows


def _in_dtype(target: Transformer, machine: Machine) -> None:
    """Refuses a `machine` priced at other bytes per value than the target's weights take."""
    weights = next(target.parameters()).element_size()
    if machine.bytes_per_value != weights:
        raise ValueError(f"the roofline's machine prices {machine.bytes_per_value} bytes a value; the target's "
                         f"weights take {weights}: build it in the target's dtype")


@torch.no_grad()
def forward_rows(target: Transformer, models: dict, batch: int, context: int, k: int, window: int,
                 timing: RooflineTiming) -> list[dict]:
    """One `roofline_row` per forward kind of `forward_shapes` at (B, L), each forward timed alone as
    `timing` says (`wallclock.repeat_seconds`: one untimed call first, which compiles where compiled), its cache
    rolled back before every call, each dense cache as large as the one `round_rows`' generations
    read (`capacities`). `models`: `build_methods`' vanilla and SPIRe draft models. Each budgeted
    self-draft (`methods.BUDGETED`) steps the target over the cache its `begin` filled from the
    prefill (the guided draft: the entries it chose from the prefill's scores)."""
    machine, repeats = timing.machine, timing.repeats
    _in_dtype(target, machine)
    cfg, param = target.cfg, next(target.parameters())
    dev = param.device
    vanilla, spire = models["vanilla"], models["spire"]
    capacity = capacities(context, k, round_count(repeats))
    budgets = kv_budgets(window)
    kinds = forward_shapes(model_cfgs(target.cfg), context, k, budgets, capacity)
    tokens = torch.randint(0, cfg.vocab_size, (batch, context + k + 1), device=dev)  # (B, L + k + 1)

    def dense(model, slots: int, scored: int = 0):  # scored: records the last `scored` queries' scores
        cache = model.new_cache(batch, slots, scored=scored)
        model.hidden(tokens[:, :context], cache=cache)
        return cache

    lengths = torch.full((batch,), context, device=dev)  # (B,)
    ad_cache, target_cache = dense(target, capacity["ad"]), dense(target, capacity["sd"])
    vanilla_cache, scored_cache = dense(vanilla, capacity["sd"]), dense(target, capacity["sd"], scored=k + 1)
    prefilled = torch.arange(context, device=dev).expand(batch, context)  # (B, L)
    self_drafts = {m: draft_factory(m, target, temperature=0.0, **o)() for m, o in draft_options(window).items()}
    for draft in self_drafts.values():
        draft.begin(TargetPass(prefilled, tokens[:, :context], torch.ones_like(prefilled, dtype=torch.bool), lengths,
                               scored_cache, None), k)
    eagle3 = Eagle3Draft(models["eagle3"])
    stream = target.residual_stream(tokens[:, :context], layers=eagle3.target_layers)  # (3, B, L, d)
    eagle3.begin(TargetPass(prefilled, tokens[:, :context], torch.ones_like(prefilled, dtype=torch.bool), lengths,
                            target_cache, stream, eagle3.target_layers), k)
    memory = spire.new_cache(batch, slack=k + 1)
    spire.write_target_memory(memory, target.residual_stream(tokens[:, :context], layers=spire.memory_layers),
                              torch.arange(context, device=dev).expand(batch, context))
    pos = lengths[:, None]  # (B, 1)
    calls = {  # kind -> (the forward, what resets its cache)
        "AD step": (lambda: target(tokens[:, context:context + 1], pos, ad_cache), ad_cache),
        verify_kind(k, False): (lambda: target(tokens[:, context:], pos + torch.arange(k + 1, device=dev),
                                               target_cache), target_cache),
        verify_kind(k, True): (lambda: target(tokens[:, context:], pos + torch.arange(k + 1, device=dev),
                                              scored_cache), scored_cache),
        step_kind("vanilla"): (lambda: vanilla(tokens[:, context:context + 1], pos, vanilla_cache), vanilla_cache),
        **{step_kind(m): (lambda d=d: target(tokens[:, context:context + 1], pos, d.cache), d.cache)
           for m, d in self_drafts.items()},
        step_kind("spire"): (lambda: spire.step(tokens[:, context], lengths, memory), memory),
        step_kind("eagle3"): (lambda: eagle3.model.step(tokens[:, context], eagle3.feature, lengths, eagle3.cache),
                              eagle3.cache),
    }
    rows = []
    for kind, (call, cache) in calls.items():
        seconds = repeat_seconds(call, repeats, before=lambda cache=cache: cache.rollback(lengths), device=dev)
        work, useful = rooflines(kinds, [(kind, kinds[kind].new)], batch, machine)
        rows.append(roofline_row(kind, batch, context, seconds, work, useful, timing.compiled))
    return rows


@dataclass(frozen=True)
class RoundCell:
    """A (B, L) cell as the round benchmarks decode it: B rows of fresh random L-token contexts, k
    tokens drafted a round, drawn at `temperature` (0: greedy)."""

    batch: int
    context: int
    k: int
    temperature: float = 0.0


def round_generation(target: Transformer, factories: dict, method: str, cell: RoundCell, rounds: int, *, run: int,
                     timer=None):
    """A generation of `method` ("ad", or a draft of `factories`) of at least `rounds` rounds
    (`round_tokens`), a round at a time (`speculative_rounds`; AD: `autoregressive_rounds`, a round
    being one step), over fresh random contexts (B, L) of `cell` drawn from seed `run`; `timer`: a
    `sections.SectionTimer` for its sections (on a GPU, CUDA events around each round's replay)."""
    dev, k = next(target.parameters()).device, cell.k
    generator = torch.Generator(dev).manual_seed(run)
    contexts = torch.randint(0, target.cfg.vocab_size, (cell.batch, cell.context), device=dev, generator=generator)
    options = {"temperature": cell.temperature, "generator": generator, "timer": timer}
    if method == "ad":
        return autoregressive_rounds(target, contexts, round_tokens(method, rounds, k), **options)
    return speculative_rounds(target, factories[method](), contexts, round_tokens(method, rounds, k), k,
                              Options(**options))


def warm_up(target: Transformer, factories: dict, method: str, cell: RoundCell, rounds: int) -> None:
    """`WARM_ROUNDS` rounds of a `round_generation` of the shape about to be timed: its kernels
    compiled and, on a GPU, its round's graph recorded (on the key's second call), so that a later
    generation of that shape replays it (the same buffers: `kvcache.reuse`)."""
    warm = round_generation(target, factories, method, cell, rounds, run=0)
    for _ in range(WARM_ROUNDS):
        next(warm)
    warm.close()


@torch.no_grad()
def round_rows(target: Transformer, factories: dict, models: dict, methods: list[str], cell: RoundCell, window: int,
               timing: RooflineTiming) -> list[dict]:
    """One `roofline_row` per method's whole round at `cell`, as the engine decodes it, timed as `timing` says
    (`round_generation`): the draft's passes, the verification and the bookkeeping timed together,
    round by round, each between two synchronizes on a GPU. A first generation warms up (`warm_up`),
    then a second one's first round (it includes the prefill) is not timed and its next `repeats`
    are; a timing during which a round's graph was recorded is taken again (`bench.replayed`) or,
    still recording, flagged (`recorded`). The roofline is that of the round's forwards
    (`round_forwards`; bookkeeping has none) at context L over the caches the generations read
    (`capacities`); the useful one's live keys grow by at most (repeats + 1) x (k + 1) while timed."""
    machine, repeats = timing.machine, timing.repeats
    _in_dtype(target, machine)
    count = round_count(repeats)
    dev = next(target.parameters()).device
    batch, context, k = cell.batch, cell.context, cell.k
    kinds = forward_shapes(model_cfgs(target.cfg), context, k, kv_budgets(window), capacities(context, k, count))
    rows = []
    for method in methods:
        warm_up(target, factories, method, cell, count)

        def take(method=method) -> list[float]:
            timed = round_generation(target, factories, method, cell, count, run=1)
            seconds = repeat_seconds(lambda: next(timed), repeats, device=dev)
            timed.close()
            return seconds

        seconds, recorded = replayed(take)
        work, useful = rooflines(kinds, round_forwards(method, k), batch, machine)
        rows.append(roofline_row(f"{method} round", batch, context, seconds, work, useful, timing.compiled, recorded))
    return rows


def roofline_rows(target: Transformer, batch: int, context: int, k: int, window: int, timing: RooflineTiming, *,
                  temperature: float = 1.0, methods: list[str] = TIMED) -> list[dict]:
    """`forward_rows` and `round_rows` (every method of `methods`) at (B, L): every forward kind
    alone (the AD step, verification, each draft's step) and each method's whole round as the
    engine runs it (draft passes, verification and bookkeeping together), each against the roofline
    of `timing.machine` (this one's calibrated peak and bandwidth, the target's bytes per value: `roofline`). Each round row also
    gets `forwards_ms`, the sum of its forwards' measured ms (the vanilla draft's 2-token first
    pass counted as a step): a round's time beyond it is bookkeeping and host work.
    With `timing.compiled`, every model decodes through compiled graphs (`Transformer.compile_decoding`)."""
    factories, models = build_methods(target, list(TIMED), temperature, window)
    compile_all(target, models, timing.compiled)
    forwards = forward_rows(target, models, batch, context, k, window, timing)
    rounds = round_rows(target, factories, models, methods, RoundCell(batch, context, k, temperature), window, timing)
    measured = {r["kind"]: r["ms"] for r in forwards}
    for method, row in zip(methods, rounds):
        row["forwards_ms"] = sum(measured[kind] for kind, _ in round_forwards(method, k))
    return forwards + rounds


def profiled_rows(target: Transformer, factories: dict, methods: list[str], cells: list[tuple[int, int]],
                  held_out: list[tuple[int, int]], args: argparse.Namespace) -> tuple:
    """Time every (B, L) of `cells` as notebook 09 does (fresh random contexts every run, a cell
    stopped once every speedup is resolved, or when its `--cell-seconds` are up: `stopping.SpeedupRule`), calibrate this
    machine, fit the profiled model to every cell but `held_out` (default: the largest B at the
    longest L) with its peak and bandwidth pinned to that calibration, and compare every cell's
    measured speedup (and CI) with the model's: (the fitted `profiled.ProfiledCost`,
    `wallclock.profiled_cells`, `wallclock.profiled_verdict`: median, signed and held-out errors)."""
    from spirelib.measure.calibrate import matmul_peak, memory_bandwidth

    rule = SpeedupRule.from_repeats(args.repeats, args.max_repeats, SpeedupRule.width)  # the rule's default width
    timings = time_case(target, factories, methods, cells, decoding(args), rule, max_seconds=args.cell_seconds,
                        interleave=args.interleave)
    value_bytes = next(target.parameters()).element_size()
    machine = Machine(matmul_peak(device=args.device, dtype=torch_dtype(args.dtype))["flops"],
                      memory_bandwidth(device=args.device)["bandwidth"], value_bytes)
    spire = SpireConfig(window=args.window)
    cfgs = model_cfgs(target.cfg)
    shapes = profiled_draft_shapes({m: cfgs[m] for m in ("vanilla", "spire", "eagle3")}, kv_budgets(args.window), spire)
    seen = [t for t in timings if (t.batch, t.context) not in set(held_out)]
    cost = profile_fit.fit(loop_timings(seen), target=target.cfg.shape(), vocab_size=target.cfg.vocab_size,
                        drafts={m: shapes[m] for m in methods if m != "ad"}, k=args.k, machine=machine)
    priced = PricedTarget(target.cfg.shape(), target.cfg.vocab_size, value_bytes)
    rows = profiled_cells(timings, cost, priced, shapes, k=args.k, held_out=held_out)
    return cost, rows, profiled_verdict(rows)


def print_profiled(rows: list[RecordedCell], verdict: dict) -> None:
    print(f"{'L':>5} {'B':>3} {'method':9} {'measured':>8} {'95% CI':>13} {'runs':>4} {'profiled':>8} {'error':>7}"
          "  fit")
    for r in rows:
        print(f"{r.L:5d} {r.B:3d} {r.method:9} {r.measured_speedup:8.3f} {r.ci_low:6.3f}-{r.ci_high:6.3f} "
              f"{r.runs:4d} {r.profiled_speedup:8.3f} {r.profiled_error:+7.1%}  {'held out' if r.held_out else 'fitted'}")
    held = verdict["held_out_max_error"]
    print(f"profiled model: median error {verdict['median_error']:.1%}, "
          f"mean signed {verdict['mean_signed_error']:+.1%}, "
          f"fitted cells' median {verdict['fitted_median_error']:.1%}"
          + (f", held-out worst {held:.1%}" if held is not None else "")
          + f", {len(verdict['false_gains'])} predicted gains (>= 1.1x) that measured a loss; widest CI "
          f"+/-{verdict['widest_ci']:.1%}")


def print_roofline(rows: list[dict], peak_flops: float, bandwidth: float, dtype: str) -> None:
    print(f"roofline: {dtype} peak {peak_flops / 1e9:.0f} GFLOP/s, bandwidth {bandwidth / 1e9:.1f} GB/s (calibrated "
          "now); MB: what the kernels read (a dense cache's whole capacity, masked); '% useful': the roofline at the "
          "live keys alone, over the measured time; a round: its forwards' rooflines summed, 'fwd ms' the sum of its "
          "forwards timed alone; 'rec': round graphs recorded while timed (after retakes; not 0: not a replay's time)")
    print(f"{'L':>5} {'B':>3} {'forward / round':18} {'mode':8} {'ms':>8} {'GFLOP':>8} {'MB':>8} {'roof ms':>8}"
          f" {'x roof':>7} {'% roof':>7} {'% useful':>8} {'fwd ms':>8} {'rec':>3}")
    for r in rows:
        forwards = f"{r['forwards_ms']:8.2f}" if "forwards_ms" in r else f"{'':8}"
        print(f"{r['context']:5d} {r['batch']:3d} {r['kind']:18} {r['mode']:8} {r['ms']:8.2f} {r['gflop']:8.3f}"
              f" {r['mbytes']:8.1f} {r['roofline_ms']:8.3f} {r['ratio']:7.1f} {r['fraction']:7.1%}"
              f" {r['useful_fraction']:8.1%} {forwards} {r['recorded'] or '':>3}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--context", type=int, nargs="+", default=[256, 960])
    parser.add_argument("--new-tokens", type=int, default=64, help="G")
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--methods", nargs="+", choices=TIMED, default=list(TIMED))
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--window", type=int, default=64, help="sparse window (sink 1): MagicDec, SPIRe, guided")
    add_model_arguments(parser)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case (after one warm-up); best is kept")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32",
                        help="weights and caches (bf16: ~100x slower on the CPU)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--roofline", action="store_true",
                        help="every forward and whole round against the roofline")
    parser.add_argument("--compile", action="store_true",
                        help="also decode through compiled graphs, beside eager")
    parser.add_argument("--interleave", choices=("rounds", "runs"), default="rounds", metavar="HOW",
                        help="rounds: methods take turns per round; runs: per run")
    parser.add_argument("--profiled", action="store_true", help="fit the profiled cost model here, judge each cell")
    parser.add_argument("--held-out", type=int, nargs=2, action="append", metavar=("B", "L"),
                        help="--profiled: a held-out cell (default: largest B and L)")
    parser.add_argument("--max-repeats", type=int, default=30, help="--profiled: runs per cell at most (its second look)")
    parser.add_argument("--cell-seconds", type=float, default=20.0, help="--profiled: seconds per cell at most")


def profiled_grid(args: argparse.Namespace) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(every (B, L) cell `--profiled` times, the held-out ones among them)."""
    held = [tuple(c) for c in args.held_out] if args.held_out else [(max(args.batch), max(args.context))]
    grid = {(b, length) for b in args.batch for length in args.context}
    return sorted(grid | set(held), key=lambda c: (c[1], c[0])), held


def problems(args: argparse.Namespace) -> list[str]:
    out = positive(args, "batch", "context", "new_tokens", "k", "window", *MODEL_OPTIONS, "repeats")
    out += device_problems(args.device)
    if args.profiled:
        cells, held = profiled_grid(args)
        if "ad" not in args.methods:
            out.append("--profiled needs ad among --methods (the model is fitted to AD's steps)")
        out += [f"--profiled: {p}" for p in profile_fit.cell_problems(c for c in cells if c not in held)]
        if args.roofline or args.compile:
            out.append("--profiled times eager decoding alone: drop --roofline and --compile")
    if not out and not args.roofline:  # the memory the timed runs hold, once the shapes are valid
        cells = profiled_grid(args)[0] if args.profiled else [(B, L) for B in args.batch for L in args.context]
        out += [f"--{'profiled' if args.profiled else 'interleave'}: {p}" for p in memory_problems(args, cells)]
    return out


def main(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = model_config(args)
    torch.manual_seed(0)
    target = Transformer(cfg).to(device=args.device, dtype=torch_dtype(args.dtype)).eval()
    modes = (False, True) if args.compile else (False,)
    if args.roofline:
        from spirelib.measure.calibrate import matmul_peak, memory_bandwidth

        peak = matmul_peak(device=args.device, dtype=torch_dtype(args.dtype))["flops"]
        bw = memory_bandwidth(device=args.device)["bandwidth"]
        rows = [row for L in args.context for B in args.batch for compiled in modes
                for row in roofline_rows(target, B, L, args.k, args.window,
                                         RooflineTiming(Machine(peak, bw, torch_dtype(args.dtype).itemsize),
                                                        compiled=compiled),
                                         temperature=args.temperature, methods=args.methods)]
        print(json.dumps(rows, indent=2)) if args.json else print_roofline(rows, peak, bw, args.dtype)
        return 0
    factories, models = build_methods(target, args.methods, args.temperature, args.window)
    if args.profiled:
        cells, held = profiled_grid(args)
        cost, rows, verdict = profiled_rows(target, factories, args.methods, cells, held, args)
        if args.json:
            print(json.dumps({"cells": [r.to_dict() for r in rows],
                              "verdict": {**verdict, "false_gains": len(verdict["false_gains"])},
                              "cost": cost.to_dict()}, indent=2, default=str))
        else:
            print_profiled(rows, verdict)
        return 0
    rows = []
    for compiled in modes:
        compile_all(target, models, compiled)
        for L in args.context:
            for B in args.batch:
                for row in run_case(target, factories, args.methods, B, L, decoding(args), args.repeats,
                                    "runs" if compiled else args.interleave):
                    rows.append({**row, "mode": "compiled" if compiled else "eager"})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    draft = vanilla_draft_config(cfg)
    print(f"decode: target {cfg.num_layers}x{cfg.d_model} (n_kv {cfg.n_kv}, d_head {cfg.d_head}, d_ff {cfg.d_ff}, "
          f"vocab {cfg.vocab_size}), vanilla draft {draft.num_layers}x{draft.d_model}, k={args.k}, "
          f"G={args.new_tokens}, T={args.temperature}, {args.dtype}, {torch.get_num_threads()} threads, "
          f"{args.device}, best of {args.repeats}")
    print(f"{'L':>5} {'B':>3} {'method':9} {'mode':8} {'tok/s':>8} {'vs AD':>6} {'round ms':>9} {'tau':>5}"
          f" {'prefill s':>9} {'draft':>6} {'verify':>6} {'bookkp':>6}")
    ad = {(r["context"], r["batch"], r["mode"]): r["tokens_per_s"] for r in rows if r["method"] == "ad"}
    for r in rows:
        base = ad.get((r["context"], r["batch"], r["mode"]))
        vs = f"{r['tokens_per_s'] / base:6.2f}" if base else f"{'':6}"
        s = r["split"]
        print(f"{r['context']:5d} {r['batch']:3d} {r['method']:9} {r['mode']:8} {r['tokens_per_s']:8.0f} {vs}"
              f" {r['round_ms']:9.2f}"
              f" {r['tau']:5.2f} {r['prefill_s']:9.2f} {s['draft']:6.1%} {s['verify']:6.1%} {s['bookkeeping']:6.1%}")
    return 0
