"""`spire bench rounds`: the host's work in one decoding round, counted with torch.profiler.

On a GPU a round's time has a floor set by the host: each op dispatched outside a graph is a
kernel launched one by one (several microseconds of Python and driver each), each graph replay
one launch, and each host sync a wait for the device. A steady-state AD step and an SD round of
every method (vanilla, MagicDec, SPIRe, the guided draft, prompt lookup) are profiled once each,
after a few rounds to warm the graphs (`steady_state_counts`), their top-level events counted
(`count`) and judged against a goal (`goal`): a replay is a round's captured graph
(`graphs.GRAPH_REGION`) or a compiled forward's; the eager ops are what runs between them; host
µs is the round's time outside them, under the profiler. On the CPU nothing is captured (its
forwards are compiled C++), so there the counts and host µs are what a GPU's host would do around
the same graphs, not the CPU's own time; tests/decoding/test_round_ops.py guards the counts
through a CUDA-graph stand-in.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from spirelib.bench import DTYPES, add_model_arguments, device_problems, model_config, positive, torch_dtype
from spirelib.bench.decode_models import TIMED, compile_all, draft_models, draft_options
from spirelib.decoding.graphs import GRAPH_REGION

#: aten ops that make the host wait for the device (`tests/support/host_syncs.py` counts the same on the CPU).
SYNC_OPS = {"_local_scalar_dense", "equal", "is_nonzero", "nonzero", "masked_select", "unique", "_unique2"}
COMPILED_REGION = "Torch-Compiled Region"
METHODS = tuple(m for m in TIMED if m != "ad")


def _is_view(name: str) -> bool:
    """Whether aten op `name` ("aten::slice") only makes a view: no kernel, no memory."""
    packet = getattr(torch.ops.aten, name.removeprefix("aten::"), None)
    return packet is not None and any(getattr(packet, o).is_view for o in packet.overloads())


def count(step) -> dict:
    """Profile `step()` once: graph replays (a round's graph, `GRAPH_REGION`, or a compiled forward,
    `Torch-Compiled Region`), eager ops (aten ops outside them that launch kernels, by name), views
    (which only make metadata: apart), host syncs (`SYNC_OPS`: `.item()`, `bool()` of a tensor,
    `nonzero`, ...) outside the replays, and `host_us`, the step's microseconds outside them."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        step()
        wall_us = 1e6 * (time.perf_counter() - start)
    replays, views, ops, syncs, inside_us = 0, 0, Counter(), 0, 0.0
    regions = [e for e in prof.events() if e.name.startswith((GRAPH_REGION, COMPILED_REGION))]
    outermost = [e for e in regions if not _within(e, regions)]
    for event in prof.events():
        name = event.name
        if name.removeprefix("aten::") in SYNC_OPS and not _within(event, outermost):
            syncs += 1
        if event.cpu_parent is not None:
            continue
        if event in outermost:
            replays += 1
            inside_us += event.time_range.elapsed_us()
        elif name.startswith("aten::") and not _within(event, outermost):
            if _is_view(name):
                views += 1
            else:
                ops[name.removeprefix("aten::")] += 1
    return {"replays": replays, "eager_ops": sum(ops.values()), "views": views, "syncs": syncs, "ops": ops,
            "host_us": wall_us - inside_us}


def _within(event, regions) -> bool:
    """Whether `event` runs inside one of `regions` (a replay), itself excluded."""
    return any(r is not event and r.time_range.start <= event.time_range.start and event.time_range.end
               <= r.time_range.end and r.thread == event.thread for r in regions)


def steady_state_counts(target, models: dict, *, batch: int, context: int, k: int, temperature: float,
                        window: int = 64, warmup: int = 3) -> list[dict]:
    """Counts (`count`) of one AD step and one SD round per method in `draft_models` ({method: its
    trained model or None, `decode_models.draft_models`; the sparse drafts at `window`, `decode_models.draft_options`),
    each after `warmup` rounds of its own generation (graphs compiled and recorded by then)."""
    from spirelib.decoding.builders import draft_factory
    from spirelib.decoding.speculative import Options, autoregressive_rounds, speculative_rounds

    device = next(target.parameters()).device
    contexts = torch.randint(0, target.cfg.vocab_size, (batch, context), device=device)
    new_tokens = (warmup + 2) * (k + 1)  # no row can finish before the counted round
    rows = []
    for method in ("ad", *models):
        gen = torch.Generator(device).manual_seed(0)
        if method == "ad":
            rounds = autoregressive_rounds(target, contexts, new_tokens, temperature=temperature, generator=gen)
        else:
            options = draft_options(window).get(method, {})
            draft = draft_factory(method, target, models[method], temperature=temperature, **options)()
            rounds = speculative_rounds(target, draft, contexts, new_tokens, k, Options(temperature, generator=gen))
        for _ in range(warmup):
            next(rounds)
        rows.append({"method": method, **count(functools.partial(next, rounds))})
        rounds.close()
    return rows


#: What a round may cost the host (our goal, method §3.5): an AD step one replay and at most 2 eager ops;
#: an SD round at most 3 replays and 5 eager ops (today one replay and the stop flag's copy).
GOAL = {"ad": (1, 2), "sd": (3, 5)}


def goal(row: dict) -> bool:
    """Whether a row meets `GOAL`, with no host sync."""
    replays, ops = GOAL["ad" if row["method"] == "ad" else "sd"]
    return row["replays"] <= replays and row["eager_ops"] <= ops and not row["syncs"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--batch", type=int, default=4, help="B rows decoded in lockstep")
    parser.add_argument("--context", type=int, default=64, help="L tokens of context per row")
    parser.add_argument("-k", type=int, default=4, help="draft tokens a round")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    parser.add_argument("--window", type=int, default=64, help="sparse window (sink 1): MagicDec, SPIRe, guided")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--eager", action="store_true", help="count eager decoding (default: compiled)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32")


def problems(args: argparse.Namespace) -> list[str]:
    found = positive(args, *("batch", "context", "k", "window", "vocab_size", "target_layers", "d_model",
                             "n_q_per_kv", "n_kv", "d_head", "d_ff"))
    if args.temperature < 0:
        found.append(f"--temperature: must be >= 0, got {args.temperature}")
    return found + device_problems(args.device)


def main(args: argparse.Namespace) -> int:
    from spirelib.model.transformer import Transformer

    target = Transformer(model_config(args)).to(device=args.device, dtype=torch_dtype(args.dtype)).eval()
    models = draft_models(target, args.methods, args.window)
    compile_all(target, models, not args.eager)
    rows = steady_state_counts(target, models, batch=args.batch, context=args.context,
                               k=args.k, temperature=args.temperature, window=args.window)
    mode = "eager" if args.eager else "compiled"
    print(f"host work per round, {mode}, {args.device} {args.dtype}, B {args.batch} x L {args.context}, k {args.k}, "
          f"T {args.temperature:g} (goal: AD {GOAL['ad'][0]} replay + <= {GOAL['ad'][1]} ops; SD <= {GOAL['sd'][0]} "
          f"replays + <= {GOAL['sd'][1]} ops; no sync)")
    print(f"{'method':10s} {'replays':>7s} {'eager ops':>9s} {'views':>5s} {'syncs':>5s} {'host us':>8s}  goal  "
          "most frequent eager ops")
    for row in rows:
        common = ", ".join(f"{name} {n}" for name, n in row["ops"].most_common(6))
        print(f"{row['method']:10s} {row['replays']:7d} {row['eager_ops']:9d} {row['views']:5d} {row['syncs']:5d} "
              f"{row['host_us']:8.0f}  {'met ' if goal(row) else 'not '}  {common}")
    return 0
