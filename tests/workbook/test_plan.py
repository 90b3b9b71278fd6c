"""The run's plan (spirelib.workbook.plan), its work (`work`) and its probes (`probe`): work and predicted
seconds before any compute."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path

import pytest
from conftest import fixture_cache

from spirelib import cli
from spirelib.measure.tau import DecodingProtocol, TauProtocol
from spirelib.measure.wallclock import profiled_draft_shapes
from spirelib.model.config import Eagle3Config, ModelConfig, SpireConfig, vanilla_draft_config
from spirelib.throughput.acceptance import expected_rounds
from spirelib.throughput.hardware import HARDWARE
from spirelib.throughput.methods import KVBudget
from spirelib.throughput.perfmodel import PAPER_TAU, PAPER_TAU_CONTEXT
from spirelib.throughput.profiled import forward_work
from spirelib.training.series import Series
from spirelib.training.train import TrainConfig
from spirelib.workbook import injection, plan, report, work
from spirelib.workbook import probe as probing

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "params" / "smoke.yaml"
TINY = ModelConfig(vocab_size=64, num_layers=2, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8, d_ff=32)
SHAPES = profiled_draft_shapes({"vanilla": vanilla_draft_config(TINY), "spire": dataclasses.replace(TINY, num_layers=1)},
                               {"magicdec": KVBudget(1, 64), "guided": KVBudget.split(65), "spire": KVBudget(1, 64)},
                               SpireConfig(num_layers=1))
TRAINING = {"first_step_s": 5.0, "step_s": 0.5, "eval_window_s": 0.25, "save_s": 2.0}
DECODING = {"prefill_s": 3.0, "ad_step_s": 0.01, "round_s": {"vanilla": 0.1, "magicdec": 0.2, "spire": 0.05,
                                                             "guided": 0.3, "lookup": 0.02, "eagle3": 0.07},
            "begin_s": {"vanilla": 0.8, "magicdec": 0.15, "spire": 0.1, "guided": 0.04, "lookup": 0.01,
                        "eagle3": 0.2}}
PRICING = work.Pricing(TINY, SHAPES, DecodingProtocol(k=4, new_tokens=16))


def target_run(cfg: TrainConfig) -> work.TrainRun:
    """The tiny target trained alone under `cfg`."""
    return work.TrainRun(TINY, cfg, TINY, None, TINY.num_params())


def quiet(monkeypatch, speed: float = 1.0):
    """A machine whose quick calibration always reads the same (`speed` times a fixed rate), and whose
    probes' samples always agree: the plan's checks never fire."""
    monkeypatch.setattr(probing.calibrate, "quick",
                        lambda *a, **k: {"peak_flops": speed * 1e11, "bandwidth": speed * 1e10})
    monkeypatch.setattr(probing, "_noisy", lambda samples: False)


@pytest.fixture
def fake_probes(monkeypatch, tmp_path):
    """Probes that return fixed timings (no compute), and a fresh model cache."""
    monkeypatch.setenv("SPIRE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(probing.Probe, "training", lambda self, *a, **k: TRAINING)
    monkeypatch.setattr(probing.Probe, "decoding", lambda self, cfg, configs, options, methods, context, protocol: {
        **DECODING, "round_s": {m: DECODING["round_s"].get(m, 0.1) for m in methods},  # a card not listed: 0.1 s
        "begin_s": {m: DECODING["begin_s"].get(m, 0.1) for m in methods}})
    monkeypatch.setattr(probing.Probe, "evaluation", lambda self, *a, **k: {"eval_window_s": 0.25})


def test_a_training_run_costs_its_first_step_its_timed_steps_its_evaluations_and_its_saves():
    cfg = TrainConfig(batch_size=2, seq_len=16, steps=10, eval_every=4, eval_windows=3, checkpoint_every=5)
    item = work._train_item("02", "train", TRAINING, target_run(cfg), cached=False)
    # evaluations after steps 4, 8 and at the end (10); saves after step 5 and at the end
    assert item.seconds == pytest.approx(5.0 + 9 * 0.5 + 3 * 3 * 0.25 + 2 * 2.0)
    assert item.train_tokens == 10 * 2 * 16
    cached = work._train_item("02", "train", TRAINING, target_run(cfg), cached=True)
    assert cached.seconds == 0 and cached.cached and all(v == 0 for v in cached.gpu_seconds.values())
    warm = work._train_item("02", "train", TRAINING, target_run(cfg), False, warm=True)
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
    spire = work.TrainRun(TINY, cfg, draft, SpireConfig(num_layers=1, k=4), draft.num_params()).work()[2]
    alone = work.TrainRun(TINY, cfg, draft, None, draft.num_params()).work()[2]
    teacher = forward_work(TINY.shape(), TINY.vocab_size, 2, 16, 8)
    # 1 training step and 1 evaluation window of the draft; the teacher runs on both
    assert spire - alone == pytest.approx(teacher.flops * (1 + 1 / 2))


def test_decoding_costs_a_prefill_per_batch_and_each_methods_expected_rounds():
    methods = ["vanilla", "magicdec", "spire"]
    item = work._decode_item("04", "tau", DECODING, work.Decodes(tuple(methods), 4, 32, 3, contexts=10), PRICING)
    rounds = {m: expected_rounds(PAPER_TAU[PAPER_TAU_CONTEXT][m], 4, 16, 4) for m in methods}
    begins = sum(DECODING["begin_s"][m] for m in methods)  # each method's copy of the prefill and its draft's own
    assert item.seconds == pytest.approx(3 * (3.0 + begins + sum(rounds[m] * DECODING["round_s"][m] for m in methods)))
    with_ad = work._decode_item("09", "time", DECODING, work.Decodes(tuple(methods), 4, 32, 1, ad=True), PRICING)
    assert with_ad.seconds == pytest.approx(item.seconds / 3 + 16 * 0.01)
    assert item.contexts == 10 and with_ad.contexts == 4
    assert set(item.gpu_seconds) == set(HARDWARE) and all(v > 0 for v in item.gpu_seconds.values())


def test_a_model_is_trained_by_the_first_notebook_that_needs_it_and_costs_nothing_once_cached(fake_probes):
    series = Series.from_dict({})
    params = {"03_train_drafts": {}, "04_measure_tau": {"methods": ["vanilla", "spire"], "context_lengths": [16],
                                                        "n_contexts": 4, "decode_batch_size": 2}}
    made = plan.make_plan(["03_train_drafts", "04_measure_tau"], params, {})
    trained = [i.what for i in made.items if i.what.startswith("train")]
    assert [i.notebook for i in made.items if i.what.startswith("train")] == ["03_train_drafts"] * 4
    assert trained[0].startswith("train the target") and not any(i.cached for i in made.items)
    assert trained[-1].startswith("train the EAGLE-3 draft")
    assert made.seconds("04_measure_tau") == pytest.approx(work.NOTEBOOK_SECONDS + sum(
        i.seconds for i in made.items if i.notebook == "04_measure_tau" and i.what.startswith("tau")))
    series.trained_target(progress=False)  # the smoke target, trained into this test's cache
    again = plan.make_plan(["02_train_target"], {"02_train_target": {}}, {})
    target = next(i for i in again.items if i.what.startswith("train the target"))
    assert target.cached and target.seconds == 0


def test_probes_time_the_real_trainer_once_per_shape_and_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("SPIRE_CACHE_DIR", str(tmp_path))
    import torch

    quiet(monkeypatch)  # a machine shared with other tests: its checks are tested apart
    probe = probing.Probe(torch.device("cpu"))
    cfg = TrainConfig(batch_size=2, seq_len=16, steps=50, eval_windows=2)
    first = probe.training("lm", TINY, cfg)
    assert first["source"] == "probe" and first["figure"].startswith("train-lm-")
    assert {k for k in first if k in TRAINING} == set(TRAINING) and all(first[k] > 0 for k in TRAINING)
    spent = probe.seconds
    assert spent > 0 and probe.training("lm", TINY, cfg) == first and probe.seconds == spent
    longer = probe.training("lm", TINY, TrainConfig(batch_size=2, seq_len=32, steps=50, eval_windows=2))
    assert probe.seconds > spent and longer != first
    eagle3 = probe.training("eagle3", TINY, cfg, Eagle3Config(k=2))  # the EAGLE-3 recipe's own objective
    assert eagle3["figure"].startswith("train-eagle3-") and all(eagle3[k] > 0 for k in TRAINING)
    decoded = probe.decoding(TINY, {"spire": SpireConfig(num_layers=1, window=8), "eagle3": Eagle3Config(k=2)},
                             {"magicdec": {"budget": KVBudget(1, 8)}, "guided": {"budget": KVBudget(1, 4, 4)}},
                             ["vanilla", "magicdec", "spire", "guided", "lookup", "eagle3"], 16,
                             TauProtocol(k=2, new_tokens=8, temperature=1.0, batch_size=2))
    assert set(decoded["round_s"]) == set(decoded["begin_s"]) == {"vanilla", "magicdec", "spire", "guided", "lookup",
                                                                  "eagle3"}
    assert decoded["begin_s"]["vanilla"] > 0  # the vanilla draft's own prefill over the contexts
    assert decoded["prefill_s"] > 0


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


#: The params files that run on the embedded corpus (the others name a checkpoint or a corpus to fetch first).
EMBEDDED = ("smoke", "default", "long-context", "ablations-full")


@pytest.mark.parametrize("name", EMBEDDED)
def test_every_params_file_on_the_embedded_corpus_is_planned(name, fake_probes, tmp_path):
    """The plan of each such params file builds its models' work as they are configured (the
    default series' EAGLE-3 draft with its reduced vocabulary, sized on the meta device)."""
    params = SMOKE.parent / f"{name}.yaml"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = cli.main(["run", "--params", str(params), "--plan", "--out", str(tmp_path / "out")])
    assert rc == 0 and "the run" in printed.getvalue()


def test_each_report_and_the_index_state_the_measured_time_against_the_plan(fixture_run):
    _, out, printed = fixture_run
    run = json.loads((out / "run.json").read_text())
    # a numpy notebook's fixed cost: the fixture run's cache is its own, nothing learned before it
    planned = run["plan"]["notebooks"]["01_record"]["seconds"]
    assert planned == work.NOTEBOOK_SECONDS
    assert {i["source"] for i in run["plan"]["items"] if i["notebook"] == "01_record"} == {"assumed"}
    assert run["notebooks"]["01_record"]["planned_s"] == round(planned, 2)
    assert run["notebooks"]["01_record"]["params_file"].endswith("fixtures/params.yaml")  # for the index's sources
    assert "plan: 4 notebooks" in printed and f"(plan {planned:.0f} s)" in printed
    assert f"the run's plan predicted {planned:.0f} s" in (out / "01_record.html").read_text()
    # the run taught the next plan: 01's measured seconds, kept under its identity on this machine
    learned = json.loads((fixture_cache(out) / "plan" / run["plan"]["notebook_keys"]["01_record"]).read_text())
    assert learned["run"] == str(out) and learned["seconds"] == run["notebooks"]["01_record"]["seconds"]
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
    assert tau == pytest.approx(2 * (prefill_and_loss_seconds(2, 16, 64) + DECODING["begin_s"]["vanilla"]
                                     + rounds * DECODING["round_s"]["vanilla"]))
    assert tau > next(i for i in paper.items if i.what.startswith("tau")).seconds
    assert "last run measured (04): vanilla 1.2" in low.render() and "range of tau" in paper.render()
    # where the last run's taus come from: its 04 record, averaged over L, for the same series only
    results.write_json(tmp_path / "results.json", {"04_measure_tau": {"tau": {"vanilla": {
        "16": {"mean": 1.1}, "32": {"mean": 1.3}}}}})
    assert plan.measured_taus(results.read_json(tmp_path / "results.json")) == {"vanilla": pytest.approx(1.2)}
    selected = [p for p in injection.discover(ROOT / "notebooks") if p.stem == "04_measure_tau"]
    injected = {"04_measure_tau": params["04_measure_tau"]}
    for series, expected in (({}, "last run measured"), ({"seed": 3}, "range of tau")):
        results.write_json(tmp_path / "run.json", {"params": {"series": {}}})
        made = runner.work_plan({"series": series}, selected, injected, tmp_path)
        assert expected in made.render()


# ---------------------------------------------------------------------------- a plan that checks and learns

FIGURES = {"first_step_s": 5.0, "step_s": 0.5, "eval_window_s": 0.25, "save_s": 2.0}


class Machine:
    """A machine whose quick calibration reads `speed` times a fixed rate (0.5: a competing process
    takes half of it), and a probe that counts its takes, each returning `FIGURES` scaled by `slow`
    and its timed samples."""

    def __init__(self, monkeypatch):
        self.speed, self.slow, self.samples, self.takes = 1.0, 1.0, [0.5, 0.5, 0.5], 0
        monkeypatch.setattr(probing.calibrate, "quick", lambda *a, **k: {"peak_flops": self.speed * 1e11,
                                                                      "bandwidth": self.speed * 1e10})

    def measure(self):
        self.takes += 1
        return {k: v * self.slow for k, v in FIGURES.items()}, [self.samples]


def _probe(tmp_path, monkeypatch, **kw):
    import torch

    monkeypatch.setenv("SPIRE_CACHE_DIR", str(tmp_path / "cache"))
    return probing.Probe(torch.device("cpu"), **kw)


def test_a_probe_on_a_busy_machine_is_retaken_and_never_cached(tmp_path, monkeypatch):
    """The machine's best calibration is known; then a competing process halves its matmul rate and
    bandwidth: every take of the probe is refused, the plan uses its fastest take and says the
    machine is busy, and nothing is cached, so the next plan on the idle machine measures again."""
    machine = Machine(monkeypatch)
    key = {"shape": 1}
    _probe(tmp_path, monkeypatch).speed.measure()  # the idle machine's best
    machine.speed = 0.5
    busy = _probe(tmp_path, monkeypatch)
    got = busy._cached("train-lm", key, machine.measure, "LM training")
    assert machine.takes == probing.PROBE_ATTEMPTS and got["step_s"] == 0.5
    assert not busy.path("train-lm", key).exists()
    assert busy.busy == ["LM training: matmul rate 50% of its best"]
    made = plan.Plan([], [], busy.machine, busy.seconds, [], busy.busy)
    assert "the machine is busy: 1 probes stayed noisy or slow" in made.render()
    machine.speed = 1.0
    idle = _probe(tmp_path, monkeypatch)
    idle._cached("train-lm", key, machine.measure, "LM training")
    assert machine.takes == probing.PROBE_ATTEMPTS + 1 and idle.path("train-lm", key).exists() and not idle.busy


def test_a_bandwidth_drop_alone_is_not_a_busy_machine(tmp_path, monkeypatch):
    """After a large model's probe the copy bandwidth of an idle machine reads well below its best
    (44-77% at SmolLM2-135M shapes) while its matmul rate holds: the probe is kept and cached at its
    first take, and a later plan whose bandwidth is back at its best does not call it contradicted."""
    machine = Machine(monkeypatch)
    key = {"shape": 135}
    _probe(tmp_path, monkeypatch).speed.measure()  # the idle machine's best
    monkeypatch.setattr(probing.calibrate, "quick", lambda *a, **k: {"peak_flops": 1e11, "bandwidth": 0.45e10})
    after = _probe(tmp_path, monkeypatch)
    after._cached("decode", key, machine.measure, "decoding at 135M")
    assert machine.takes == 1 and not after.busy and after.path("decode", key).exists()
    monkeypatch.setattr(probing.calibrate, "quick", lambda *a, **k: {"peak_flops": 1e11, "bandwidth": 1e10})
    later = _probe(tmp_path, monkeypatch)
    assert later._cached("decode", key, machine.measure, "decoding at 135M")["source"] == "probe"
    assert machine.takes == 1 and not later.replaced


def test_a_probe_slower_than_its_own_repeats_is_retaken_and_its_fastest_take_kept(tmp_path, monkeypatch):
    """On a machine that calibrates at its best, a take whose timed samples disagree (the median twice
    the fastest: other work came and went) is retaken; the cached figure is the faster of the takes."""
    machine = Machine(monkeypatch)
    probe = _probe(tmp_path, monkeypatch)
    machine.samples, machine.slow = [0.5, 1.0, 1.0], 2.0
    first = probe._cached("decode", {"cell": 1}, machine.measure, "decoding")
    assert machine.takes == probing.PROBE_ATTEMPTS and probe.busy and "samples at 2.00x its fastest" in probe.busy[0]
    assert first["step_s"] == 1.0 and not probe.path("decode", {"cell": 1}).exists()

    takes = iter([([0.5, 1.0, 1.0], 2.0), ([0.5, 0.5, 0.6], 1.0)])

    def settles():
        machine.samples, machine.slow = next(takes)
        return machine.measure()

    again = _probe(tmp_path, monkeypatch)
    got = again._cached("decode", {"cell": 1}, settles, "decoding")
    assert not again.busy and got["step_s"] == 0.5 and got["first_step_s"] == 10.0  # the first take's compile
    assert json.loads(again.path("decode", {"cell": 1}).read_text())["result"]["step_s"] == 0.5


def test_a_cached_figure_made_on_a_slower_machine_is_contradicted_and_measured_again(tmp_path, monkeypatch):
    """A figure cached while the machine ran at half its speed (its calibration kept with it) is
    replaced once a calibration says the machine is more than 30% faster; one made within 30% of
    today's speed is kept; `recalibrate` measures it again regardless."""
    machine = Machine(monkeypatch)
    machine.speed, machine.slow = 0.5, 2.0
    _probe(tmp_path, monkeypatch)._cached("train-lm", {"m": 1}, machine.measure, "LM training")
    assert machine.takes == 1  # the first calibration ever is the machine's best: nothing to contradict it yet
    machine.speed, machine.slow = 0.6, 1.0
    kept = _probe(tmp_path, monkeypatch)
    assert kept._cached("train-lm", {"m": 1}, machine.measure, "LM training")["step_s"] == 1.0
    assert machine.takes == 1 and not kept.replaced
    machine.speed = 1.0
    fresh = _probe(tmp_path, monkeypatch)
    assert fresh._cached("train-lm", {"m": 1}, machine.measure, "LM training")["step_s"] == 0.5
    assert machine.takes == 2 and fresh.replaced and "at 50% of its speed now" in fresh.replaced[0]
    forced = _probe(tmp_path, monkeypatch, recalibrate=True)
    forced._cached("train-lm", {"m": 1}, machine.measure, "LM training")
    assert machine.takes == 3
    made = plan.Plan([], [], forced.machine, 1.0, [], recalibrated=True)
    assert "recalibrated in 1 s (--recalibrate)" in made.render()


def test_spire_run_recalibrate_reaches_the_plan(monkeypatch, tmp_path):
    asked = {}

    def make_plan(selected, parameters, series, taus=None, recalibrate=False, spreads=None):
        asked["recalibrate"] = recalibrate
        return plan.Plan([], list(selected), "m", 0.0, [])

    monkeypatch.setattr(plan, "make_plan", make_plan)
    with contextlib.redirect_stdout(io.StringIO()):
        for flags, expected in (([], False), (["--recalibrate"], True)):
            assert cli.main(["run", "--params", str(SMOKE), "--plan", "--out", str(tmp_path), *flags]) == 0
            assert asked["recalibrate"] is expected


def test_a_runs_measured_times_replace_a_contradicting_probe_and_the_next_plan_says_so(tmp_path, monkeypatch):
    """After a run, the target's checkpoint says a step took 2.0 s where the cached probe said 0.5 s:
    the run's figure replaces the probe's (source "run"), and the next probe reads it without
    measuring. 01 took 20 s where the plan assumed 8 s: the next plan of 01 with the same
    parameters costs 20 s, from a run; with other parameters it is assumed again."""
    machine = Machine(monkeypatch)
    probe = _probe(tmp_path, monkeypatch)
    cfg = TrainConfig(batch_size=2, seq_len=16, steps=10)
    monkeypatch.setattr(probing.Probe, "_measure", lambda self, measure, what: (dict(FIGURES), self.speed.now()))
    figure = probe.training("lm", TINY, cfg)
    checkpoint = tmp_path / "target"  # the run folder, as the trainer leaves it: its checkpoint's meta.json
    summary = {"steps": 10, "tokens": 320, "tokens_per_s": 16.0, "run_tokens_per_s": 10.0, "first_step_s": 5.5}
    (checkpoint / "checkpoint").mkdir(parents=True)
    (checkpoint / "checkpoint" / "meta.json").write_text(json.dumps(
        {"format": 2, "finished": True, "files": {}, "summary": summary}))
    trained = work._train_item("02_train_target", "train the target", figure, target_run(cfg), cached=False,
                               checkpoint=checkpoint)
    assert trained.source == "probe" and trained.learn["figure"] == figure["figure"]
    params = {"01_performance_model": {}, "02_train_target": {}}
    made = plan.make_plan(["01_performance_model"], params, {})
    made.items.append(trained)
    made.notebooks.append("02_train_target")
    made.notebook_keys["02_train_target"] = plan._notebook_figure(made.machine, "02_train_target", {}).name
    made.calibration = probe.speed.now()
    record = {"notebooks": {"01_performance_model": {"status": "ok", "seconds": 20.0},
                            "02_train_target": {"status": "ok", "seconds": 40.0}}}
    lines = plan.learn(made, record, str(tmp_path / "out"))
    assert "train the target: step 2.0 s measured, 0.5 s by the probe: replaced" in lines
    assert any(line.startswith("01_performance_model: 20 s measured besides training, 8.0 s planned") for line in lines)
    monkeypatch.setattr(probing.Probe, "_measure", lambda self, measure, what: pytest.fail("measured again"))
    again = _probe(tmp_path, monkeypatch).training("lm", TINY, cfg)
    assert again["source"] == "run" and again["step_s"] == 2.0 and again["first_step_s"] == 5.5
    assert again["eval_window_s"] == FIGURES["eval_window_s"]  # what the run did not measure stays the probe's
    next_plan = plan.make_plan(["01_performance_model"], params, {})
    assert next_plan.seconds("01_performance_model") == pytest.approx(20.0)
    assert {i.source for i in next_plan.items} == {"run"} and "1 from a run on this machine" in next_plan.render()
    other = plan.make_plan(["01_performance_model"], {"01_performance_model": {"hoi": 300}}, {})
    assert other.seconds() == work.NOTEBOOK_SECONDS and {i.source for i in other.items} == {"assumed"}
    # 02's 40 s less the target's training (320 tokens at 10 tokens/s of its whole run): 8 s besides training
    kept = json.loads((plan.cache_dir() / "plan" / made.notebook_keys["02_train_target"]).read_text())
    assert kept["seconds"] == pytest.approx(8.0) and machine.takes == 0


def prefill_and_loss_seconds(B: int, L: int, G: int) -> float:
    """04's per-batch seconds besides the rounds: the shared prefill, then the target's loss on the
    continuation read from its cache (G more positions), priced at the prefill's seconds per FLOP."""
    cfg = Series().target
    pre = forward_work(cfg.shape(), cfg.vocab_size, B, L, L // 2, logits=False)
    read = forward_work(cfg.shape(), cfg.vocab_size, B, G, L + G // 2)
    assert read.flops > pre.flops / 10  # a term the test would see go missing
    return DECODING["prefill_s"] * (1 + read.flops / pre.flops)


def test_before_any_tau_is_measured_the_plan_prices_decoding_from_the_papers_tau_down_to_1(fake_probes):
    """04 and 09 as ranges: the paper's taus at one end, tau 1 (G rounds a batch) at the other; 09's
    cells, priced at their second look, fit fewer runs into cell_seconds at tau 1, so its range is narrow. With measured taus the
    figure is one number."""
    params = {"04_measure_tau": {"methods": ["vanilla", "spire"], "context_lengths": [16], "n_contexts": 4,
                                 "decode_batch_size": 2},
              "09_measured_vs_modeled": {"timing_methods": ["spire"], "timing_batches": [1], "timing_contexts": [16],
                                         "held_out": [], "repeats": 1, "max_repeats": 50, "cell_seconds": 20.0,
                                         "ci": 0.05}}
    made = plan.make_plan(["04_measure_tau", "09_measured_vs_modeled"], params, {})
    tau = next(i for i in made.items if i.what.startswith("tau"))
    G = 64  # the smoke series' new_tokens
    begins = DECODING["begin_s"]["vanilla"] + DECODING["begin_s"]["spire"]
    assert tau.seconds_at_tau_1 == pytest.approx(2 * (prefill_and_loss_seconds(2, 16, G) + begins + G * (0.1 + 0.05)))
    assert tau.seconds < tau.seconds_at_tau_1
    timed = next(i for i in made.items if i.what.startswith("time AD"))
    one = DECODING["prefill_s"] + DECODING["begin_s"]["spire"] + G * DECODING["ad_step_s"]
    low, high = one + expected_rounds(PAPER_TAU[PAPER_TAU_CONTEXT]["spire"], 4, G, 1) * 0.05, one + G * 0.05
    runs, runs_high = int(20.0 // low), int(20.0 // high)  # a warm-up, then the runs that fit in the rest
    assert runs_high < runs and f"{runs} ({runs_high} at tau 1) runs" in timed.what
    assert timed.seconds == pytest.approx(runs * low) and timed.seconds_at_tau_1 == pytest.approx(runs_high * high)
    span = made.span("04_measure_tau")
    assert span == plan.time_range(made.seconds("04_measure_tau"), made.seconds_at_tau_1("04_measure_tau"))
    assert " - " in span and span in made.render() and plan.time_range(150.0, 120.0) == "2.0 - 2.5 min"
    assert plan.time_range(30.0, 150.0) == "30 s - 2.5 min" and plan.time_range(30.0, 31.0) == "30 s"
    nine = made.to_dict()["notebooks"]["09_measured_vs_modeled"]
    assert nine["seconds_at_tau_1"] == pytest.approx(work.NOTEBOOK_SECONDS + work.CALIBRATION_SECONDS
                                                     + runs_high * high)
    measured = plan.make_plan(["04_measure_tau"], params, {}, taus={"vanilla": 1.5, "spire": 2.0})
    assert all(i.seconds_at_tau_1 is None for i in measured.items) and " - " not in measured.span("04_measure_tau")


def test_the_drafts_past_the_paper_are_priced_at_their_relatives_tau_and_lookup_at_1_drafting_for_free():
    """No paper tau exists for the drafts past the paper, so until a run measures theirs the plan
    prices each at the paper's tau of its card's relative (the guided draft at MagicDec's, EAGLE-3
    at the vanilla draft's) and prompt lookup at tau 1; a range reaches tau 1 for all. Each batch
    pays each method's begin. Prompt lookup's rounds carry no draft pass: its work is the verification."""
    paper = PAPER_TAU[PAPER_TAU_CONTEXT]
    assert work.prior_tau("guided") == paper["magicdec"] and work.prior_tau("eagle3") == paper["vanilla"]
    assert work.prior_tau("spire") == paper["spire"] and work.prior_tau("lookup") is None
    begin = DECODING["begin_s"]
    for method, tau in (("guided", paper["magicdec"]), ("lookup", 1.0)):
        item = work._decode_item("04", "tau", DECODING, work.Decodes((method,), 4, 32, 1), PRICING)
        per_round = DECODING["round_s"][method]
        assert item.seconds == pytest.approx(3.0 + begin[method] + expected_rounds(tau, 4, 16, 4) * per_round)
        ranged = work._decode_item("04", "tau", DECODING, work.Decodes((method,), 4, 32, 1),
                                   dataclasses.replace(PRICING, ranged=True))
        assert ranged.seconds == pytest.approx(item.seconds)
        assert ranged.seconds_at_tau_1 == pytest.approx(3.0 + begin[method] + expected_rounds(1.0, 4, 16, 4) * per_round)
    lookup = work._decode_item("04", "tau", DECODING, work.Decodes(("lookup",), 4, 32, 1), PRICING)
    magicdec = work._decode_item("04", "tau", DECODING, work.Decodes(("magicdec",), 4, 32, 1),
                                 dataclasses.replace(PRICING, taus={"magicdec": 1.0}))
    rounds = expected_rounds(1.0, 4, 16, 4)
    assert lookup.flops == pytest.approx(magicdec.flops - rounds * 4 * forward_work(
        TINY.shape(), TINY.vocab_size, 4, 1, min(32 + 8, 66)).flops)


def test_before_any_run_prompt_lookup_is_expected_to_stop_at_its_floor_and_the_others_to_run_to_the_cap(fake_probes):
    """Priced at tau 1, prompt lookup has no spread (every round one token): 04's rule stops it at
    its floor (the default run: 64 of 192 at every L). A draft priced at a paper tau has the
    paper's spread, which 192 contexts do not narrow to +-0.05 (the default run: 128-192)."""
    p = {"context_lengths": [16], "n_contexts": 192, "decode_batch_size": 64, "tau_half_width": 0.05,
         "tau_floor": 64}

    def contexts(methods):
        made = plan.make_plan(["04_measure_tau"], {"04_measure_tau": {**p, "methods": methods}}, {})
        return next(i for i in made.items if i.what.startswith("tau of")).contexts

    assert contexts(["lookup"]) == 64 and contexts(["guided"]) == contexts(["spire"]) == 192


def test_04s_plan_marks_lengths_past_the_training_windows_and_prices_the_kv_budget_sweep(fake_probes):
    params = {"04_measure_tau": {"methods": ["magicdec", "guided", "lookup"], "context_lengths": [16, 256],
                                 "n_contexts": 4, "decode_batch_size": 2, "kv_budgets": [8, 16, 32],
                                 "kv_budget_context": 0}}
    made = plan.make_plan(["04_measure_tau"], params, {})
    taus = [i for i in made.items if i.what.startswith("tau")]
    assert [("past the" in i.what) for i in taus] == [False, True]  # the smoke target trains on 256 tokens: 256 + 64
    assert all("the target's loss" in i.what for i in taus)
    sweep = next(i for i in made.items if i.what.startswith("KV-budget sweep"))
    assert "3 budgets, L = 16" in sweep.what  # the longest L within the training windows
    one = work.Models(Series(), probing.Probe(None), {}, True).decode(
        "04_measure_tau", "", work.Decodes(("magicdec", "guided"), 2, 16, 2, contexts=4))
    assert sweep.seconds == pytest.approx(3 * one.seconds) and sweep.flops == pytest.approx(3 * one.flops)
    assert sweep.seconds_at_tau_1 == pytest.approx(3 * one.seconds_at_tau_1)


def test_04s_plan_prices_its_stopping_rule_at_each_methods_expected_contexts(fake_probes):
    """Under 04's stopping rule a method resolved early (prompt lookup, nearly constant) decodes only
    its floor of contexts, one still unresolved at the cap (SPIRe, spread 0.9) decodes them all: the
    prefills run for the longest, each method's rounds for its own (`stopping.expected_contexts`)."""
    p = {"methods": ["lookup", "spire"], "context_lengths": [16], "n_contexts": 256, "decode_batch_size": 32,
         "tau_floor": 64}
    taus, spreads = {"lookup": 1.03, "spire": 3.4}, {"lookup": 0.01, "spire": 0.9}

    def tau_item(half_width):
        made = plan.make_plan(["04_measure_tau"], {"04_measure_tau": {**p, "tau_half_width": half_width}}, {},
                              taus=taus, spreads=spreads)
        return next(i for i in made.items if i.what.startswith("tau of")), made
    full, _ = tau_item(0.0)
    stopped, made = tau_item(0.05)
    lookup_rounds = expected_rounds(1.03, 4, 64, 32) * DECODING["round_s"]["lookup"]
    assert stopped.contexts == full.contexts == 256
    lookup_batch = DECODING["begin_s"]["lookup"] + lookup_rounds
    assert full.seconds - stopped.seconds == pytest.approx(8 * lookup_batch * (1 - 64 / 256))
    assert any("half-width reaches 0.05" in a for a in made.assumptions)
