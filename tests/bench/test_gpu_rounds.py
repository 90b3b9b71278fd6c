"""gpu-check's rows that time whole decoding rounds (`bench.gpu_rounds`), at toy shapes on the CPU:
the roofline row times compiled greedy rounds at the check's own cell (the AD step, SPIRe's round,
then the AD step reading only the live keys) and judges the AD step, spending its budget cell by
cell; the host row divides each round's wall time by its device time on the roofline row's
generations. The benchmarks they call are faked where a test says so (their own tests run them)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spirelib.bench import gpu_goals, gpu_rounds, roofline


def toy_paper_target(monkeypatch):
    """The paper's target replaced by a toy one (the rows' own cells stay), built afresh for this test
    (no models shared with another's), and fast calibrations."""
    import functools

    from spirelib.bench import train
    from spirelib.measure import calibrate
    from spirelib.model.config import ModelConfig

    toy = ModelConfig(vocab_size=64, num_layers=2, d_model=32, n_q_per_kv=1, n_kv=2, d_head=16, d_ff=64)
    monkeypatch.setitem(train.TARGETS, "paper", toy)
    monkeypatch.setattr(gpu_rounds, "_BUILT", {})
    monkeypatch.setattr(calibrate, "matmul_peak", functools.partial(calibrate.matmul_peak, sizes=(256,), seconds=0.01))
    monkeypatch.setattr(calibrate, "memory_bandwidth",
                        functools.partial(calibrate.memory_bandwidth, mbytes=8, seconds=0.01))


def test_roofline_row_times_compiled_greedy_rounds_at_64_by_2048_and_judges_the_ad_step(monkeypatch):
    from spirelib.bench import decode

    toy_paper_target(monkeypatch)
    calls, fraction = [], {"ad": 0.5, "spire": 0.3}

    def round_rows(target, factories, models, methods, cell, window, timing):
        calls.append((cell.batch, cell.context, *methods, timing.compiled, cell.temperature, target.compiled_decoding,
                      target.live_reads))
        return [{"mode": "compiled", "kind": f"{methods[0]} round", "batch": cell.batch, "context": cell.context,
                 "ms": 2.0,
                 "mbytes": 9.0, "useful_mbytes": 8.0, "fraction": fraction[methods[0]], "useful_fraction": 0.45,
                 "recorded": 0}]

    monkeypatch.setattr(decode, "round_rows", round_rows)
    found = gpu_rounds.roofline_check(SimpleNamespace(device="cpu", quick=False))
    # the AD step, SPIRe's round, then the AD step reading the live key blocks only (which decides the default)
    assert calls == [(64, 2048, "ad", True, 0.0, True, False), (64, 2048, "spire", True, 0.0, True, False),
                     (64, 2048, "ad", True, 0.0, True, True)]
    assert "compiled ad round at 64 x 2048 2.00 ms: 50% of the roofline of 9 MB read (45% useful" in found.text
    assert "compiled ad, live reads round at 64 x 2048" in found.text and "ad, live reads" in found.figures
    assert found.missed == ("AD step at 50% of its roofline",) and found.figures["spire"]["fraction"] == 0.3
    fraction["ad"] = 0.6
    assert gpu_rounds.roofline_check(SimpleNamespace(device="cpu", quick=False)).missed == ()
    calls.clear()
    monkeypatch.setitem(gpu_goals.BUDGETS_S, "roofline", -1)
    found = gpu_rounds.roofline_check(SimpleNamespace(device="cpu", quick=False))
    assert "not timed: ad, spire, ad, live reads" in found.text and calls == []
    assert found.missed == ("the AD step was not timed",)


def test_host_row_divides_each_rounds_wall_time_by_its_device_time(monkeypatch):
    """The host row at toy sizes (eager on the CPU, where the device's time is the clock's): wall
    and device ms per round of SPIRe and MagicDec, their ratio, nothing recorded; judged at the
    check's own shapes (a patched cell here), not at --quick's."""
    from spirelib.bench import decode_models

    toy_paper_target(monkeypatch)
    cell = gpu_rounds.round_cell
    monkeypatch.setattr(gpu_rounds, "round_cell", lambda args: ((2, 24), 3))  # toy cell, few rounds
    compiled = []
    monkeypatch.setattr(decode_models, "compile_all", lambda target, models, enabled: compiled.append(enabled))  # eager
    found = gpu_rounds.host_check(SimpleNamespace(device="cpu", quick=False))
    assert compiled == [True]
    for method in gpu_goals.HOST_METHODS:
        f = found.figures[method]
        assert f["wall_ms"] > 0 and f["busy_ms"] > 0 and f["recorded"] == 0
        assert f["ratio"] == pytest.approx(f["wall_ms"] / f["busy_ms"])
    assert found.judged and found.missed == tuple(gpu_goals.judge_host(found.figures))
    monkeypatch.setattr(gpu_rounds, "round_cell", cell)
    rounds = []
    monkeypatch.setattr(gpu_rounds, "host_overhead", lambda target, factories, method, B, L, n: rounds.append(
        (B, L, n)) or {"wall_ms": 1.0, "busy_ms": 0.8, "ratio": 1.25, "recorded": 0})
    found = gpu_rounds.host_check(SimpleNamespace(device="cpu", quick=False))
    assert rounds == [(64, 2048, roofline.round_count(20))] * 2  # the roofline row's generations: its kernels serve
    assert found.missed == ("spire round wall / GPU time 1.25", "magicdec round wall / GPU time 1.25")
    assert gpu_rounds.host_check(SimpleNamespace(device="cpu", quick=True)).judged is False
