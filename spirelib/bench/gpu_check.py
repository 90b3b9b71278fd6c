"""`spire bench gpu-check` (`make gpu-check`): the acceptance check of a GPU machine, one table.

What the CPU test suite cannot show, in one run that must fit `gpu_goals.TIME_GOAL_S` on one H100
from a cold compile cache, a row each (`CHECKS`), judged against its goal (`gpu_goals`): ok or FAIL,
with its figures. Compiled decoding through round graphs against eager (`_cuda_graphs`); a bf16 target with
an fp32 SPIRe draft (`_bf16_target`); training MFU, reported (`_mfu`); a sharded step's memory
against its simulation (`_memory`); the compiled AD step against the roofline of the bytes it reads
(`gpu_rounds.roofline_check`); the host's share of an SD round (`gpu_rounds.host_check`); transformers as a peer (`_peer`); the
profiled cost model's held-out error (`_profiled`); the whole check's time (`time_row`). The smoke
series (`_series`, notebooks) runs with --notebooks only. Rows that time cells start none once their
budget (`BUDGETS_S`, `gpu_goals.in_budget`) is spent and name the cells left. Every row goes to a JSON summary (`summary`);
the exit status is 1 if any row failed. `--device cpu --quick` runs the same code at toy shapes,
without budgets: figures that mean nothing there are reported, not judged.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from spirelib.bench import gpu_rounds, greedy_mismatch, positive, synchronize
from spirelib.bench.gpu_goals import (
    BUDGETS_S,
    GOALS,
    MEMORY_TOLERANCE,
    SERIES_TIMEOUT_S,
    K,
    Outcome,
    Row,
    budget,
    device_name,
    in_budget,
    judge_graphs,
    judge_peer,
    judge_profiled,
    judged_outcome,
    judged_row,
    summary,
    time_row,
    untimed,
)
from spirelib.model.config import ModelConfig, SpireConfig, vanilla_draft_config

#: The cuda-graphs row's generations: B, L, k and G as `rounds.steady_state_counts` decodes them at k 4
#: (G = (3 warm-up rounds + 2) x (k + 1)), so that its counted rounds replay the row's kernels and graphs.
GRAPH_CELL = {"batch": 8, "context": 64, "k": 4, "new_tokens": 25}

class Skipped(Exception):
    """A row that cannot run on this machine (a missing optional package): said, not failed."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda", help="the GPU to check (cuda, cuda:N); cpu only with --quick")
    parser.add_argument("--quick", action="store_true", help="toy shapes and few steps: a dry run of the check")
    parser.add_argument("--skip", nargs="+", default=[], choices=list(CHECKS), help="checks to leave out")
    parser.add_argument("--notebooks", action="store_true",
                        help=f"also run the smoke series' notebooks end to end (papermill; up to {SERIES_TIMEOUT_S} s, "
                             "outside the time goal)")
    parser.add_argument("--steps", type=int, default=20, help="training steps of the bf16 and MFU checks")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="where the JSON summary goes (default outputs/gpu-check/summary.json)")


def problems(args: argparse.Namespace) -> list[str]:
    found = positive(args, "steps")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        found.append(f"--device {args.device}: no CUDA device here; run it on a GPU machine (or --device cpu --quick)")
    if device.type == "cpu" and not args.quick:
        found.append("--device cpu: the check is for a GPU; --quick dry-runs it on the CPU")
    return found


# ---------------------------------------------------------------------------- the checks

def _series(args) -> Outcome:
    """The smoke series (`params/smoke.yaml`) run end to end with `device: cuda`, every notebook and
    report: a subprocess (`spire run`) in a fresh cache folder, so every model trains on this GPU
    rather than being reused from a CPU run's cache, stopped after `SERIES_TIMEOUT_S`."""
    import os

    from spirelib.paths import project_root
    from spirelib.training.params import load_params

    root = project_root()
    params = load_params(root / "params" / "smoke.yaml")
    params["series"] = {**params["series"], "device": args.device}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpu-check.yaml"
        path.write_text(yaml.safe_dump(params))
        out = root / "outputs" / "gpu-check"
        env = {**os.environ, "SPIRE_CACHE_DIR": str(Path(tmp) / "cache")}  # nothing reused: every model trains here
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "spirelib", "run", "--params", str(path), "--out", str(out)],
                                  capture_output=True, text=True, env=env, timeout=SERIES_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"spire run of the smoke series did not finish in {SERIES_TIMEOUT_S} s") from e
    if proc.returncode:
        raise RuntimeError((proc.stdout + proc.stderr).strip().splitlines()[-1])
    reports, seconds = len(list(out.glob("[0-9][0-9]_*.html"))), time.perf_counter() - start
    return Outcome(f"{reports} reports in {seconds:.0f} s (fresh cache) -> {out}/index.html",
                   {"reports": reports, "seconds": seconds})


def _toy_target(args, dtype=torch.float32):
    from spirelib.model.transformer import Transformer

    cfg = ModelConfig(vocab_size=512, num_layers=4, d_model=64, n_q_per_kv=1, n_kv=4, d_head=16, d_ff=256)
    torch.manual_seed(0)
    target = Transformer(cfg)
    target.reset_parameters(0.3)  # peaked distributions: greedy choices far from ties
    return target.to(device=args.device, dtype=dtype).eval()


def _cuda_graphs(args) -> Outcome:
    """Compiled decoding through round graphs (`decoding.graphs`) against eager, at a toy target
    (`GRAPH_CELL`): AD and SD with every draft, greedy and sampled, each decoded three times. Greedy
    tokens equal eager's; sampled ones lie in the vocabulary (a read of a graph's output after the
    next replay would not); on a GPU each (method, T) records its graph in its first generation
    (`GRAPHS.watch`) and none after, nor do the counted rounds; ms per step or round eager against
    compiled (the last generation's); and the host's work in a steady-state AD step and SD round
    (`bench rounds`: replays, eager ops, syncs) against `rounds.GOAL` (method §3.5). Budget: the
    methods not started within `BUDGETS_S["cuda-graphs"]` are named, and fail the row."""
    from spirelib.bench.decode_models import compile_all, draft_models, draft_options
    from spirelib.bench.rounds import METHODS, steady_state_counts
    from spirelib.decoding.builders import draft_factory
    from spirelib.decoding.graphs import GRAPHS
    from spirelib.decoding.speculative import autoregressive_generate, speculative_generate

    B, L, k, G = (GRAPH_CELL[n] for n in ("batch", "context", "k", "new_tokens"))
    target = _toy_target(args)
    models, options = draft_models(target, METHODS, 16), draft_options(16)
    contexts = torch.randint(0, target.cfg.vocab_size, (B, L), device=args.device)

    def decode(method, temperature):  # (tokens (B, G), seconds per step or round, round graphs recorded)
        gen = torch.Generator(args.device).manual_seed(0)
        with GRAPHS.watch() as recorded:
            start = time.perf_counter()
            if method == "ad":
                out = autoregressive_generate(target, contexts, G, temperature=temperature, generator=gen)
            else:
                draft = draft_factory(method, target, models[method], temperature=temperature,
                                      **options.get(method, {}))()
                out = speculative_generate(target, draft, contexts, G, k=k, temperature=temperature, generator=gen)
            synchronize(args.device)
            seconds = time.perf_counter() - start
        return out.tokens, seconds / (G if out.accepted is None else out.accepted.shape[1]), recorded[0]

    methods = ["ad", *models]
    eager = {m: decode(m, 0.0) for m in methods}
    compile_all(target, models, True)
    left, greedy, sampled = [], {}, {}
    for m in in_budget(methods, budget(args, "cuda-graphs"), left):
        greedy[m] = [decode(m, 0.0) for _ in range(3)]
        sampled[m] = [decode(m, 1.0) for _ in range(3)]
    with GRAPHS.watch() as counted:
        counts = steady_state_counts(target, models, batch=B, context=L, k=k, temperature=0.0, window=16)
    captures = GRAPHS.captures(torch.device(args.device))
    V = target.cfg.vocab_size
    figures = {
        "differ": [m for m in greedy if any(not torch.equal(eager[m][0], run[0]) for run in greedy[m])],
        "invalid": [m for m in sampled if any(not ((run[0] >= 0) & (run[0] < V)).all() for run in sampled[m])],
        "untimed": left,
        "recordings": {f"{m} T={t}": [r[2] for r in runs[m]] for t, runs in ((0, greedy), (1, sampled))
                       for m in runs} if captures else None,
        "counts_recorded": counted[0],
        "counts": {c["method"]: {n: c[n] for n in ("replays", "eager_ops", "syncs")} for c in counts},
        "ms_eager": {m: 1e3 * eager[m][1] for m in greedy}, "ms_compiled": {m: 1e3 * greedy[m][-1][1] for m in greedy},
    }
    per_round = ", ".join(f"{m} {figures['ms_eager'][m]:.2f} -> {figures['ms_compiled'][m]:.2f}" for m in greedy)
    work = ", ".join(f"{m} {c['replays']} + {c['eager_ops']}" for m, c in figures["counts"].items())
    recorded = ("graphs recorded per (method, T) over its 3 generations as asked" if captures else
                "graph recordings not judged on cpu (no graphs)")
    text = (f"greedy tokens {'differ' if figures['differ'] else 'equal eager'}, sampled runs complete; {recorded}; "
            f"ms per step (AD) or round eager -> compiled: {per_round}; replays + eager ops per step/round: {work}"
            f"{untimed(left)}")
    return Outcome(text, figures, tuple(judge_graphs(figures)))


def _bf16_target(args) -> Outcome:
    """A bf16 target trains an fp32 SPIRe draft for a few steps (weights, gradients and AdamW's
    moments in fp32, the loss falling), then decodes it greedily, equal to the target's own greedy
    tokens up to a near-tie (`greedy_mismatch`: bf16 rounding may flip an argmax whose top two
    logits are within `TIE_LOGITS` of each other; any other difference fails)."""
    from spirelib.decoding.builders import draft_factory
    from spirelib.decoding.speculative import autoregressive_generate, speculative_generate
    from spirelib.model.spire import SpireDraftModel
    from spirelib.training.objectives import SpireObjective
    from spirelib.training.train import TrainConfig, make_optimizer

    target = _toy_target(args, torch.bfloat16)
    draft = SpireDraftModel.from_target(target, SpireConfig(window=16))
    opt = make_optimizer(draft, TrainConfig(lr=3e-3, steps=args.steps))
    batch = torch.randint(0, target.cfg.vocab_size, (4, 257), device=args.device)
    objective, losses = SpireObjective(target), []
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=torch.device(args.device).type == "cuda")
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss, _ = objective(draft, batch)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    dtypes = {p.dtype for p in draft.parameters()} | {s[k].dtype for s in opt.state.values()
                                                      for k in ("exp_avg", "exp_avg_sq")}
    if dtypes != {torch.float32}:
        raise RuntimeError(f"the draft's weights and moments are {sorted(map(str, dtypes))}, not fp32")
    if not losses[-1] < losses[0]:
        raise RuntimeError(f"the loss did not fall: {losses[0]:.3f} -> {losses[-1]:.3f}")
    contexts = batch[:, :64]
    sd = speculative_generate(target, draft_factory("spire", target, draft, temperature=0.0)(), contexts, 32,
                              k=4, temperature=0.0)
    ad = autoregressive_generate(target, contexts, 32, temperature=0.0)
    mismatch = greedy_mismatch(target, contexts, sd.tokens, ad.tokens)
    if mismatch:
        raise RuntimeError(f"greedy speculative decoding differs from the bf16 target's greedy tokens: {mismatch}")
    same = torch.equal(sd.tokens, ad.tokens)
    return Outcome(f"fp32 draft, loss {losses[0]:.3f} -> {losses[-1]:.3f} in {args.steps} steps; greedy SD "
                   f"{'=' if same else '= (up to near-ties)'} AD",
                   {"loss_first": losses[0], "loss_last": losses[-1], "tokens_equal": same})


def _mfu(args) -> Outcome:
    """`bench train` at the paper's target shape (8 x 512, V 50,304), compiled, bf16 autocast,
    against the bf16 matmul peak measured in the same run: reported, no goal."""
    from spirelib.bench.train import TARGETS, measure
    from spirelib.measure.calibrate import matmul_peak
    from spirelib.throughput.costs import flop_params, training_flops

    cfg = TARGETS["workbook" if args.quick else "paper"]
    gpu = torch.device(args.device).type == "cuda"
    batch, seq = (2, 128) if args.quick else (16, 1024)
    run = measure(cfg, batch, seq, args.steps, compile=not args.quick, device=args.device)
    peak = (matmul_peak(sizes=(8192,), device=args.device, dtype=torch.bfloat16) if gpu else matmul_peak())["flops"]
    mfu = training_flops(flop_params(cfg), run["tokens_per_s"]) / peak
    return Outcome(f"{cfg.num_layers} x {cfg.d_model}, V {cfg.vocab_size:,}, batch {batch} x {seq}: "
                   f"{run['tokens_per_s']:,.0f} tokens/s, MFU {mfu:.1%} of {peak / 1e12:.1f} TFLOP/s",
                   {"tokens_per_s": run["tokens_per_s"], "mfu": mfu, "peak_tflops": peak / 1e12})


def _peer(args) -> Outcome:
    """`bench peer`'s compiled mode at its GPU defaults (`peer.GPU_CELLS`, the paper's target in bf16,
    random weights the same on both sides): our compiled decoding against transformers' static cache +
    torch.compile, greedy, G 64, medians of 3 after warm-ups that record both sides' graphs; ours /
    transformers as speed for the whole generation and the decode step, tokens equal up to near-ties.
    Budget: `BUDGETS_S["peer"]`, most of it compiling; the cells not started are named (and fail).
    --quick: the workbook's target in fp32, two toy cells, eager. Without transformers: skipped."""
    from spirelib.bench import peer
    from spirelib.bench.train import TARGETS
    from spirelib.model.transformer import Transformer

    try:
        peer.import_transformers()
    except RuntimeError as e:
        raise Skipped(str(e)) from None
    dtype = torch.bfloat16 if torch.device(args.device).type == "cuda" else torch.float32
    cfg = TARGETS["workbook" if args.quick else "paper"]
    cells = [(1, 16), (2, 24)] if args.quick else list(peer.GPU_CELLS)
    mode, new_tokens, repeats = ("eager", 4, 1) if args.quick else ("compiled", 64, 3)
    torch.manual_seed(0)
    target, draft = Transformer(cfg).to(dtype).eval(), Transformer(vanilla_draft_config(cfg)).to(dtype).eval()
    rows, left = [], []
    with tempfile.TemporaryDirectory() as folder:
        bench = peer.Peer(target, draft, Path(folder), k=K, device=args.device)
        for B, L in in_budget(cells, budget(args, "peer"), left):
            times = peer.time_cell(bench, B, L, [mode], new_tokens, repeats, cfg.vocab_size)
            rows += peer.rows_of(bench, B, L, times, new_tokens)
    figures = {"untimed": [f"{B}x{L}" for B, L in left], "cells": {
        f"{r['batch']}x{r['context']}": {"whole": r["whole"], "step": r["step"], "rows_differ": r["rows_differ"],
                                         "rows_tied": r["rows_tied"], "recorded": r["recorded"]} for r in rows}}
    differ = [f"{r['rows_differ']} of {r['batch']} rows at {r['batch']} x {r['context']}" for r in rows
              if r["rows_differ"]]
    cells_text = "; ".join(f"{r['batch']} x {r['context']} whole {r['whole']['ratio']:.2f}, step "
                           f"{r['step']['ratio']:.2f} ({1e3 * r['step']['ours_s']:.2f} ms vs "
                           f"{1e3 * r['step']['theirs_s']:.2f})" + (f", {r['rows_tied']} near-ties" if r["rows_tied"]
                                                                    else "") for r in rows)
    text = f"{mode}, ours / transformers as speed: {cells_text}{untimed(left)}"
    if differ:  # wrong tokens fail wherever they are found, the CPU too
        return Outcome(text, figures, (f"tokens differ from transformers' beyond near-ties: {', '.join(differ)}",))
    return judged_outcome(args, text, figures, judge_peer)


def _profiled(args) -> Outcome:
    """`bench decode --profiled` (eager, fp32, the paper's target; AD and SPIRe) at B 1 and 16 x L 512
    and 1024, the model fitted there and judged at the held-out cell B 64 x L 2048 (goal: held-out
    error <= `PROFILED_GOAL`). Each cell gets runs for at most `BUDGETS_S["profiled"]` / 6 seconds
    beyond its 3 (five cells and the calibration); the memory the runs hold is checked first
    (`decode.problems`). --quick: toy shapes and cells."""
    from spirelib.bench import decode, decode_models
    from spirelib.bench.train import TARGETS
    from spirelib.model.transformer import Transformer

    cfg = TARGETS["workbook" if args.quick else "paper"]
    shape = ["--vocab-size", cfg.vocab_size, "--target-layers", cfg.num_layers, "--d-model", cfg.d_model,
             "--n-q-per-kv", cfg.n_q_per_kv, "--n-kv", cfg.n_kv, "--d-head", cfg.d_head, "--d-ff", cfg.d_ff]
    grid = (["--batch", 1, 2, "--context", 16, 24, "--held-out", 2, 32, "--new-tokens", 6, "-k", 3, "--window", 4,
             "--repeats", 2, "--max-repeats", 2] if args.quick else
            ["--batch", 1, 16, "--context", 512, 1024, "--held-out", 64, 2048, "--repeats", 3, "--max-repeats", 10])
    parser = argparse.ArgumentParser()
    decode.add_arguments(parser)
    options = parser.parse_args([str(v) for v in [*shape, *grid, "--profiled", "--device", args.device,
                                                  "--methods", "ad", "spire",
                                                  "--cell-seconds", BUDGETS_S["profiled"] / 6]])
    found = decode.problems(options)
    if found:
        raise RuntimeError("; ".join(found))
    torch.manual_seed(0)
    target = Transformer(cfg).to(args.device).eval()
    factories, _ = decode_models.build_methods(target, options.methods, options.temperature, options.window)
    cells, held = decode.profiled_grid(options)
    _, rows, verdict = decode.profiled_rows(target, factories, options.methods, cells, held, options)
    worst = max((r for r in rows if r.held_out), key=lambda r: abs(r.profiled_error))
    figures = {n: verdict[n] for n in ("held_out_max_error", "fitted_median_error", "widest_ci")}
    text = (f"held-out {held[0][0]} x {held[0][1]}: worst error {verdict['held_out_max_error']:.1%} "
            f"({worst.method}: measured {worst.measured_speedup:.3f}, profiled {worst.profiled_speedup:.3f});"
            f" fitted cells' median {verdict['fitted_median_error']:.1%}, widest CI +/-{verdict['widest_ci']:.1%}")
    return judged_outcome(args, text, figures, judge_profiled)


def _memory(args) -> Outcome:
    """A SPIRe draft's sharded training step (`training.simulate`, one rank) run for real on the GPU,
    its peak (`torch.cuda.max_memory_allocated`) against the same step simulated with fake tensors:
    they must agree within `MEMORY_TOLERANCE`, or the simulated tables of docs/scaling-out.md are
    not to be trusted."""
    from spirelib.training.simulate import Case, peak, simulate
    from spirelib.training.train import TrainConfig

    shape = ModelConfig(vocab_size=512 if args.quick else 32_000, num_layers=4 if args.quick else 8,
                        d_model=64 if args.quick else 1024, n_q_per_kv=1, n_kv=4 if args.quick else 8, d_head=16 if
                        args.quick else 128, d_ff=256 if args.quick else 4096)
    case = Case("gpu-check", "spire", shape, TrainConfig(batch_size=2, seq_len=128 if args.quick else 1024, steps=1,
                                                         micro_batch_size=1), 1, SpireConfig(num_layers=2, window=16))
    simulated = peak(simulate(case))
    gpu = torch.device(args.device).type == "cuda"
    if gpu:
        torch.cuda.reset_peak_memory_stats(args.device)
        base = torch.cuda.memory_allocated(args.device)
    real = simulate(case, device=args.device, fake=False)
    measured = torch.cuda.max_memory_allocated(args.device) - base if gpu else peak(real)
    off = measured / simulated - 1
    what = "torch.cuda.max_memory_allocated" if gpu else "traced on real CPU tensors"
    if abs(off) > MEMORY_TOLERANCE:
        raise RuntimeError(f"measured {measured / 1e6:,.0f} MB ({what}) vs simulated {simulated / 1e6:,.0f} MB: "
                           f"{off:+.0%}, beyond {MEMORY_TOLERANCE:.0%}")
    return Outcome(f"step peak {measured / 1e6:,.0f} MB ({what}) vs {simulated / 1e6:,.0f} MB simulated ({off:+.1%})",
                   {"measured_mb": measured / 1e6, "simulated_mb": simulated / 1e6, "off": off})


CHECKS = {"series": _series, "cuda-graphs": _cuda_graphs, "bf16-target": _bf16_target, "mfu": _mfu,
          "memory": _memory, "roofline": gpu_rounds.roofline_check, "host": gpu_rounds.host_check, "peer": _peer,
          "profiled": _profiled}


# ---------------------------------------------------------------------------- the table and its summary

def run_row(name: str, args: argparse.Namespace) -> Row:
    """Row `name`: its check run and judged (`judged_row`); an exception fails it, `Skipped` skips it."""
    start = time.perf_counter()
    try:
        found = CHECKS[name](args)
    except Skipped as e:
        return Row(name, "skip", time.perf_counter() - start, {}, GOALS[name], BUDGETS_S.get(name), str(e))
    except Exception as e:  # noqa: BLE001 (a failed check is a row of the table, the others still run)
        return Row(name, "FAIL", time.perf_counter() - start, {}, GOALS[name], BUDGETS_S.get(name),
                   f"{type(e).__name__}: {e}")
    return judged_row(name, found, time.perf_counter() - start, args)


def main(args: argparse.Namespace) -> int:
    from spirelib.paths import project_root

    start = time.perf_counter()
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    print(f"gpu-check on {args.device} ({device_name(args)}, torch {torch.__version__})"
          f"{' --quick' if args.quick else ''}")
    rows = []
    for name in CHECKS:
        if name in args.skip or (name == "series" and not args.notebooks):
            why = "--skip" if name in args.skip else "the notebooks: --notebooks runs them"
            rows.append(Row(name, "skip", 0.0, {}, GOALS[name], BUDGETS_S.get(name), why))
        else:
            rows.append(run_row(name, args))
            gpu_rounds.release_decoding()
        r = rows[-1]
        print(f"  {name:12s} {r.status:8s} {r.seconds:6.1f} s  {r.text}", flush=True)
    series = sum(r.seconds for r in rows if r.name == "series")
    rows.append(time_row(time.perf_counter() - start - series, args))
    print(f"  {'time':12s} {rows[-1].status:8s} {rows[-1].seconds:6.1f} s  {rows[-1].text}")
    path = args.json or project_root() / "outputs" / "gpu-check" / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary(rows, args, started), indent=2, default=str) + "\n")
    print(f"summary: {path}")
    return 1 if any(r.status == "FAIL" for r in rows) else 0
