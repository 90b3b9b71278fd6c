"""`spire bench gpu-check`'s rows that the CPU can check: the series row trains in a fresh cache
folder under a timeout, the bf16 row's greedy comparison forgives near-ties only, and the decoding
rows (peer, roofline, profiled) time the cells, modes and dtype the GPU run needs, within their
budgets (the benchmarks they call faked: their own tests run them)."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import torch

from spirelib.bench import gpu_check
from spirelib.paths import cache_dir


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
    assert gpu_check.greedy_mismatch(target, contexts, reference.clone(), reference) is None
    flipped = reference.clone()
    flipped[1, 2:] = 5  # row 1 takes the runner-up at new token 2, and follows it
    assert "row 1 differs at new token 2" in gpu_check.greedy_mismatch(target, contexts, flipped, reference)
    gap["value"] = gpu_check.TIE_LOGITS / 2  # a near-tie: bf16 rounding may flip it
    assert gpu_check.greedy_mismatch(target, contexts, flipped, reference) is None


def test_memory_row_compares_the_traced_step_on_real_tensors_with_the_simulation():
    """`--device cpu --quick`: the step run on real tensors (the GPU run's stand-in) and simulated with
    fake tensors agree within the tolerance; on a GPU the same row reads torch.cuda.max_memory_allocated."""
    line = gpu_check._memory(SimpleNamespace(device="cpu", quick=True))
    assert "traced on real CPU tensors" in line and "simulated" in line


class FakeModel:
    """Stands in for a Transformer of the paper's shape (built in seconds, never run): records its dtype."""

    def __init__(self, cfg):
        self.cfg, self.dtype = cfg, torch.float32

    def to(self, dtype):
        self.dtype = dtype
        return self

    def eval(self):
        return self


def fake_peer_row(monkeypatch, differ=0):
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
        ratio = {"ratio": 1.3, "ours_s": 1e-3, "theirs_s": 1.3e-3}
        return [{"batch": batch, "context": context, "whole": ratio, "step": ratio, "rows_differ": differ,
                 "rows_tied": 1}]

    monkeypatch.setattr(transformer, "Transformer", FakeModel)
    monkeypatch.setattr(peer, "Peer", FakePeer)
    monkeypatch.setattr(peer, "time_cell", time_cell)
    monkeypatch.setattr(peer, "rows_of", rows_of)
    return seen


def test_peer_row_times_the_compiled_mode_at_the_paper_cells_in_bf16(monkeypatch):
    seen = fake_peer_row(monkeypatch)
    line = gpu_check._peer(SimpleNamespace(device="cuda", quick=False))
    assert seen["cells"] == [(1, 512), (64, 512), (1, 2048), (64, 2048)]
    assert seen["modes"] == ["compiled"] and seen["new_tokens"] == 64 and seen["device"] == "cuda"
    assert seen["target"].dtype == seen["draft"].dtype == torch.bfloat16
    assert (seen["target"].cfg.num_layers, seen["target"].cfg.d_model, seen["target"].cfg.vocab_size) == (8, 512, 50_304)
    assert "64 x 2048 whole 1.30, step 1.30" in line and "1 near-ties" in line
    monkeypatch.setitem(gpu_check.BUDGETS_S, "peer", -1)  # spent before the first cell: none timed, all named
    seen["cells"].clear()
    assert "over budget, not timed: (1, 512), (64, 512)" in gpu_check._peer(SimpleNamespace(device="cuda", quick=False))
    assert seen["cells"] == []


def test_peer_row_fails_on_tokens_that_differ_and_is_skipped_without_transformers(monkeypatch, capsys):
    import sys

    fake_peer_row(monkeypatch, differ=2)
    try:
        gpu_check._peer(SimpleNamespace(device="cuda", quick=False))
    except RuntimeError as e:
        assert "2 of 1 rows at 1 x 512" in str(e)
    else:
        raise AssertionError("tokens that differ beyond near-ties must fail the row")
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now raises ImportError
    others = [name for name in gpu_check.CHECKS if name != "peer"]
    code = gpu_check.main(SimpleNamespace(device="cpu", quick=True, skip=others))
    row = next(line for line in capsys.readouterr().out.splitlines() if line.split()[:1] == ["peer"])
    assert code == 0 and row.split()[1] == "skip" and "pip install" in row


def test_roofline_row_times_compiled_rounds_of_every_method_at_64_by_2048_and_8192(monkeypatch):
    import functools

    from spirelib.bench import decode, train
    from spirelib.measure import calibrate
    from spirelib.model.transformer import ModelConfig

    toy = ModelConfig(vocab_size=64, num_layers=2, d_model=32, n_q_per_kv=1, n_kv=2, d_head=16, d_ff=64)
    monkeypatch.setitem(train.TARGETS, "paper", toy)  # the row's own shapes stay; no paper-sized weights here
    monkeypatch.setattr(calibrate, "matmul_peak", functools.partial(calibrate.matmul_peak, sizes=(256,), seconds=0.01))
    monkeypatch.setattr(calibrate, "memory_bandwidth",
                        functools.partial(calibrate.memory_bandwidth, mbytes=8, seconds=0.01))
    monkeypatch.setattr(decode, "roofline_rows", lambda target, B, L, k, window, **o: [])
    calls = []

    def round_rows(target, factories, models, methods, B, L, k, window, **options):
        calls.append((B, L, *methods, options["compiled"], options["temperature"], target.compiled_decoding))
        return [{"mode": "compiled", "kind": f"{methods[0]} round", "batch": B, "context": L, "ms": 2.0,
                 "fraction": 0.5}]

    monkeypatch.setattr(decode, "round_rows", round_rows)
    line = gpu_check._roofline(SimpleNamespace(device="cpu", quick=False))
    assert calls == [(64, L, m, True, 0.0, True) for L in (2048, 8192) for m in ("ad", "spire", "vanilla", "magicdec")]
    assert "compiled ad round at 64 x 8192 2.00 ms (50% of roof)" in line
    calls.clear()
    monkeypatch.setitem(gpu_check.BUDGETS_S, "roofline", -1)
    assert "not timed: ((64, 2048), 'ad')" in gpu_check._roofline(SimpleNamespace(device="cpu", quick=False))
    assert calls == []


def test_profiled_row_fits_a_small_grid_and_judges_64_by_2048_after_checking_memory(monkeypatch):
    from spirelib.bench import decode, train

    monkeypatch.setitem(train.TARGETS, "paper", train.TARGETS["workbook"])  # built in milliseconds
    seen = {}

    def profiled_rows(target, factories, methods, cells, held, options):
        seen.update(cells=cells, held=held, options=options, methods=methods)
        rows = [{"held_out": True, "method": "spire", "profiled_error": -0.08, "measured_speedup": 1.5,
                 "profiled_speedup": 1.38}]
        return None, rows, {"held_out_max_error": 0.08, "fitted_median_error": 0.02, "widest_ci": 0.05}

    monkeypatch.setattr(decode, "profiled_rows", profiled_rows)
    monkeypatch.setattr(decode, "available_bytes", lambda device: 10**12)
    line = gpu_check._profiled(SimpleNamespace(device="cpu", quick=False))
    assert seen["cells"] == [(1, 512), (16, 512), (1, 1024), (16, 1024), (64, 2048)] and seen["held"] == [(64, 2048)]
    assert seen["options"].cell_seconds == gpu_check.BUDGETS_S["profiled"] / 6 and not seen["options"].compile
    assert "held-out 64 x 2048: worst error 8.0% (spire" in line
    monkeypatch.setattr(decode, "available_bytes", lambda device: 10**6)  # 1 MB free: refused before any timing
    seen.clear()
    try:
        gpu_check._profiled(SimpleNamespace(device="cpu", quick=False))
    except RuntimeError as e:
        assert "at B 64 x L 2048 the timed runs hold" in str(e) and "--interleave runs" in str(e)
    else:
        raise AssertionError("runs that do not fit must be refused")
    assert seen == {}
