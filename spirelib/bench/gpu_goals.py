"""What `spire bench gpu-check` judges: each row's goal (`GOALS`) and budget (`BUDGETS_S`, spent
cell by cell by `in_budget`), how a
row's figures are judged against it (`judge_*`: the goals missed, in words), a row of the table
(`Row`, `judged_row`) and the JSON summary beside the table (`summary`), which the next GPU run
compares line by line. `gpu_check` measures the figures; this module only judges them, so a goal
changes here and nowhere else.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from typing import NamedTuple

import torch

from spirelib.bench.rounds import GOAL as ROUND_GOAL

#: The series row's subprocess is stopped (and the row fails) after this many seconds.
SERIES_TIMEOUT_S = 1200
#: How far the GPU's measured peak of a training step may be from the simulated one.
MEMORY_TOLERANCE = 0.10
#: Seconds each row may take on one H100 from a cold compile cache (330 together, the series apart:
#: it has `SERIES_TIMEOUT_S`). Estimates, to be set from a GPU run's summary (its rows' seconds). A
#: row that times cells starts none once its budget is spent; the others only state theirs.
BUDGETS_S = {"cuda-graphs": 90, "bf16-target": 15, "mfu": 40, "memory": 15, "roofline": 60, "host": 30,
             "peer": 60, "profiled": 20}
TIME_GOAL_S = 360  # the whole check, the series apart
ROOFLINE_GOAL = 0.60  # of the roofline of the bytes a compiled AD step reads, at `ROUND_CELL`
HOST_GOAL = 1.15  # an SD round's wall time over its GPU time, at `ROUND_CELL`
PEER_B1_GOAL, PEER_GOAL = 1.2, 1.0  # ours / transformers as speed: at B 1, at every cell
PROFILED_GOAL = 0.10  # the profiled model's worst error at its held-out cell
ROUND_CELL, QUICK_ROUND_CELL = (64, 2048), (2, 192)  # (B, L) of the roofline and host rows
K, WINDOW = 4, 64  # draft tokens a round; the sparse drafts' window (sink 1): every row that decodes
ROOFLINE_METHODS, HOST_METHODS = ("ad", "spire"), ("spire", "magicdec")  # the first of each is the goal's
GOALS = {
    "series": f"the smoke series runs end to end on the GPU within {SERIES_TIMEOUT_S} s",
    "cuda-graphs": ("compiled greedy tokens = eager's and sampled ones in the vocabulary, every method; each (method, "
                    "T) records its round graph once, later generations none; a steady-state AD step "
                    f"{ROUND_GOAL['ad'][0]} replay + <= {ROUND_GOAL['ad'][1]} eager ops, an SD round <= "
                    f"{ROUND_GOAL['sd'][0]} replays + <= {ROUND_GOAL['sd'][1]} eager ops, no host sync"),
    "bf16-target": "fp32 draft weights and moments, the loss falls, greedy SD = AD up to near-ties",
    "mfu": "reported (no goal)",
    "memory": f"the measured step peak within {MEMORY_TOLERANCE:.0%} of the simulated one",
    "roofline": (f"compiled AD step at B {ROUND_CELL[0]} x L {ROUND_CELL[1]} >= {ROOFLINE_GOAL:.0%} of the roofline "
                 "of the bytes it reads"),
    "host": f"an SD round's wall time <= {HOST_GOAL} x its GPU time at B {ROUND_CELL[0]} x L {ROUND_CELL[1]}",
    "peer": (f"ours / transformers >= {PEER_B1_GOAL} at B 1 and >= {PEER_GOAL} at every cell (whole generation "
             "and decode step), tokens equal up to near-ties"),
    "profiled": f"held-out error <= {PROFILED_GOAL:.0%}",
    "time": f"the whole check within {TIME_GOAL_S} s (the series apart)",
}



class Outcome(NamedTuple):
    """What a check found: its text, its figures (numbers, for the summary), the goals it missed
    (any: FAIL) and whether its figures were judged here (False: reported, not judged)."""

    text: str
    figures: dict
    missed: tuple = ()
    judged: bool = True


@dataclasses.dataclass
class Row:
    """A row of the table and of the JSON summary: status ok, FAIL, skip or unjudged."""

    name: str
    status: str
    seconds: float
    figures: dict
    goal: str
    budget_s: float | None
    text: str


def budget(args: argparse.Namespace, name: str) -> float:
    """Seconds row `name` may take (`BUDGETS_S`); --quick's dry run has none (its CPU compiles C++,
    many times slower than a GPU's budget allows), so it runs every cell."""
    return math.inf if args.quick else BUDGETS_S[name]


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


def judged(args: argparse.Namespace) -> bool:
    """Whether timed figures are judged: at the check's own shapes, not at --quick's toy ones."""
    return not args.quick


def judged_outcome(args: argparse.Namespace, text: str, figures: dict, judge) -> Outcome:
    """A timed row's `Outcome`: the goals `judge(figures)` finds missed where `judged`, else none."""
    return Outcome(text, figures, tuple(judge(figures)) if judged(args) else (), judged(args))


def device_name(args: argparse.Namespace) -> str:
    return torch.cuda.get_device_name(args.device) if torch.device(args.device).type == "cuda" else "cpu"


def judge_graphs(figures: dict) -> list[str]:
    """The cuda-graphs row's missed goals: methods whose compiled greedy tokens differ from eager's
    or whose sampled tokens leave the vocabulary, methods left unchecked, (where rounds are
    captured: `recordings` not None) a (method, T) whose three generations did not record [1, 0, 0]
    graphs or counted rounds that recorded, and steady-state counts over `rounds.GOAL`."""
    from spirelib.bench.rounds import goal

    missed = []
    if figures["differ"]:
        missed.append(f"compiled greedy tokens differ from eager's for {', '.join(figures['differ'])}")
    if figures["invalid"]:
        missed.append(f"sampled tokens outside the vocabulary for {', '.join(figures['invalid'])}")
    if figures["untimed"]:
        missed.append(f"over budget, not checked: {', '.join(figures['untimed'])}")
    if figures["recordings"] is not None:
        missed += [f"{run} recorded {n} graphs in its 3 generations, not [1, 0, 0]"
                   for run, n in figures["recordings"].items() if n != [1, 0, 0]]
        if figures["counts_recorded"]:
            missed.append(f"the counted rounds recorded {figures['counts_recorded']} graphs")
    return missed + [f"{m} {c['replays']} replays + {c['eager_ops']} eager ops, {c['syncs']} syncs"
                     for m, c in figures["counts"].items() if not goal({"method": m, **c})]


def judge_roofline(figures: dict) -> list[str]:
    """The roofline row's missed goals: AD's compiled step under `ROOFLINE_GOAL` of its roofline,
    untimed, or timed while a graph recorded."""
    ad = figures.get("ad")
    if ad is None:
        return ["the AD step was not timed"]
    missed = []
    if ad["fraction"] < ROOFLINE_GOAL:
        missed.append(f"AD step at {ad['fraction']:.0%} of its roofline")
    if ad["recorded"]:
        missed.append(f"the AD step's timing recorded {ad['recorded']} graphs")
    return missed


def judge_host(figures: dict) -> list[str]:
    """The host row's missed goals: a timed method whose round's wall time is over `HOST_GOAL` x its
    GPU time or which recorded while timed; `HOST_METHODS[0]` untimed."""
    missed = [] if HOST_METHODS[0] in figures else [f"{HOST_METHODS[0]} was not timed"]
    for method in (m for m in HOST_METHODS if m in figures):
        f = figures[method]
        if f["ratio"] > HOST_GOAL:
            missed.append(f"{method} round wall / GPU time {f['ratio']:.2f}")
        if f["recorded"]:
            missed.append(f"{method}'s timing recorded {f['recorded']} graphs")
    return missed


def judge_peer(figures: dict) -> list[str]:
    """The peer row's missed goals: at a cell, ours / transformers (whole generation or decode step)
    under `PEER_B1_GOAL` at B 1 or `PEER_GOAL`, or timings that recorded; cells left untimed."""
    missed = [f"over budget, not timed: {', '.join(figures['untimed'])}"] if figures["untimed"] else []
    for cell, f in figures["cells"].items():
        least = PEER_B1_GOAL if cell.startswith("1x") else PEER_GOAL
        missed += [f"{cell} {part} {f[part]['ratio']:.2f} < {least}" for part in ("whole", "step")
                   if f[part]["ratio"] < least]
        if f["recorded"]:
            missed.append(f"{cell}: {f['recorded']} graphs recorded while timed")
    return missed


def judge_profiled(figures: dict) -> list[str]:
    error = figures["held_out_max_error"]
    return [f"held-out error {error:.1%}"] if error > PROFILED_GOAL else []


def judge_time(figures: dict) -> list[str]:
    return [f"took {figures['seconds']:.0f} s"] if figures["seconds"] > TIME_GOAL_S else []


# ---------------------------------------------------------------------------- the table and its summary

def judged_row(name: str, found: Outcome, seconds: float, args: argparse.Namespace) -> Row:
    """Row `name` of what its check found: FAIL with the goals missed, ok, or unjudged (figures that
    mean nothing here: reported, "not judged on cpu")."""
    status = "FAIL" if found.missed else "ok" if found.judged else "unjudged"
    where = "on cpu" if torch.device(args.device).type == "cpu" else "at --quick's toy shapes"
    text = (f"missed: {'; '.join(found.missed)} | {found.text}" if found.missed else
            found.text if found.judged else f"not judged {where}: {found.text}")
    limit = TIME_GOAL_S if name == "time" else BUDGETS_S.get(name)
    return Row(name, status, seconds, found.figures, GOALS[name], limit, text)


def time_row(seconds: float, args: argparse.Namespace) -> Row:
    """The whole check's seconds (the series apart) against `TIME_GOAL_S`."""
    figures = {"seconds": seconds}
    found = judged_outcome(args, f"{seconds:.0f} s (process start-up and imports apart)", figures, judge_time)
    return judged_row("time", found, seconds, args)


def summary(rows: list[Row], args: argparse.Namespace, started: str) -> dict:
    """The JSON summary: the machine, torch, when, the options, and every row (`Row`'s fields), so
    that the next GPU run compares line by line."""
    return {"device": device_name(args), "torch": torch.__version__, "started": started, "quick": args.quick,
            "failed": [r.name for r in rows if r.status == "FAIL"], "rows": [dataclasses.asdict(r) for r in rows]}
