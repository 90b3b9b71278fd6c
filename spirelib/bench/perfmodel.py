"""`spire bench perfmodel`: how long the vectorized throughput model takes.

Times the paper's three Figure-4 heat maps (3 methods x 8 batch sizes x 9 contexts, one
call per method, and cell by cell for comparison), a 256 x 256 grid per method, the G-aware Figure-4 grids (G = 64) and one
live-explorer redraw's computation. Reports the median of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from spirelib.bench import positive
from spirelib.throughput import perfmodel as pm


def _median_seconds(fn, repeat: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _grids(B, L, model):
    def run():
        for method in pm.MODELED_METHODS:
            draft = pm.PAPER_DRAFTS["seqax-67m"].get(method)
            model(method, pm.PAPER_TAU[512][method], B, L, "seqax-67m", draft)
    return run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per case (median reported)")


def problems(args: argparse.Namespace) -> list[str]:
    return positive(args, "repeat")


def main(args: argparse.Namespace) -> int:
    fig4_b, fig4_l = 2 ** np.arange(0, 8)[:, None], 2 ** np.arange(5, 14)[None, :]  # (8, 1), (1, 9)
    big_b = np.linspace(1, 1024, 256)[:, None]  # (256, 1)
    big_l = np.geomspace(8, 2**20, 256)[None, :]  # (1, 256)

    def g_aware(method, tau, B, L, target, draft):
        return pm.throughput_multiplier_over_generation(method, tau, B, L, 64, target, draft)

    def explorer_redraw():
        for method in pm.MODELED_METHODS:
            draft = pm.PAPER_DRAFTS["seqax-67m"].get(method)
            tau = pm.PAPER_TAU[512][method]
            pm.throughput_multiplier(method, tau, 64, 2 ** np.arange(3, 21), "seqax-67m", draft)
            pm.throughput_multiplier(method, tau, 2 ** np.arange(0, 11), 512, "seqax-67m", draft)

    def cell_by_cell(method, tau, B, L, target, draft):  # the appendix's way: a Python loop over cells
        return [[pm.throughput_multiplier(method, tau, int(b), int(l), target, draft) for l in L.ravel()]
                for b in B.ravel()]

    cases = [
        ("Figure 4: 3 methods x 8 x 9 cells", 3 * 8 * 9, _grids(fig4_b, fig4_l, pm.throughput_multiplier)),
        ("Figure 4, one call per cell (Python loop)", 3 * 8 * 9, _grids(fig4_b, fig4_l, cell_by_cell)),
        ("256 x 256 grid, 3 methods", 3 * 256 * 256, _grids(big_b, big_l, pm.throughput_multiplier)),
        ("Figure 4, G-aware (G = 64)", 3 * 8 * 9, _grids(fig4_b, fig4_l, g_aware)),
        ("explorer redraw: 2 slices x 3 methods", 3 * (18 + 11), explorer_redraw),
    ]
    print(f"perfmodel benchmark (median of {args.repeat} runs, numpy {np.__version__})")
    print(f"{'case':<42} {'cells':>8} {'time':>11} {'per cell':>10}")
    for name, cells, fn in cases:
        seconds = _median_seconds(fn, args.repeat)
        print(f"{name:<42} {cells:>8} {seconds * 1e3:>9.3f} ms {seconds / cells * 1e9:>7.0f} ns")
    return 0
