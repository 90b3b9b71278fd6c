"""The GPU check's rows that time whole decoding rounds (`gpu_check`, `make gpu-check`), on one set of
decoding models built once (`decoding_models`: the paper's target in bf16 and every draft, greedy) so
that the kernels one row compiles serve the next at the same shapes: the roofline row
(`roofline_check`: the compiled AD step and SPIRe's round against the roofline of the bytes they
read, and the AD step reading only the live keys) and the host row (`host_check`: an SD round's wall
time against its device time, `host_overhead`). What they judge is `gpu_goals`'.
"""

from __future__ import annotations

import time
import warnings

import torch

from spirelib.bench import synchronize
from spirelib.bench.gpu_goals import (
    HOST_METHODS,
    QUICK_ROUND_CELL,
    ROOFLINE_METHODS,
    ROUND_CELL,
    WINDOW,
    K,
    Outcome,
    budget,
    in_budget,
    judge_host,
    judge_roofline,
    judged_outcome,
    untimed,
)
from spirelib.throughput.hardware import Machine

LIVE_READS = "ad, live reads"  # the roofline row's last: the AD step reading only the live keys (`live_reads_rows`)

_BUILT: dict = {}  # (config, device, dtype) -> (target, factories, models): the decoding models rows share


def decoding_models(args) -> tuple:
    """The paper's target in bf16 (--quick: the workbook's in fp32) and its drafts, greedy
    (`decode_models.build_methods`), built once for the rows that time their rounds (`roofline_check`, `host_check`),
    so that the kernels one compiles serve the other at the same shapes."""
    from spirelib.bench.decode_models import TIMED, build_methods
    from spirelib.bench.train import TARGETS
    from spirelib.model.transformer import Transformer

    cfg = TARGETS["workbook" if args.quick else "paper"]
    dtype = torch.bfloat16 if torch.device(args.device).type == "cuda" else torch.float32
    key = (cfg, args.device, dtype)
    if key not in _BUILT:
        _BUILT.clear()
        torch.manual_seed(0)
        target = Transformer(cfg).to(device=args.device, dtype=dtype).eval()
        _BUILT[key] = (target, *build_methods(target, list(TIMED), 0.0, WINDOW))
    return _BUILT[key]


def release_decoding() -> None:
    """Between rows: every round graph and its memory pool (`GRAPHS.release`) and the caches the
    shared decoding models keep (`kvcache.release`), so that one row's buffers and prefill
    activations leave the next the whole memory; compiled kernels stay (no `torch._dynamo.reset`)."""
    from spirelib.decoding.graphs import GRAPHS
    from spirelib.model.kvcache import release

    for target, _, models in _BUILT.values():
        for model in (target, *models.values()):
            if model is not None:
                release(model)
    GRAPHS.release()


def round_cell(args) -> tuple[tuple[int, int], int]:
    """((B, L), timed rounds) of the roofline and host rows: the same generations, so the same kernels."""
    return (QUICK_ROUND_CELL, 3) if args.quick else (ROUND_CELL, 20)


def roofline_check(args) -> Outcome:
    """`bench decode --roofline`'s whole rounds (`decode.round_rows`), compiled and greedy, of the
    paper's target in bf16 at `ROUND_CELL`: the AD step (goal: >= `ROOFLINE_GOAL` of the roofline of
    the bytes it reads: the weights and the target cache's whole capacity, `roofline.forward_shapes`)
    and SPIRe's round, each beside its useful fraction (the live keys alone) and the graphs recorded
    while timed (after retakes). Budget: `BUDGETS_S["roofline"]`, mostly compiling; the methods not
    started within it are named. --quick: the workbook's target in fp32, toy cell, eager."""
    from spirelib.bench.decode import RoundCell, round_rows
    from spirelib.bench.decode_models import compile_all
    from spirelib.bench.roofline import RooflineTiming
    from spirelib.measure.calibrate import matmul_peak, memory_bandwidth

    target, factories, models = decoding_models(args)
    gpu, dtype = torch.device(args.device).type == "cuda", next(target.parameters()).dtype
    peak = matmul_peak(sizes=(8192,) if gpu else None, device=args.device, dtype=dtype)["flops"]  # CPU: `SIZES`
    bandwidth = memory_bandwidth(device=args.device)["bandwidth"]
    machine = Machine(peak, bandwidth, dtype.itemsize)
    compile_all(target, models, not args.quick)
    (B, L), repeats = round_cell(args)
    left, rows = [], []

    def timed(method: str) -> list[dict]:
        return round_rows(target, factories, models, [method], RoundCell(B, L, K), WINDOW,
                          RooflineTiming(machine, repeats, compiled=not args.quick))
    for method in in_budget([*ROOFLINE_METHODS, LIVE_READS], budget(args, "roofline"), left):
        rows += live_reads_rows(target, lambda: timed("ad")) if method == LIVE_READS else timed(method)
    figures = {"peak_tflops": peak / 1e12, "bandwidth_gbs": bandwidth / 1e9, "untimed": left, **{
        r["kind"].removesuffix(" round"): {n: r[n] for n in ("ms", "mbytes", "useful_mbytes", "fraction",
                                                             "useful_fraction", "recorded")} for r in rows}}
    timed = "; ".join(f"{r['mode']} {r['kind']} at {B} x {L} {r['ms']:.2f} ms: {r['fraction']:.0%} of the roofline "
                      f"of {r['mbytes']:,.0f} MB read ({r['useful_fraction']:.0%} useful, at the live keys)"
                      + (f", {r['recorded']} graphs recorded while timed" if r["recorded"] else "") for r in rows)
    return judged_outcome(args, f"{timed}{untimed(left)}", figures, judge_roofline)


def live_reads_rows(target, timed) -> list[dict]:
    """`timed()`'s rows with the target's decode-time attention reading only the live key blocks
    (`Transformer.live_reads`, FlexAttention's split-KV decoding kernel) instead of its cache's whole
    capacity, masked (the default): the measurement that decides which decodes by default. Its caches
    and graphs are its own (`release_decoding`d before and after); each row's kind says "live reads"."""
    release_decoding()
    target.live_reads = True
    try:
        with warnings.catch_warnings():  # --quick times it eagerly, through FlexAttention's reference kernel
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            rows = timed()
    finally:
        target.live_reads = False
        release_decoding()
    return [{**r, "kind": r["kind"].replace(" round", ", live reads round")} for r in rows]


def host_overhead(target, factories: dict, method: str, batch: int, context: int, rounds: int) -> dict:
    """An SD round's host overhead (method §3.5): after a warm-up (`decode.warm_up`), a generation's
    rounds 2 to `rounds` run as the engine runs them (the host loop, one synchronize at the end),
    their wall time per round against the device's per round (`SectionTimer`: CUDA events around
    each replay on a GPU; the CPU's clock per section elsewhere). A timing that recorded a graph is
    taken again (`bench.replayed`). {"wall_ms", "busy_ms", "ratio": wall / busy, "recorded"}."""
    from spirelib.bench import replayed
    from spirelib.bench.decode import RoundCell, round_generation, warm_up
    from spirelib.decoding.sections import SectionTimer
    from spirelib.measure.wallclock import DECODE_SECTIONS

    dev, cell = next(target.parameters()).device, RoundCell(batch, context, K)
    warm_up(target, factories, method, cell, rounds)

    def take() -> tuple[float, float]:
        timer = SectionTimer(dev)

        def busy() -> float:  # the device's seconds in rounds so far (waits for them on a GPU)
            return sum(timer.seconds.get(s, 0.0) for s in DECODE_SECTIONS)

        generation = round_generation(target, factories, method, cell, rounds, run=1, timer=timer)
        next(generation)  # the prefill and the first round: not timed
        before, start = busy(), time.perf_counter()
        for _ in range(rounds - 1):
            next(generation)
        synchronize(dev)
        wall = time.perf_counter() - start
        generation.close()
        return wall, busy() - before

    (wall, gpu), recorded = replayed(take)
    return {"wall_ms": 1e3 * wall / (rounds - 1), "busy_ms": 1e3 * gpu / (rounds - 1), "ratio": wall / gpu,
            "recorded": recorded}


def host_check(args) -> Outcome:
    """`host_overhead` of compiled greedy SD rounds at the roofline row's cell and rounds (its
    kernels reused): `HOST_METHODS`, the first the goal's, the rest while `BUDGETS_S["host"]` lasts.
    --quick: the workbook's target in fp32, toy cell, eager."""
    from spirelib.bench import decode_models, roofline

    target, factories, models = decoding_models(args)
    decode_models.compile_all(target, models, not args.quick)
    (B, L), repeats = round_cell(args)
    left, figures = [], {}
    for method in in_budget(list(HOST_METHODS), budget(args, "host"), left):
        figures[method] = host_overhead(target, factories, method, B, L, roofline.round_count(repeats))
    text = "; ".join(f"{m} round at {B} x {L}: {f['wall_ms']:.2f} ms wall / {f['busy_ms']:.2f} ms on the device = "
                     f"{f['ratio']:.2f}" + (f", {f['recorded']} graphs recorded while timed" if f["recorded"] else "")
                     for m, f in figures.items())
    return judged_outcome(args, f"{text}{untimed(left)}", {**figures, "untimed": left}, judge_host)
