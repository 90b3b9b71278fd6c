"""`spire deploy --explain`: an engine file read back the way that engine would, B by B.

What the engine refuses in the file and the k it picks per batch size (and per context, for vLLM's
open PR), by `throughput.engines`' model of its documented lookup (`engine_reading`), in runs of equal
k, beside the workbook's own schedule and its modeled multipliers when a run is given (`explain`).
Apart from writing the files (`deploy`): it reads any file in an engine's form, ours or not.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import yaml

from spirelib.throughput import engines
from spirelib.throughput.methods import label
from spirelib.throughput.recorded import DeployError
from spirelib.workbook.deploy_inputs import Inputs

EXPLAIN_ENGINES = ("vllm", "vllm_pr48944", "trtllm", "sglang")


def load_engine_file(path: Path) -> dict:
    """An engine file as data: YAML (.yaml, .yml; TensorRT-LLM's under `speculative_config`) or JSON."""
    if not path.is_file():
        raise DeployError(f"--explain {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text()) if path.suffix in (".yaml", ".yml") else json.loads(path.read_text())
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        raise DeployError(f"--explain {path}: not valid YAML/JSON ({e}); give an engine file spire deploy wrote "
                          "or one in the same form") from e
    if not isinstance(data, dict):
        raise DeployError(f"--explain {path}: expected a mapping of the engine's keys")
    return data.get("speculative_config", data)


def engine_reading(engine: str, config: dict, batches, contexts=(None,), graph_bs=engines.CUDA_GRAPH_BS,
                   server_args: dict | None = None) -> tuple[list[str], dict]:
    """What `engine` refuses in `config` and the k it picks per (batch, context) of `batches` x
    `contexts` (context None where the engine reads none). SGLang reads the adaptive config with
    an EAGLE-family algorithm at the first slot's steps unless `server_args` says otherwise."""
    try:
        if engine == "vllm":
            return engines.vllm_problems(config), {(b, None): engines.vllm_k(config, b) for b in batches}
        if engine == "vllm_pr48944":
            return [], {(b, L): engines.vllm_context_k(config, b, L) for b in batches for L in contexts}
        if engine == "trtllm":
            return engines.trtllm_problems(config), {(b, None): engines.trtllm_k(config, b) for b in batches}
        first = config[min(config, key=int)]["candidate_steps"][0]
        args = server_args or {"speculative_algorithm": "EAGLE", "speculative_adaptive": True,
                               "speculative_num_steps": first, "speculative_eagle_topk": 1,
                               "speculative_num_draft_tokens": first + 1}
        return (engines.sglang_problems(config, args),
                {(b, None): engines.sglang_k(config, args, b, graph_bs) for b in batches})
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise DeployError(f"--engine {engine}: the file is not in that engine's form ({e!r}); see docs/deploy.md "
                          "for each engine's keys") from e


def explain(path: Path, engine: str, max_batch: int, contexts, inp: Inputs | None = None, method: str | None = None,
            graph_bs=engines.CUDA_GRAPH_BS) -> str:
    """`spire deploy --explain`: what `engine` would do with the file at `path`, B by B (runs of
    equal k in one row; per context where it reads one), next to the workbook's scheduled k and
    its modeled multiplier when a run's `inp` and `method` are given."""
    if engine not in EXPLAIN_ENGINES:
        raise DeployError(f"--engine {engine}: choose one of {', '.join(EXPLAIN_ENGINES)}")
    info = engines.ENGINES[engine]
    batches = range(1, max_batch + 1)
    reads_context = engine == "vllm_pr48944"
    problems, picked = engine_reading(engine, load_engine_file(path), batches,
                                      tuple(contexts) if reads_context else (None,), graph_bs)
    lines = [engines.SERVING, "", f"{info.label} ({info.release}) reading {path}:",
             f"  its batch size: {info.batch}; past the last entry: {info.beyond}"]
    if engine == "sglang":
        lines.append("  read as an EAGLE-family algorithm would (STANDALONE ignores the file and runs its "
                     "--speculative-num-steps); batches padded to the CUDA-graph sizes "
                     f"{', '.join(map(str, graph_bs))}")
    lines += [f"  refused: {p}" for p in problems] or ["  the engine's checks pass"]
    ours = {}  # (B, L) -> (the workbook's k, its modeled multiplier, the multiplier at the engine's k)
    if inp is not None:
        for L in (tuple(contexts) if reads_context else (None,)):
            table = inp.table(method, L)
            s = inp.schedule(table)
            ours.update({(b, L): (s.k_at(b), float(table.at(s.k_at(b))[0][b - 1]),
                                  float(table.at(picked[(b, L)])[0][b - 1]) if picked[(b, L)] <= table.ks[-1] else None)
                         for b in batches})
        lines.append(f"  beside the workbook's schedule for {label(method)} ({inp.run} on {inp.device} {inp.dtype}, "
                     f"{inp.shapes} shapes, L = {inp.context if not reads_context else 'per row'}); modeled "
                     "multipliers over AD (-: the engine's k is deeper than the acceptance was measured)")
    header = ["B", *(["L"] if reads_context else []), "engine k",
              *(["workbook k", "modeled x", "x at engine k"] if ours else [])]
    rows = []
    for L in (tuple(contexts) if reads_context else (None,)):
        for _, run in itertools.groupby(batches, key=lambda b, L=L: (picked[(b, L)], ours.get((b, L), (None,))[0])):
            run = list(run)
            k = picked[(run[0], L)]
            span = f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0])
            cells = [span, *([str(L)] if reads_context else []), str(k)]
            if ours:
                mine = ours[(run[0], L)][0]
                cells.append(str(mine) + ("" if mine == k else "  <- differs"))
                for column in (1, 2):
                    xs = [ours[(b, L)][column] for b in run if ours[(b, L)][column] is not None]
                    cells.append(f"{min(xs):.2f}-{max(xs):.2f}" if xs else "-")
            rows.append(cells)
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in (header, *rows)]
    return "\n".join(lines)
