"""`spire bench gpu-check` (`make gpu-check`): the acceptance check of a GPU machine, one table.

What the CPU test suite cannot show, measured on the GPU in one run (under 8 minutes on one
H100-class GPU), a row each (`CHECKS`): the smoke series end to end on the GPU (`_series`);
compiled decoding under CUDA graphs against eager (`_cuda_graphs`); a bf16 target training and
decoding with an fp32 SPIRe draft (`_bf16_target`); training MFU at the paper's target shape
(`_mfu`); a sharded training step's real peak memory against its simulation (`_memory`); and the
decoding benchmarks at the paper's shapes: the roofline, transformers as a peer and the profiled
cost model (`_roofline`, `_peer`, `_profiled`).

The rows that time decoding stop starting new cells once their budget (`BUDGETS_S`) is spent and
name the cells left untimed. Each row says ok, FAIL (and why) or skipped (a row that cannot run
here, e.g. without transformers, says why); the exit status is 1 if any row failed.
`--device cpu --quick` runs the same code on the CPU at toy shapes (what the test suite does).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from spirelib.bench import positive

#: The series row's subprocess is stopped (and the row fails) after this many seconds.
SERIES_TIMEOUT_S = 1200
#: How far the GPU's measured peak of a training step may be from the simulated one.
MEMORY_TOLERANCE = 0.10
#: bf16 logits this close (top two at a position) are a near-tie whose argmax rounding may flip.
TIE_LOGITS = 0.125
#: Seconds a decoding row may spend before it starts no further cell (one cell under way finishes).
BUDGETS_S = {"peer": 120, "roofline": 120, "profiled": 60}


class Skipped(Exception):
    """A row that cannot run on this machine (a missing optional package): said, not failed."""


def in_budget(cells: list, budget_s: float, left: list):
    """`cells` in order while under `budget_s` seconds have passed since the first began; the cells
    not started then are appended to `left`."""
    start = time.perf_counter()
    for i, cell in enumerate(cells):
        if time.perf_counter() - start > budget_s:
            left.extend(cells[i:])
            return
        yield cell


def untimed(left: list) -> str:
    """The note on cells a row's budget left untimed (empty: none)."""
    return f"; over budget, not timed: {', '.join(map(str, left))}" if left else ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda", help="the GPU to check (cuda, cuda:N); cpu only with --quick")
    parser.add_argument("--quick", action="store_true", help="toy shapes and few steps: a dry run of the check")
    parser.add_argument("--skip", nargs="+", default=[], choices=list(CHECKS), help="checks to leave out")
    parser.add_argument("--steps", type=int, default=20, help="training steps of the bf16 and MFU checks")


def problems(args: argparse.Namespace) -> list[str]:
    found = positive(args, "steps")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        found.append(f"--device {args.device}: no CUDA device here; run it on a GPU machine (or --device cpu --quick)")
    if device.type == "cpu" and not args.quick:
        found.append("--device cpu: the check is for a GPU; --quick dry-runs it on the CPU")
    return found


# ---------------------------------------------------------------------------- the checks

def _series(args) -> str:
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
    reports = len(list(out.glob("[0-9][0-9]_*.html")))
    return f"{reports} reports in {time.perf_counter() - start:.0f} s (fresh cache) -> {out}/index.html"


def greedy_mismatch(target, contexts: torch.Tensor, tokens: torch.Tensor, reference: torch.Tensor,
                    tie: float = TIE_LOGITS) -> str | None:
    """None when greedy `tokens` (B, G) equal the target's own greedy `reference` (B, G) after
    `contexts` (B, T), or where each row first differs the target's top two logits after the
    reference's prefix are within `tie` (a near-tie: low-precision rounding may flip the argmax, and
    every later token follows from it); otherwise where and by how much they differ."""
    for row in range(tokens.shape[0]):
        differ = (tokens[row] != reference[row]).nonzero()
        if not len(differ):
            continue
        i = int(differ[0])
        prefix = torch.cat([contexts[row], reference[row, :i]])[None]  # (1, T + i)
        with torch.no_grad():
            top = target(prefix)[0, -1].float().topk(2).values  # (2,)
        gap = float(top[0] - top[1])
        if gap > tie:
            return f"row {row} differs at new token {i}, where the target's top two logits are {gap:.3f} apart"
    return None


def _toy_target(args, dtype=torch.float32):
    from spirelib.model.transformer import ModelConfig, Transformer

    cfg = ModelConfig(vocab_size=512, num_layers=4, d_model=64, n_q_per_kv=1, n_kv=4, d_head=16, d_ff=256)
    torch.manual_seed(0)
    target = Transformer(cfg)
    target.reset_parameters(0.3)  # peaked distributions: greedy choices far from ties
    return target.to(device=args.device, dtype=dtype).eval()


def _cuda_graphs(args) -> str:
    """Compiled decoding under CUDA graphs: AD and SD with every draft, greedy and sampled, each run
    three times (graphs recorded, then replaying). Greedy tokens equal eager's; sampled generations
    complete (a read of a graph output after the next replay raises on CUDA); no graph skipped; ms
    per step or round eager against compiled; and the host's work per round (`bench rounds`: replays
    and eager ops of a steady-state AD step and SD round)."""
    from torch._dynamo.utils import counters

    from spirelib.bench.decode import compile_all, draft_models, draft_options
    from spirelib.bench.rounds import METHODS, steady_state_counts
    from spirelib.decoding.drafts import draft_factory
    from spirelib.decoding.speculative import autoregressive_generate, speculative_generate

    target = _toy_target(args)
    models, options = draft_models(target, METHODS, 16), draft_options(16)
    contexts = torch.randint(0, target.cfg.vocab_size, (8, 64), device=args.device)

    def decode(method, temperature):
        gen = torch.Generator(args.device).manual_seed(0)
        start = time.perf_counter()
        if method == "ad":
            out = autoregressive_generate(target, contexts, 32, temperature=temperature, generator=gen)
        else:
            draft = draft_factory(method, target, models[method], temperature=temperature,
                                  **options.get(method, {}))()
            out = speculative_generate(target, draft, contexts, 32, k=4, temperature=temperature, generator=gen)
        if torch.device(args.device).type == "cuda":
            torch.cuda.synchronize(args.device)
        steps = 32 if out.accepted is None else out.accepted.shape[1]
        return out, (time.perf_counter() - start) / steps

    methods = ("ad", *models)
    eager = {m: decode(m, 0.0) for m in methods}
    compile_all(target, models, True)
    skips = counters["inductor"]["cudagraph_skips"]
    compiled = {m: [decode(m, 0.0) for _ in range(3)][-1] for m in methods}  # the last: graphs recorded, replaying
    sampled = {m: [decode(m, 1.0) for _ in range(3)][-1][0] for m in methods}
    skipped = counters["inductor"]["cudagraph_skips"] - skips
    differ = [m for m in methods if not torch.equal(eager[m][0].tokens, compiled[m][0].tokens)]
    if differ:
        raise RuntimeError(f"compiled greedy tokens differ from eager's for {', '.join(differ)}")
    invalid = [m for m in methods if not ((sampled[m].tokens >= 0) & (sampled[m].tokens < target.cfg.vocab_size)).all()]
    if invalid:
        raise RuntimeError(f"compiled sampled decoding emitted tokens outside the vocabulary for {', '.join(invalid)}")
    if torch.device(args.device).type == "cuda" and skipped:
        raise RuntimeError(f"inductor skipped CUDA graphs {skipped} times: the graphs do not replay")
    per_round = ", ".join(f"{m} {1e3 * eager[m][1]:.2f} -> {1e3 * compiled[m][1]:.2f}" for m in methods)
    host = steady_state_counts(target, models, batch=8, context=64, k=4, temperature=0.0, window=16)
    work = ", ".join(f"{r['method']} {r['replays']} + {r['eager_ops']}" for r in host)
    return (f"greedy tokens equal eager's, sampled runs complete; {skipped} graph skips; ms per step (AD) or round "
            f"eager -> compiled: {per_round}; replays + eager ops per step/round: {work}")


def _bf16_target(args) -> str:
    """A bf16 target trains an fp32 SPIRe draft for a few steps (weights, gradients and AdamW's
    moments in fp32, the loss falling), then decodes it greedily, equal to the target's own greedy
    tokens up to a near-tie (`greedy_mismatch`: bf16 rounding may flip an argmax whose top two
    logits are within `TIE_LOGITS` of each other; any other difference fails)."""
    from spirelib.decoding.drafts import draft_factory
    from spirelib.decoding.speculative import autoregressive_generate, speculative_generate
    from spirelib.model.spire import SpireConfig, SpireDraftModel
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
    same = "=" if torch.equal(sd.tokens, ad.tokens) else "= (up to near-ties)"
    return f"fp32 draft, loss {losses[0]:.3f} -> {losses[-1]:.3f} in {args.steps} steps; greedy SD {same} AD"


def _mfu(args) -> str:
    """`bench train` at the paper's target shape (8 x 512, V 50,304), compiled, bf16 autocast,
    against the bf16 matmul peak measured in the same run."""
    from spirelib.bench.train import TARGETS, measure
    from spirelib.measure.calibrate import matmul_peak
    from spirelib.modeling.costs import flop_params, training_flops

    cfg = TARGETS["workbook" if args.quick else "paper"]
    gpu = torch.device(args.device).type == "cuda"
    batch, seq = (2, 128) if args.quick else (16, 1024)
    run = measure(cfg, batch, seq, args.steps, compile=not args.quick, device=args.device)
    peak = (matmul_peak(sizes=(8192,), device=args.device, dtype=torch.bfloat16) if gpu else matmul_peak())["flops"]
    mfu = training_flops(flop_params(cfg), run["tokens_per_s"]) / peak
    return (f"{cfg.num_layers} x {cfg.d_model}, V {cfg.vocab_size:,}, batch {batch} x {seq}: "
            f"{run['tokens_per_s']:,.0f} tokens/s, MFU {mfu:.1%} of {peak / 1e12:.1f} TFLOP/s")


def _roofline(args) -> str:
    """`bench decode --roofline` at the paper's target in bf16: every forward kind and whole round
    eagerly at B 1 and 64 x L 512, then compiled AD and SD rounds (greedy; `decode.round_rows`) at
    B 64 x L 2048 and 8192, each as a fraction of the roofline (goal: the compiled AD step at 64 x
    2048 at >= 60%). Budget: `BUDGETS_S["roofline"]` (the calibration and the eager cells about
    20 s; most of the rest compiling each cell's graphs); the compiled (cell, method) pairs not
    started within it are named. --quick: the workbook's target in fp32, toy cells, all eager."""
    from spirelib.bench.decode import TIMED, build_methods, compile_all, roofline_rows, round_rows
    from spirelib.bench.train import TARGETS
    from spirelib.measure.calibrate import matmul_peak, memory_bandwidth
    from spirelib.model.transformer import Transformer

    gpu = torch.device(args.device).type == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float32
    cfg = TARGETS["workbook" if args.quick else "paper"]
    target = Transformer(cfg).to(device=args.device, dtype=dtype).eval()
    peak = matmul_peak(sizes=(8192,) if gpu else (2048,), device=args.device, dtype=dtype)["flops"]
    bandwidth = memory_bandwidth(device=args.device)["bandwidth"]
    options = {"peak_flops": peak, "bandwidth": bandwidth, "repeats": 3 if args.quick else 20}
    rows = [r for B in (1, 64) for r in roofline_rows(target, 2 if args.quick and B == 64 else B,
                                                      128 if args.quick else 512, 4, 64, **options)]
    eager = "; ".join(f"B {r['batch']} {r['kind']} {r['ms']:.2f} ms ({r['ratio']:.1f}x roof)" for r in rows
                      if r["kind"] in ("AD step", "SPIRe step", "ad round", "spire round"))
    factories, models = build_methods(target, list(TIMED), 0.0, 64)
    compile_all(target, models, not args.quick)
    pairs = [(cell, method) for cell in ([(2, 192), (2, 256)] if args.quick else [(64, 2048), (64, 8192)])
             for method in ("ad", "spire", "vanilla", "magicdec")]
    left, rounds = [], []
    for (B, L), method in in_budget(pairs, BUDGETS_S["roofline"], left):
        rounds += round_rows(target, factories, models, [method], B, L, 4, 64, compiled=not args.quick,
                             temperature=0.0, **options)
    compile_all(target, models, False)
    timed = "; ".join(f"{r['mode']} {r['kind']} at {r['batch']} x {r['context']} {r['ms']:.2f} ms "
                      f"({r['fraction']:.0%} of roof)" for r in rounds)
    return f"{eager}; {timed}{untimed(left)}"


def _peer(args) -> str:
    """`bench peer`'s compiled mode: our compiled decoding against transformers' static cache +
    torch.compile, the paper's target in bf16 (random weights, the same on both sides), greedy,
    G 64, medians of 3, at B 1 and 64 x L 512 and 2048: ours / transformers as speed for the whole
    generation and the decode step (goal >= 1.2 at every cell), tokens equal up to near-ties (a
    row differing beyond one fails). Budget: `BUDGETS_S["peer"]`, most of it compiling both sides'
    graphs for each cell's shapes; the cells not started within it are named. --quick: the
    workbook's target in fp32, two toy cells, eager (no compiling). Without transformers: skipped."""
    from spirelib.bench import peer
    from spirelib.bench.train import TARGETS
    from spirelib.decoding.drafts import vanilla_draft_config
    from spirelib.model.transformer import Transformer

    try:
        peer.import_transformers()
    except RuntimeError as e:
        raise Skipped(str(e)) from None
    gpu = torch.device(args.device).type == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float32
    cfg = TARGETS["workbook" if args.quick else "paper"]
    cells = [(1, 16), (2, 24)] if args.quick else [(B, L) for L in (512, 2048) for B in (1, 64)]
    mode, new_tokens, repeats = ("eager", 4, 1) if args.quick else ("compiled", 64, 3)
    torch.manual_seed(0)
    target, draft = Transformer(cfg).to(dtype).eval(), Transformer(vanilla_draft_config(cfg)).to(dtype).eval()
    rows, left = [], []
    with tempfile.TemporaryDirectory() as folder:
        bench = peer.Peer(target, draft, Path(folder), k=4, device=args.device)
        for B, L in in_budget(cells, BUDGETS_S["peer"], left):
            times = peer.time_cell(bench, B, L, [mode], new_tokens, repeats, cfg.vocab_size)
            rows += peer.rows_of(bench, B, L, times, new_tokens)
    differ = [f"{r['rows_differ']} of {r['batch']} rows at {r['batch']} x {r['context']}" for r in rows if r["rows_differ"]]
    if differ:
        raise RuntimeError(f"greedy tokens differ from transformers' beyond near-ties: {', '.join(differ)}")
    cells_text = "; ".join(f"{r['batch']} x {r['context']} whole {r['whole']['ratio']:.2f}, step {r['step']['ratio']:.2f}"
                           f" ({1e3 * r['step']['ours_s']:.2f} ms vs {1e3 * r['step']['theirs_s']:.2f})"
                           + (f", {r['rows_tied']} near-ties" if r["rows_tied"] else "") for r in rows)
    return f"{mode}, ours / transformers as speed: {cells_text}{untimed(left)}"


def _profiled(args) -> str:
    """`bench decode --profiled` (eager, fp32, the paper's target) at B 1 and 16 x L 512 and 1024,
    the model fitted there and judged at the held-out cell B 64 x L 2048 (goal: held-out error <=
    10%). Each cell gets runs for at most `BUDGETS_S["profiled"]` / 6 seconds (five cells and the
    calibration); the memory the runs hold is checked first (`decode.problems`). --quick: toy
    shapes and cells."""
    import argparse

    from spirelib.bench import decode
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
                                                  "--cell-seconds", BUDGETS_S["profiled"] / 6]])
    found = decode.problems(options)
    if found:
        raise RuntimeError("; ".join(found))
    torch.manual_seed(0)
    target = Transformer(cfg).to(args.device).eval()
    factories, _ = decode.build_methods(target, options.methods, options.temperature, options.window)
    cells, held = decode.profiled_grid(options)
    _, rows, verdict = decode.profiled_rows(target, factories, options.methods, cells, held, options)
    worst = max((r for r in rows if r["held_out"]), key=lambda r: abs(r["profiled_error"]))
    return (f"held-out {held[0][0]} x {held[0][1]}: worst error {verdict['held_out_max_error']:.1%} "
            f"({worst['method']}: measured {worst['measured_speedup']:.3f}, profiled {worst['profiled_speedup']:.3f}); "
            f"fitted cells' median {verdict['fitted_median_error']:.1%}, widest CI +/-{verdict['widest_ci']:.1%}")


def _memory(args) -> str:
    """A SPIRe draft's sharded training step (`training.simulate`, one rank) run for real on the GPU,
    its peak (`torch.cuda.max_memory_allocated`) against the same step simulated with fake tensors:
    they must agree within `MEMORY_TOLERANCE`, or the simulated tables of docs/scaling-out.md are
    not to be trusted."""
    from spirelib.model.spire import SpireConfig
    from spirelib.model.transformer import ModelConfig
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
    return f"step peak {measured / 1e6:,.0f} MB ({what}) vs {simulated / 1e6:,.0f} MB simulated ({off:+.1%})"


CHECKS = {"series": _series, "cuda-graphs": _cuda_graphs, "bf16-target": _bf16_target, "mfu": _mfu,
          "memory": _memory, "roofline": _roofline, "peer": _peer, "profiled": _profiled}


def main(args: argparse.Namespace) -> int:
    print(f"gpu-check on {args.device} ({torch.cuda.get_device_name(args.device) if 'cuda' in args.device else 'cpu'}"
          f", torch {torch.__version__}){' --quick' if args.quick else ''}")
    failed = 0
    for name, check in CHECKS.items():
        if name in args.skip:
            print(f"  {name:12s} skipped")
            continue
        start = time.perf_counter()
        try:
            result, status = check(args), "ok"
        except Skipped as e:
            result, status = str(e), "skip"
        except Exception as e:  # a failed check is a row of the table, the others still run
            result, status, failed = f"{type(e).__name__}: {e}", "FAIL", failed + 1
        print(f"  {name:12s} {status:4s} {time.perf_counter() - start:6.1f} s  {result}", flush=True)
    return 1 if failed else 0
