"""The run's plan (spirelib.workbook.plan): work and predicted seconds before any compute."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from spirelib import cli
from spirelib.engine.spire import SpireConfig
from spirelib.engine.transformer import ModelConfig
from spirelib.modeling.acceptance import expected_rounds
from spirelib.modeling.hardware import HARDWARE
from spirelib.modeling.perfmodel import PAPER_TAU, PAPER_TAU_CONTEXT
from spirelib.training.series import Series
from spirelib.training.train import TrainConfig
from spirelib.workbook import plan, report

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "params" / "smoke.yaml"
TINY = ModelConfig(vocab_size=64, num_layers=2, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8, d_ff=32)
TRAINING = {"first_step_s": 5.0, "step_s": 0.5, "eval_window_s": 0.25, "save_s": 2.0}
DECODING = {"prefill_s": 3.0, "ad_step_s": 0.01, "round_s": {"vanilla": 0.1, "magicdec": 0.2, "spire": 0.05}}


@pytest.fixture
def fake_probes(monkeypatch, tmp_path):
    """Probes that return fixed timings (no compute), and a fresh model cache."""
    monkeypatch.setenv("SPIRE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(plan.Probe, "training", lambda self, *a, **k: TRAINING)
    monkeypatch.setattr(plan.Probe, "decoding", lambda self, *a, **k: DECODING)
    monkeypatch.setattr(plan.Probe, "evaluation", lambda self, *a, **k: {"eval_window_s": 0.25})


def test_a_training_run_costs_its_first_step_its_timed_steps_its_evaluations_and_its_saves():
    cfg = TrainConfig(batch_size=2, seq_len=16, steps=10, eval_every=4, eval_windows=3, checkpoint_every=5)
    item = plan._train_item("02", "train", TRAINING, TINY, cfg, TINY, None, TINY.num_params(), cached=False)
    # evaluations after steps 4, 8 and at the end (10); saves after step 5 and at the end
    assert item.seconds == pytest.approx(5.0 + 9 * 0.5 + 3 * 3 * 0.25 + 2 * 2.0)
    assert item.train_tokens == 10 * 2 * 16
    cached = plan._train_item("02", "train", TRAINING, TINY, cfg, TINY, None, TINY.num_params(), cached=True)
    assert cached.seconds == 0 and cached.cached and all(v == 0 for v in cached.gpu_seconds.values())
    warm = plan._train_item("02", "train", TRAINING, TINY, cfg, TINY, None, TINY.num_params(), False, warm=True)
    assert warm.seconds == pytest.approx(item.seconds - 5.0 + 0.5)  # a first step like the others


def test_ablation_runs_start_warm_where_an_earlier_run_of_the_notebook_compiled_the_same_graphs(fake_probes):
    """05 trains every variant at every seed in one kernel: a run's first step compiles only where no
    earlier run there had the same shapes, target layers read and loss (the spire variant, then
    distill_only, hard_target, no_feedback_no_target_acts); the others, and every later seed, start warm."""
    variants = ["spire", "random_init", "distill_only", "hard_target", "no_feedback", "no_feedback_no_target_acts"]
    params = {"05_ablations": {"ablations": variants, "ablation_seeds": [0, 1],
                               "ablation_training": {"batch_size": 2, "seq_len": 16, "steps": 4, "eval_every": 0,
                                                     "eval_windows": 1, "compile": True},
                               "ablation_context_length": 16, "n_contexts": 2, "decode_batch_size": 2}}
    made = plan.make_plan(["05_ablations"], params, {})
    runs = {i.what: i.seconds for i in made.items if " variant, seed " in i.what}
    cold = {f"train the {v} variant, seed 0" for v in ("spire", "distill_only", "hard_target",
                                                         "no_feedback_no_target_acts")}
    assert len(runs) == 12 and len({runs[w] for w in cold}) == 1
    for what, seconds in runs.items():
        assert seconds == pytest.approx(runs["train the spire variant, seed 0"] - (0 if what in cold else 5.0 - 0.5)), what


def test_a_spire_drafts_training_flops_count_the_teacher_once_and_every_position_once_not_k_times():
    cfg = TrainConfig(batch_size=2, seq_len=16, steps=1, eval_every=0, eval_windows=1)
    draft = ModelConfig(**{**TINY.to_dict(), "num_layers": 1})
    spire = plan.training_work(TINY, cfg, draft, SpireConfig(num_layers=1, k=4), draft.num_params())[2]
    alone = plan.training_work(TINY, cfg, draft, None, draft.num_params())[2]
    teacher = plan.forward_work(TINY.shape(), TINY.vocab_size, 2, 16, 8)
    # 1 training step and 1 evaluation window of the draft; the teacher runs on both
    assert spire - alone == pytest.approx(teacher.flops * (1 + 1 / 2))


def test_decoding_costs_a_prefill_per_batch_and_each_methods_expected_rounds():
    methods = ["vanilla", "magicdec", "spire"]
    item = plan._decode_item("04", "tau", DECODING, TINY, SpireConfig(num_layers=1), methods, 3, 4, 32, 16, 4,
                             contexts=10)
    rounds = {m: expected_rounds(PAPER_TAU[PAPER_TAU_CONTEXT][m], 4, 16, 4) for m in methods}
    assert item.seconds == pytest.approx(3 * (3.0 + sum(rounds[m] * DECODING["round_s"][m] for m in methods)))
    with_ad = plan._decode_item("09", "time", DECODING, TINY, SpireConfig(num_layers=1), methods, 1, 4, 32, 16, 4,
                                ad=True)
    assert with_ad.seconds == pytest.approx(item.seconds / 3 + 16 * 0.01)
    assert item.contexts == 10 and with_ad.contexts == 4
    assert set(item.gpu_seconds) == set(HARDWARE) and all(v > 0 for v in item.gpu_seconds.values())


def test_a_model_is_trained_by_the_first_notebook_that_needs_it_and_costs_nothing_once_cached(fake_probes):
    series = Series.from_dict({})
    params = {"03_train_drafts": {}, "04_measure_tau": {"methods": ["vanilla", "spire"], "context_lengths": [16],
                                                        "n_contexts": 4, "decode_batch_size": 2}}
    made = plan.make_plan(["03_train_drafts", "04_measure_tau"], params, {})
    trained = [i.what for i in made.items if i.what.startswith("train")]
    assert [i.notebook for i in made.items if i.what.startswith("train")] == ["03_train_drafts"] * 3
    assert trained[0].startswith("train the target") and not any(i.cached for i in made.items)
    assert made.seconds("04_measure_tau") == pytest.approx(plan.NOTEBOOK_SECONDS + sum(
        i.seconds for i in made.items if i.notebook == "04_measure_tau" and i.what.startswith("tau")))
    series.trained_target(progress=False)  # the smoke target, trained into this test's cache
    again = plan.make_plan(["02_train_target"], {"02_train_target": {}}, {})
    target = next(i for i in again.items if i.what.startswith("train the target"))
    assert target.cached and target.seconds == 0


def test_probes_time_the_real_trainer_once_per_shape_and_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("SPIRE_CACHE_DIR", str(tmp_path))
    import torch

    probe = plan.Probe(torch.device("cpu"))
    cfg = TrainConfig(batch_size=2, seq_len=16, steps=50, eval_windows=2)
    first = probe.training("lm", TINY, cfg)
    assert set(first) == set(TRAINING) and all(v > 0 for v in first.values())
    spent = probe.seconds
    assert spent > 0 and probe.training("lm", TINY, cfg) == first and probe.seconds == spent
    longer = probe.training("lm", TINY, TrainConfig(batch_size=2, seq_len=32, steps=50, eval_windows=2))
    assert probe.seconds > spent and longer != first
    decoded = probe.decoding(TINY, SpireConfig(num_layers=1, window=8), {"sink": 1, "window": 8},
                             ["vanilla", "magicdec", "spire"], 2, 16, 8, 2, 1.0)
    assert set(decoded["round_s"]) == {"vanilla", "magicdec", "spire"} and decoded["prefill_s"] > 0


def test_run_plan_prints_every_notebooks_work_and_gpu_times_and_runs_nothing(fake_probes, tmp_path):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = cli.main(["run", "--params", str(SMOKE), "--plan", "--out", str(tmp_path / "out")])
    text = printed.getvalue()
    assert rc == 0 and not (tmp_path / "out").exists()
    for stem in ("01_performance_model", "05_ablations", "09_measured_vs_modeled"):
        assert stem in text
    assert "train the SPIRe draft" in text and "tau of" in text and "the run" in text
    assert all(device in text for device in HARDWARE) and "modeled, not measured" in text


def test_each_report_and_the_index_state_the_measured_time_against_the_plan(fixture_run):
    _, out, printed = fixture_run
    run = json.loads((out / "run.json").read_text())
    assert run["plan"]["notebooks"]["01_record"]["seconds"] == plan.NOTEBOOK_SECONDS
    assert run["notebooks"]["01_record"]["planned_s"] == plan.NOTEBOOK_SECONDS
    assert run["notebooks"]["01_record"]["params_file"].endswith("fixtures/params.yaml")  # for the index's sources
    assert "plan: 4 notebooks" in printed and "(plan 8 s)" in printed
    assert "the run's plan predicted 8 s" in (out / "01_record.html").read_text()
    assert "<th>plan</th>" in (out / "index.html").read_text()
    assert report.timing_note(12.0, None, None).endswith("(no plan was made: a dry run).")
    assert "1.50x the plan" in report.timing_note(12.0, 8.0, "cpu")


def test_a_replan_decodes_at_the_taus_the_last_run_of_the_same_series_measured(fake_probes, tmp_path):
    from spirelib.workbook import results, runner

    params = {"04_measure_tau": {"methods": ["vanilla"], "context_lengths": [16], "n_contexts": 4,
                                 "decode_batch_size": 2}}
    paper = plan.make_plan(["04_measure_tau"], params, {})
    low = plan.make_plan(["04_measure_tau"], params, {}, taus={"vanilla": 1.2})
    tau = next(i for i in low.items if i.what.startswith("tau")).seconds
    rounds = expected_rounds(1.2, 4, 64, 2)  # the smoke series: k = 4, G = 64
    assert tau == pytest.approx(2 * (DECODING["prefill_s"] + rounds * DECODING["round_s"]["vanilla"]))
    assert tau > next(i for i in paper.items if i.what.startswith("tau")).seconds
    assert "last run measured (04): vanilla 1.2" in low.render() and "the paper's taus" in paper.render()
    # where the last run's taus come from: its 04 record, averaged over L, for the same series only
    results.write_json(tmp_path / "results.json", {"04_measure_tau": {"tau": {"vanilla": {
        "16": {"mean": 1.1}, "32": {"mean": 1.3}}}}})
    assert plan.measured_taus(results.read_json(tmp_path / "results.json")) == {"vanilla": pytest.approx(1.2)}
    selected = [p for p in runner.discover(ROOT / "notebooks") if p.stem == "04_measure_tau"]
    injected = {"04_measure_tau": params["04_measure_tau"]}
    for series, expected in (({}, "last run measured"), ({"seed": 3}, "the paper's taus")):
        results.write_json(tmp_path / "run.json", {"params": {"series": {}}})
        made = runner.work_plan({"series": series}, selected, injected, tmp_path)
        assert expected in made.render()
