"""`spire bench gpu-check`'s rows that the CPU can check: the series row trains in a fresh cache
folder under a timeout, and the bf16 row's greedy comparison forgives near-ties only."""

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
