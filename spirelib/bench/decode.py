"""`spire bench decode`: batched decoding throughput, AD vs SD with each draft.

For every context length L and batch size B: one target prefill of B random contexts
(timed once, shared by every method, as in the tau protocol), then, best of `--repeats`,
G new tokens per row by autoregressive decoding (AD) and by speculative decoding with
each draft. Reported per method: generated tokens/s of the decode phase (B x G / decode
time, prefill excluded), the time of one round (one token step for AD), tau, and the
split of decode time between draft, verify and bookkeeping (sampling, rejection,
rollback, gathers; `speculative.SectionTimer`). Goal: bookkeeping under 10% at B = 64.

Weights are random (speed does not depend on them), so tau, and with it SD's tokens/s,
is not a trained model's: per-round time is what carries over, and tokens/s = tau / round.
The vanilla draft has the method §4 shape (`vanilla_draft_config`); the SPIRe draft is pruned
from the target (2 layers, sink 1 + window 64); MagicDec reads sink 1 + window 64.

Timings are wall clock; on a machine shared with other jobs, best-of-n is the fair figure.

`--profiled` judges the profiled cost model (`spirelib.modeling.profiled`) on this run as
notebook 09 does: fresh random contexts every run, runs added while a speedup's 95% CI is wider
than +/-5% (within a time budget per cell), the model fitted to the rounds timed at every cell
but the held-out ones (`--held-out`, default the largest B at the longest L) with its peak and
bandwidth pinned to a calibration made now, then every cell's measured speedup (and CI) against
the model's, its median, signed and held-out errors.

Measured results, dated, with the machine and the command: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import torch

from spirelib.bench import MODEL_OPTIONS, add_model_arguments, model_config, positive
from spirelib.engine.drafts import draft_factory, vanilla_draft_config
from spirelib.engine.kvcache import SinkWindow, SinkWindowKVCache
from spirelib.engine.spire import SpireConfig, SpireDraftModel
from spirelib.engine.transformer import Transformer
from spirelib.engine.wallclock import (
    loop_timings,
    profiled_cells,
    profiled_draft_shapes,
    profiled_verdict,
    time_cells,
)
from spirelib.modeling import profiled

TIMED = ("ad", "vanilla", "magicdec", "spire")  # AD and the registered drafts this benchmark builds


def build_methods(target: Transformer, methods: list[str], temperature: float, window: int) -> tuple[dict, list]:
    """A draft factory per SD method (AD needs none), and the draft models built for them."""
    torch.manual_seed(1)
    models = {"vanilla": lambda: Transformer(vanilla_draft_config(target.cfg)).to(next(target.parameters())).eval(),
              "spire": lambda: SpireDraftModel.from_target(target, SpireConfig(window=window)).eval(),
              "magicdec": lambda: None}
    options = {"magicdec": {"window": window}}
    built = {m: models[m]() for m in methods if m != "ad"}
    factories = {m: draft_factory(m, target, model, temperature=temperature, **options.get(m, {}))
                 for m, model in built.items()}
    return factories, [model for model in built.values() if model is not None]


def time_case(target: Transformer, factories: dict, methods: list[str], cells: list[tuple[int, int]],
              new_tokens: int, k: int, temperature: float, repeats: int, **more) -> list:
    """Every method at every (B, L) of `cells`: `wallclock.time_cells` over fresh random contexts every run."""
    def random_contexts(batch: int, context: int):
        return lambda run: torch.randint(0, target.cfg.vocab_size, (batch, context),
                                         generator=torch.Generator().manual_seed(run))

    return time_cells(target, {m: factories[m] for m in methods if m != "ad"},
                      [random_contexts(B, L) for B, L in cells], new_tokens, k=k, temperature=temperature,
                      repeats=repeats, include_ad="ad" in methods, **more)


def run_case(target: Transformer, factories: dict, methods: list[str], batch: int, context: int, new_tokens: int,
             k: int, temperature: float, repeats: int, interleave: str = "rounds") -> list[dict]:
    """Every method at one (B, L), best of `repeats`: rows of results."""
    timings = time_case(target, factories, methods, [(batch, context)], new_tokens, k, temperature, repeats,
                        interleave=interleave)
    rows = []
    for t in timings:
        best = t.best
        rows.append({"method": t.method, "batch": batch, "context": context,
                     "tokens_per_s": t.tokens_per_s[best], "round_ms": 1e3 * t.seconds[best] / t.rounds[best],
                     "rounds": t.rounds[best], "tau": t.taus[best], "prefill_s": t.prefill_s, "split": t.split(best)})
    return rows


@torch.no_grad()
def roofline_rows(target: Transformer, batch: int, context: int, k: int, window: int, *, peak_flops: float,
                  bandwidth: float, repeats: int = 20, compiled: bool = False) -> list[dict]:
    """One row per forward kind at (B, L): measured ms (median of `repeats`), FLOPs and bytes
    (`profiled.forward_work`: body, attention over the visible keys, unembedding; weights and KV
    at their dtype), roofline ms = max(FLOPs / peak, bytes / bandwidth) and measured / roofline.
    Kinds: the AD step (1 token), verification (k + 1 tokens), the vanilla draft's step, MagicDec's
    step (the target over sink 1 + window) and SPIRe's step (its body over sink 1 + window).
    `compiled`: every model decodes through compiled graphs (`Transformer.compile_decoding`;
    the first call of each kind, untimed, compiles)."""
    cfg, param = target.cfg, next(target.parameters())
    dev, value_bytes = param.device, param.element_size()
    tokens = torch.randint(0, cfg.vocab_size, (batch, context + k + 1), device=dev)
    vanilla = Transformer(vanilla_draft_config(cfg)).to(param).eval()
    spire = SpireDraftModel.from_target(target, SpireConfig(window=window)).to(param.dtype).eval()  # decodes so
    for model in (target, vanilla, spire):
        model.compile_decoding(compiled)
    sparse = SinkWindow(1, window)

    def dense(model):
        cache = model.new_cache(batch, context + k + 1)
        model.hidden(tokens[:, :context], cache=cache)
        return cache

    def median_ms(step, reset):
        times = []
        for i in range(repeats + 1):
            reset()
            start = time.perf_counter()
            step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            if i:
                times.append(time.perf_counter() - start)
        return 1e3 * statistics.median(times)

    lengths = torch.full((batch,), context, device=dev)
    rows = []
    target_cache, vanilla_cache = dense(target), dense(vanilla)
    ring = SinkWindowKVCache(cfg.num_layers, batch, cfg.n_kv, cfg.d_head, sparse, k + 1, rope_mode="cache",
                             rope_base=cfg.rope_base, device=dev, dtype=param.dtype)
    ring.ingest(target_cache, torch.arange(context, device=dev).expand(batch, context))
    memory = spire.new_cache(batch, slack=k + 1)
    spire.write_target_memory(memory, target.residual_stream(tokens[:, :context], layers=spire.memory_layers),
                              torch.arange(context, device=dev).expand(batch, context))
    pos = lengths[:, None]
    cases = [
        ("AD step", cfg, 1, context + 1, lambda: target(tokens[:, context:context + 1], pos, target_cache),
         lambda: target_cache.rollback(lengths)),
        (f"verify ({k + 1} tokens)", cfg, k + 1, context + k + 1,
         lambda: target(tokens[:, context:], pos + torch.arange(k + 1, device=dev), target_cache),
         lambda: target_cache.rollback(lengths)),
        ("vanilla step", vanilla.cfg, 1, context + 1, lambda: vanilla(tokens[:, context:context + 1], pos, vanilla_cache),
         lambda: vanilla_cache.rollback(lengths)),
        ("MagicDec step", cfg, 1, min(context, 1 + window) + 1,
         lambda: target(tokens[:, context:context + 1], pos, ring), lambda: ring.rollback(lengths)),
        ("SPIRe step", spire.body.cfg, 1, min(context, 1 + window),
         lambda: spire.step(tokens[:, context], lengths, memory), lambda: memory.rollback(lengths)),
    ]
    for name, shape_cfg, new, keys, step, reset in cases:
        work = profiled.forward_work(shape_cfg.shape(), shape_cfg.vocab_size, batch, new, keys,
                                     bytes_per_value=value_bytes)
        roof = 1e3 * max(work.flops / peak_flops, work.bytes / bandwidth)
        ms = median_ms(step, reset)
        rows.append({"kind": name, "batch": batch, "context": context, "ms": ms, "gflop": work.flops / 1e9,
                     "mbytes": work.bytes / 1e6, "roofline_ms": roof, "ratio": ms / roof,
                     "mode": "compiled" if compiled else "eager"})
    return rows


def profiled_rows(target: Transformer, factories: dict, methods: list[str], cells: list[tuple[int, int]],
                  held_out: list[tuple[int, int]], args: argparse.Namespace) -> tuple:
    """Time every (B, L) of `cells` (09's protocol: CI +/-5% within `--cell-seconds`), calibrate
    this machine, fit the profiled model to every cell but `held_out`, and compare: (the fitted
    `profiled.ProfiledCost`, `wallclock.profiled_cells`, `wallclock.profiled_verdict`)."""
    from spirelib.engine.calibrate import matmul_peak, memory_bandwidth

    timings = time_case(target, factories, methods, cells, args.new_tokens, args.k, args.temperature, args.repeats,
                        max_repeats=args.max_repeats, max_seconds=args.cell_seconds, interleave=args.interleave)
    peak, bw = matmul_peak(device=args.device)["flops"], memory_bandwidth(device=args.device)["bandwidth"]
    spire = SpireConfig(window=args.window)
    shapes = profiled_draft_shapes(vanilla_draft_config(target.cfg), replace(target.cfg, num_layers=spire.num_layers),
                                   spire, SinkWindow(spire.sink, spire.window))
    value_bytes = next(target.parameters()).element_size()
    seen = [t for t in timings if (t.batch, t.context) not in set(held_out)]
    cost = profiled.fit(loop_timings(seen), target=target.cfg.shape(), vocab_size=target.cfg.vocab_size,
                        drafts={m: shapes[m] for m in methods if m != "ad"}, k=args.k, peak_flops=peak,
                        bandwidth=bw, bytes_per_value=value_bytes)
    rows = profiled_cells(timings, cost, target.cfg, shapes, bytes_per_value=value_bytes, k=args.k, held_out=held_out)
    return cost, rows, profiled_verdict(rows)


def print_profiled(rows: list[dict], verdict: dict) -> None:
    print(f"{'L':>5} {'B':>3} {'method':9} {'measured':>8} {'95% CI':>13} {'runs':>4} {'profiled':>8} {'error':>7}"
          "  fit")
    for r in rows:
        print(f"{r['L']:5d} {r['B']:3d} {r['method']:9} {r['measured_speedup']:8.3f} "
              f"{r['ci_low']:6.3f}-{r['ci_high']:6.3f} {r['runs']:4d} {r['profiled_speedup']:8.3f} "
              f"{r['profiled_error']:+7.1%}  {'held out' if r['held_out'] else 'fitted'}")
    held = verdict["held_out_max_error"]
    print(f"profiled model: median error {verdict['median_error']:.1%}, "
          f"mean signed {verdict['mean_signed_error']:+.1%}, "
          f"fitted cells' median {verdict['fitted_median_error']:.1%}"
          + (f", held-out worst {held:.1%}" if held is not None else "")
          + f", {len(verdict['false_gains'])} predicted gains (>= 1.1x) that measured a loss; widest CI "
          f"+/-{verdict['widest_ci']:.1%}")


def print_roofline(rows: list[dict], peak_flops: float, bandwidth: float) -> None:
    print(f"roofline: fp32 peak {peak_flops / 1e9:.0f} GFLOP/s, bandwidth {bandwidth / 1e9:.1f} GB/s (calibrated now)")
    print(f"{'L':>5} {'B':>3} {'forward':18} {'mode':8} {'ms':>8} {'GFLOP':>8} {'MB':>8} {'roof ms':>8} {'x roof':>7}")
    for r in rows:
        print(f"{r['context']:5d} {r['batch']:3d} {r['kind']:18} {r['mode']:8} {r['ms']:8.2f} {r['gflop']:8.3f}"
              f" {r['mbytes']:8.1f} {r['roofline_ms']:8.3f} {r['ratio']:7.1f}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--context", type=int, nargs="+", default=[256, 960])
    parser.add_argument("--new-tokens", type=int, default=64, help="G")
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--methods", nargs="+", choices=TIMED, default=list(TIMED))
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--window", type=int, default=64, help="sparse window of MagicDec and SPIRe (sink 1)")
    add_model_arguments(parser)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case (after one warm-up); best is kept")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--roofline", action="store_true",
                        help="time single forwards of every kind against this machine's roofline instead")
    parser.add_argument("--compile", action="store_true",
                        help="also decode through compiled graphs, beside eager")
    parser.add_argument("--interleave", choices=("rounds", "runs"), default="rounds", metavar="HOW",
                        help="rounds: methods take turns per round; runs: per run")
    parser.add_argument("--profiled", action="store_true", help="fit the profiled cost model here, judge each cell")
    parser.add_argument("--held-out", type=int, nargs=2, action="append", metavar=("B", "L"),
                        help="--profiled: a held-out cell (default: largest B and L)")
    parser.add_argument("--max-repeats", type=int, default=30, help="--profiled: runs per cell at most")
    parser.add_argument("--cell-seconds", type=float, default=20.0, help="--profiled: seconds per cell at most")


def profiled_grid(args: argparse.Namespace) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(every (B, L) cell `--profiled` times, the held-out ones among them)."""
    held = [tuple(c) for c in args.held_out] if args.held_out else [(max(args.batch), max(args.context))]
    grid = {(b, length) for b in args.batch for length in args.context}
    return sorted(grid | set(held), key=lambda c: (c[1], c[0])), held


def problems(args: argparse.Namespace) -> list[str]:
    out = positive(args, "batch", "context", "new_tokens", "k", "window", *MODEL_OPTIONS, "repeats")
    if args.profiled:
        cells, held = profiled_grid(args)
        if "ad" not in args.methods:
            out.append("--profiled needs ad among --methods (the model is fitted to AD's steps)")
        out += [f"--profiled: {p}" for p in profiled.cell_problems(c for c in cells if c not in held)]
        if args.roofline or args.compile:
            out.append("--profiled times eager decoding alone: drop --roofline and --compile")
    return out


def main(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = model_config(args)
    torch.manual_seed(0)
    target = Transformer(cfg).to(args.device).eval()
    modes = (False, True) if args.compile else (False,)
    if args.roofline:
        from spirelib.engine.calibrate import matmul_peak, memory_bandwidth

        peak, bw = matmul_peak(device=args.device)["flops"], memory_bandwidth(device=args.device)["bandwidth"]
        rows = [row for L in args.context for B in args.batch for compiled in modes
                for row in roofline_rows(target, B, L, args.k, args.window, peak_flops=peak, bandwidth=bw,
                                         compiled=compiled)]
        print(json.dumps(rows, indent=2)) if args.json else print_roofline(rows, peak, bw)
        return 0
    factories, drafts = build_methods(target, args.methods, args.temperature, args.window)
    if args.profiled:
        cells, held = profiled_grid(args)
        cost, rows, verdict = profiled_rows(target, factories, args.methods, cells, held, args)
        if args.json:
            print(json.dumps({"cells": rows, "verdict": {**verdict, "false_gains": len(verdict["false_gains"])},
                              "cost": cost.to_dict()}, indent=2, default=str))
        else:
            print_profiled(rows, verdict)
        return 0
    rows = []
    for compiled in modes:
        for model in (target, *drafts):
            model.compile_decoding(compiled)
        for L in args.context:
            for B in args.batch:
                for row in run_case(target, factories, args.methods, B, L, args.new_tokens, args.k, args.temperature,
                                    args.repeats, "runs" if compiled else args.interleave):
                    rows.append({**row, "mode": "compiled" if compiled else "eager"})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    draft = vanilla_draft_config(cfg)
    print(f"decode: target {cfg.num_layers}x{cfg.d_model} (n_kv {cfg.n_kv}, d_head {cfg.d_head}, d_ff {cfg.d_ff}, "
          f"vocab {cfg.vocab_size}), vanilla draft {draft.num_layers}x{draft.d_model}, k={args.k}, G={args.new_tokens}, "
          f"T={args.temperature}, {torch.get_num_threads()} threads, {args.device}, best of {args.repeats}")
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
