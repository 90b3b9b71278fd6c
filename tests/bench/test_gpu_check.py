"""`spire bench gpu-check`'s rows that the CPU can check: the series row trains in a fresh cache
folder under a timeout, the bf16 row's greedy comparison forgives near-ties only, the peer and
profiled rows time the cells, modes and dtype the GPU run needs within their budgets (the benchmarks
they call faked: their own tests run them; the round rows: test_gpu_rounds.py), every goal is judged from made-up
figures (ok, FAIL and the exit status 1), and the JSON summary holds every row."""

from __future__ import annotations

import json
import os
import subprocess
from types import SimpleNamespace

import pytest
import torch

from spirelib.bench import TIE_LOGITS, gpu_check, gpu_goals, greedy_mismatch
from spirelib.paths import cache_dir
from spirelib.throughput.recorded import RecordedCell


def test_series_row_runs_in_a_fresh_cache_folder_under_a_timeout(monkeypatch, tmp_path):
    calls = []

    def fake_run(cmd, **kw):
        cache = kw["env"]["SPIRE_CACHE_DIR"]
        calls.append({"cache": cache, "fresh": not os.path.isdir(cache) or not os.listdir(cache),
                      "timeout": kw.get("timeout"), "cmd": cmd})
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setenv("SPIRE_CACHE_DIR", str(tmp_path / "cached-cpu-runs"))
    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    gpu_check._series(SimpleNamespace(device="cuda"))
    (call,) = calls
    assert call["cache"] != str(cache_dir()) and call["fresh"] and "run" in call["cmd"]
    assert call["timeout"] == gpu_check.SERIES_TIMEOUT_S

    def too_slow(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    monkeypatch.setattr(gpu_check.subprocess, "run", too_slow)
    try:
        gpu_check._series(SimpleNamespace(device="cuda"))
    except RuntimeError as e:
        assert f"did not finish in {gpu_check.SERIES_TIMEOUT_S} s" in str(e)
    else:
        raise AssertionError("a series run past its timeout must fail the row")


def test_greedy_mismatch_forgives_a_near_tie_only():
    V = 8
    gap = {"value": 1.0}

    def target(prefix):  # logits (1, T, V): token 3 leads token 5 by `gap` at every position
        logits = torch.zeros(1, prefix.shape[1], V)
        logits[..., 3], logits[..., 5] = gap["value"], 0.0
        return logits

    contexts = torch.zeros(2, 4, dtype=torch.long)
    reference = torch.full((2, 6), 3)
    assert greedy_mismatch(target, contexts, reference.clone(), reference) is None
    flipped = reference.clone()
    flipped[1, 2:] = 5  # row 1 takes the runner-up at new token 2, and follows it
    assert "row 1 differs at new token 2" in greedy_mismatch(target, contexts, flipped, reference)
    gap["value"] = TIE_LOGITS / 2  # a near-tie: bf16 rounding may flip it
    assert greedy_mismatch(target, contexts, flipped, reference) is None


def test_memory_row_compares_the_traced_step_on_real_tensors_with_the_simulation():
    """`--device cpu --quick`: the step run on real tensors (the GPU run's stand-in) and simulated with
    fake tensors agree within the tolerance; on a GPU the same row reads torch.cuda.max_memory_allocated."""
    found = gpu_check._memory(SimpleNamespace(device="cpu", quick=True))
    assert "traced on real CPU tensors" in found.text and found.figures["off"] == pytest.approx(0, abs=0.1)


# ---------------------------------------------------------------------------- judging made-up figures

def graphs(**change):
    """The cuda-graphs row's figures of a GPU run that met every goal, with `change`."""
    figures = {"differ": [], "invalid": [], "untimed": [], "counts_recorded": 0,
               "recordings": {"ad T=0": [1, 0, 0], "spire T=1": [1, 0, 0]},
               "counts": {"ad": {"replays": 1, "eager_ops": 1, "syncs": 0},
                          "spire": {"replays": 1, "eager_ops": 1, "syncs": 0}}}
    return {**figures, **change}


def test_the_cuda_graphs_row_fails_on_tokens_recordings_and_host_work():
    assert gpu_goals.judge_graphs(graphs()) == []
    assert gpu_goals.judge_graphs(graphs(differ=["spire"])) == ["compiled greedy tokens differ from eager's for spire"]
    assert "outside the vocabulary for lookup" in gpu_goals.judge_graphs(graphs(invalid=["lookup"]))[0]
    twice = gpu_goals.judge_graphs(graphs(recordings={"ad T=0": [1, 1, 0]}))  # a later generation recorded again
    assert twice == ["ad T=0 recorded [1, 1, 0] graphs in its 3 generations, not [1, 0, 0]"]
    never = gpu_goals.judge_graphs(graphs(recordings={"spire T=1": [0, 0, 0]}))  # never replayed as a graph
    assert never == ["spire T=1 recorded [0, 0, 0] graphs in its 3 generations, not [1, 0, 0]"]
    assert gpu_goals.judge_graphs(graphs(recordings=None, counts_recorded=3)) == []  # the CPU: no graphs to judge
    assert gpu_goals.judge_graphs(graphs(counts_recorded=2)) == ["the counted rounds recorded 2 graphs"]
    busy = graphs(counts={"ad": {"replays": 1, "eager_ops": 3, "syncs": 0}, "spire": {"replays": 4, "eager_ops": 5,
                                                                                      "syncs": 0}})
    assert len(gpu_goals.judge_graphs(busy)) == 2  # AD over 2 eager ops, SPIRe over 3 replays
    synced = graphs(counts={"spire": {"replays": 1, "eager_ops": 1, "syncs": 1}})
    assert gpu_goals.judge_graphs(synced) == ["spire 1 replays + 1 eager ops, 1 syncs"]
    assert gpu_goals.judge_graphs(graphs(untimed=["guided"])) == ["over budget, not checked: guided"]


def test_the_roofline_host_profiled_and_time_goals_fail_just_past_their_bounds():
    ad = {"fraction": 0.61, "recorded": 0}
    assert gpu_goals.judge_roofline({"ad": ad}) == []
    assert gpu_goals.judge_roofline({"ad": {**ad, "fraction": 0.59}}) == ["AD step at 59% of its roofline"]
    assert gpu_goals.judge_roofline({"ad": {**ad, "recorded": 1}}) == ["the AD step's timing recorded 1 graphs"]
    assert gpu_goals.judge_roofline({"spire": ad}) == ["the AD step was not timed"]
    spire = {"ratio": 1.14, "recorded": 0}
    assert gpu_goals.judge_host({"spire": spire}) == []  # MagicDec untimed: only if the budget allows
    assert gpu_goals.judge_host({"spire": spire, "magicdec": {**spire, "ratio": 1.16}}) == \
        ["magicdec round wall / GPU time 1.16"]
    assert gpu_goals.judge_host({"magicdec": spire}) == ["spire was not timed"]
    assert gpu_goals.judge_profiled({"held_out_max_error": 0.099}) == []
    assert gpu_goals.judge_profiled({"held_out_max_error": 0.101}) == ["held-out error 10.1%"]
    assert gpu_goals.judge_time({"seconds": 359}) == [] and gpu_goals.judge_time({"seconds": 361}) == ["took 361 s"]


def test_the_peer_goal_asks_more_at_batch_1_than_at_every_other_cell():
    def cell(whole, step, recorded=0):
        return {"whole": {"ratio": whole}, "step": {"ratio": step}, "rows_differ": 0, "recorded": recorded}

    met = {"1x512": cell(1.2, 1.3), "64x2048": cell(1.0, 1.05)}
    assert gpu_goals.judge_peer({"untimed": [], "cells": met}) == []
    slow_step = {**met, "1x512": cell(1.3, 1.19)}
    assert gpu_goals.judge_peer({"untimed": [], "cells": slow_step}) == ["1x512 step 1.19 < 1.2"]
    assert gpu_goals.judge_peer({"untimed": [], "cells": {**met, "64x2048": cell(0.99, 1.1)}}) == \
        ["64x2048 whole 0.99 < 1.0"]
    assert gpu_goals.judge_peer({"untimed": ["64x2048"], "cells": {"1x512": cell(1.2, 1.2, recorded=1)}}) == \
        ["over budget, not timed: 64x2048", "1x512: 1 graphs recorded while timed"]


def fake_rows(monkeypatch, outcomes: dict):
    """Every row of the table replaced by one that finds `outcomes[name]` (an `Outcome`; default: ok)."""
    for name in gpu_check.CHECKS:
        found = outcomes.get(name, gpu_goals.Outcome(f"{name} fine", {"x": 1.0}))
        monkeypatch.setitem(gpu_check.CHECKS, name, lambda args, found=found: found)


def test_a_row_that_misses_its_goal_fails_the_check_and_the_summary_holds_every_row(monkeypatch, tmp_path, capsys):
    missed = gpu_goals.Outcome("AD step 1.00 ms", {"ad": {"fraction": 0.4}}, ("AD step at 40% of its roofline",))
    fake_rows(monkeypatch, {"roofline": missed, "peer": gpu_goals.Outcome("cpu ratios", {"cells": {}}, judged=False)})
    monkeypatch.setitem(gpu_check.CHECKS, "profiled", lambda args: 1 / 0)  # a row that raises fails too
    args = SimpleNamespace(device="cpu", quick=True, skip=["mfu"], notebooks=False, json=tmp_path / "s.json")
    assert gpu_check.main(args) == 1
    out = capsys.readouterr().out
    assert f"summary: {tmp_path / 's.json'}" in out
    summary = json.loads((tmp_path / "s.json").read_text())
    assert {"device", "torch", "started", "quick", "failed", "rows"} <= set(summary)
    rows = {r["name"]: r for r in summary["rows"]}
    assert list(rows) == [*gpu_check.CHECKS, "time"]
    assert all(set(r) == {"name", "status", "seconds", "figures", "goal", "budget_s", "text"} for r in rows.values())
    assert {n: r["status"] for n, r in rows.items()} == {
        "series": "skip", "cuda-graphs": "ok", "bf16-target": "ok", "mfu": "skip", "memory": "ok",
        "roofline": "FAIL", "host": "ok", "peer": "unjudged", "profiled": "FAIL", "time": "unjudged"}
    assert summary["failed"] == ["roofline", "profiled"]
    assert rows["roofline"]["figures"] == {"ad": {"fraction": 0.4}} and rows["roofline"]["budget_s"] == 60
    assert rows["roofline"]["text"].startswith("missed: AD step at 40% of its roofline")
    assert rows["peer"]["text"] == "not judged on cpu: cpu ratios" and "ZeroDivisionError" in rows["profiled"]["text"]
    assert rows["time"]["goal"] == gpu_goals.GOALS["time"] and rows["time"]["figures"]["seconds"] >= 0
    fake_rows(monkeypatch, {"peer": gpu_goals.Outcome("cpu ratios", {}, judged=False)})
    assert gpu_check.main(args) == 0  # unjudged rows fail nothing


def test_the_budgets_fit_the_time_goal_and_bind_only_at_the_checks_own_shapes():
    assert sum(gpu_check.BUDGETS_S.values()) <= 330 < gpu_goals.TIME_GOAL_S
    assert set(gpu_check.BUDGETS_S) == set(gpu_check.CHECKS) - {"series"}  # the series has its own timeout
    assert gpu_check.budget(SimpleNamespace(quick=False), "peer") == gpu_check.BUDGETS_S["peer"]
    assert gpu_check.budget(SimpleNamespace(quick=True), "peer") == float("inf")  # the CPU's dry run times all


# ---------------------------------------------------------------------------- the decoding rows, faked

class FakeModel:
    """Stands in for a Transformer of the paper's shape (built in seconds, never run): records its dtype."""

    def __init__(self, cfg):
        self.cfg, self.dtype = cfg, torch.float32

    def to(self, dtype):
        self.dtype = dtype
        return self

    def eval(self):
        return self


def fake_peer_row(monkeypatch, differ=0, ratio=1.3):
    """The peer row with `bench peer` faked: what it built and timed."""
    from spirelib.bench import peer
    from spirelib.model import transformer

    seen = {"cells": []}

    class FakePeer:
        def __init__(self, target, draft, folder, k, device):
            seen.update(target=target, draft=draft, device=device)

    def time_cell(bench, batch, context, modes, new_tokens, repeats, vocab_size):
        seen["cells"].append((batch, context))
        seen.update(modes=modes, new_tokens=new_tokens, repeats=repeats)
        return {}

    def rows_of(bench, batch, context, times, new_tokens):
        speed = {"ratio": ratio, "ours_s": 1e-3, "theirs_s": ratio * 1e-3}
        return [{"batch": batch, "context": context, "whole": speed, "step": speed, "rows_differ": differ,
                 "rows_tied": 1, "recorded": 0}]

    monkeypatch.setattr(transformer, "Transformer", FakeModel)
    monkeypatch.setattr(peer, "Peer", FakePeer)
    monkeypatch.setattr(peer, "time_cell", time_cell)
    monkeypatch.setattr(peer, "rows_of", rows_of)
    return seen


def test_peer_row_times_the_compiled_mode_at_the_gpu_cells_in_bf16_and_judges_them(monkeypatch):
    from spirelib.bench import peer

    seen = fake_peer_row(monkeypatch)
    found = gpu_check._peer(SimpleNamespace(device="cuda", quick=False))
    assert seen["cells"] == peer.GPU_CELLS == [(1, 512), (64, 2048)]
    assert seen["modes"] == ["compiled"] and seen["new_tokens"] == 64 and seen["device"] == "cuda"
    assert seen["target"].dtype == seen["draft"].dtype == torch.bfloat16
    cfg = seen["target"].cfg
    assert (cfg.num_layers, cfg.d_model, cfg.vocab_size) == (8, 512, 50_304)
    assert "64 x 2048 whole 1.30, step 1.30" in found.text and "1 near-ties" in found.text
    assert found.missed == () and found.judged and found.figures["cells"]["1x512"]["whole"]["ratio"] == 1.3
    fake_peer_row(monkeypatch, ratio=1.1)  # faster than transformers, but not by 1.2 at B 1
    assert gpu_check._peer(SimpleNamespace(device="cuda", quick=False)).missed == ("1x512 whole 1.10 < 1.2",
                                                                                   "1x512 step 1.10 < 1.2")
    assert gpu_check._peer(SimpleNamespace(device="cpu", quick=True)).missed == ()  # toy cells: not judged
    monkeypatch.setitem(gpu_check.BUDGETS_S, "peer", -1)  # spent before the first cell: none timed, all named
    seen = fake_peer_row(monkeypatch)
    found = gpu_check._peer(SimpleNamespace(device="cuda", quick=False))
    assert "over budget, not timed: (1, 512), (64, 2048)" in found.text and seen["cells"] == []
    assert found.missed == ("over budget, not timed: 1x512, 64x2048",)


def test_peer_row_fails_on_tokens_that_differ_and_is_skipped_without_transformers(monkeypatch, capsys, tmp_path):
    import sys

    fake_peer_row(monkeypatch, differ=2)
    found = gpu_check._peer(SimpleNamespace(device="cpu", quick=True))  # wrong tokens fail even where unjudged
    assert found.missed and "2 of 1 rows at 1 x 16" in found.missed[0]
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now raises ImportError
    others = [name for name in gpu_check.CHECKS if name != "peer"]
    code = gpu_check.main(SimpleNamespace(device="cpu", quick=True, skip=others, notebooks=False,
                                          json=tmp_path / "summary.json"))
    row = next(line for line in capsys.readouterr().out.splitlines() if line.split()[:1] == ["peer"])
    assert code == 0 and row.split()[1] == "skip" and "pip install" in row


def test_profiled_row_fits_a_small_grid_and_judges_64_by_2048_after_checking_memory(monkeypatch):
    from spirelib.bench import decode, decode_memory, train

    monkeypatch.setitem(train.TARGETS, "paper", train.TARGETS["workbook"])  # built in milliseconds
    seen, error = {}, {"value": -0.08}

    def profiled_rows(target, factories, methods, cells, held, options):
        seen.update(cells=cells, held=held, options=options, methods=methods)
        rows = [RecordedCell(held_out=True, method="spire", B=64, L=2048, profiled_error=error["value"],
                             measured_speedup=1.5, profiled_speedup=1.38)]
        return None, rows, {"held_out_max_error": abs(error["value"]), "fitted_median_error": 0.02, "widest_ci": 0.05}

    monkeypatch.setattr(decode, "profiled_rows", profiled_rows)
    monkeypatch.setattr(decode_memory, "available_bytes", lambda device: 10**12)
    found = gpu_check._profiled(SimpleNamespace(device="cpu", quick=False))
    assert seen["cells"] == [(1, 512), (16, 512), (1, 1024), (16, 1024), (64, 2048)] and seen["held"] == [(64, 2048)]
    assert seen["methods"] == ["ad", "spire"]
    assert seen["options"].cell_seconds == gpu_check.BUDGETS_S["profiled"] / 6 and not seen["options"].compile
    assert "held-out 64 x 2048: worst error 8.0% (spire" in found.text and found.missed == ()
    error["value"] = 0.12
    assert gpu_check._profiled(SimpleNamespace(device="cpu", quick=False)).missed == ("held-out error 12.0%",)
    monkeypatch.setattr(decode_memory, "available_bytes", lambda device: 10**6)  # 1 MB free: refused before any timing
    seen.clear()
    with pytest.raises(RuntimeError, match="at B 64 x L 2048 the timed runs hold.*--interleave runs"):
        gpu_check._profiled(SimpleNamespace(device="cpu", quick=False))
    assert seen == {}
