"""The trainer: schedule, budget, config validation, exact resume, reuse, refusal, divergence."""

import math

import numpy as np
import pytest
import torch

from spirelib.decoding.speculative import autoregressive_generate
from spirelib.model.config import ModelConfig
from spirelib.model.transformer import Transformer
from spirelib.training.checkpoint import CheckpointError, config_hash, read_meta
from spirelib.training.config import TrainConfig
from spirelib.training.corpus import FlatDocs
from spirelib.training.metrics import read_metrics
from spirelib.training.objectives import lm_objective
from spirelib.training.train import Session, TrainingDiverged, TrainingRun, Validation, train

V = 32
CFG = ModelConfig(vocab_size=V, num_layers=2, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=48)


def pattern_docs(n_tokens=4000, seed=0):
    """A learnable stream: mostly t -> (3t + 1) mod V, with random restarts."""
    rng = np.random.default_rng(seed)
    t = np.empty(n_tokens, np.int64)
    t[0] = 0
    for i in range(1, n_tokens):
        t[i] = rng.integers(V) if rng.random() < 0.1 else (3 * t[i - 1] + 1) % V
    return FlatDocs(t, np.array([0]), np.array([n_tokens]))


DOCS, VAL = pattern_docs(), pattern_docs(1000, seed=1)


def run(tmp_path, cfg, name="run", objective=lm_objective, stop_at=None):
    torch.manual_seed(cfg.seed)
    model = Transformer(CFG)
    result = train(model, objective, DOCS, cfg, run=TrainingRun(tmp_path / name, {"model": CFG.to_dict()}),
                   validation=Validation(VAL), session=Session("cpu", progress=False, stop_at=stop_at))
    return result


def weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


SMALL = TrainConfig(batch_size=4, seq_len=16, steps=12, lr=1e-2, warmup_fraction=0.25, eval_every=4,
                    eval_windows=8, checkpoint_every=4, log_every=2)


def test_schedule_warms_up_linearly_then_decays_by_cosine_to_a_tenth():
    cfg = TrainConfig(steps=100, lr=1.0, warmup_fraction=0.1)
    lrs = [cfg.lr_at(s, 100) for s in range(100)]
    assert lrs[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert lrs[10] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[55] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 45 / 89)))


def test_budget_as_a_multiple_of_parameters():
    cfg = TrainConfig(batch_size=4, seq_len=100, tokens_per_param=20)
    assert cfg.total_steps(1000) == 50  # 20 x 1000 tokens / 400 per step
    with pytest.raises(ValueError, match="exactly one budget"):
        TrainConfig(steps=10, tokens_per_param=20)
    with pytest.raises(ValueError, match="exactly one budget"):
        TrainConfig()


def test_config_dicts_refuse_unknown_and_mistyped_fields_before_compute():
    with pytest.raises(ValueError, match=r"unknown TrainConfig field\(s\) \['learning_rate'\]; allowed: .*'lr'"):
        TrainConfig.from_dict({"steps": 5, "learning_rate": 0.1})
    with pytest.raises(TypeError, match="TrainConfig.steps must be int"):
        TrainConfig.from_dict({"steps": 5.5})


def test_training_lowers_the_loss_and_logs_metrics(tmp_path):
    result = run(tmp_path, TrainConfig(batch_size=8, seq_len=32, steps=60, lr=1e-2, eval_every=20, eval_windows=16))
    train_log = [e for e in result.metrics if e["kind"] == "train"]
    val_log = [e for e in result.metrics if e["kind"] == "val"]
    assert [e["step"] for e in val_log] == [20, 40, 60]
    assert train_log[-1]["loss"] < 0.6 * train_log[0]["loss"]
    assert val_log[-1]["val_loss"] < 0.6 * math.log(V)
    assert result.summary["val_loss"] == val_log[-1]["val_loss"] and result.summary["tokens"] == 60 * 8 * 32
    assert read_metrics(result.path.parent / "metrics.jsonl") == result.metrics
    # steady state (timed steps) and the run's wall clock (first step, evaluations, checkpoints too)
    assert 0 < result.summary["run_tokens_per_s"] < result.summary["tokens_per_s"]


def test_training_mfu_reports_the_steady_state_and_the_runs_wall_clock(monkeypatch):
    """Against the peak measured now (a fixed one here: `test_calibration_measures_and_stores_this_machine`
    measures a real one, notebook 02 the full-size one, seconds on a CPU)."""
    from types import SimpleNamespace

    from spirelib.measure import calibrate
    from spirelib.throughput.costs import flop_params, training_flops
    from spirelib.training.pipeline import training_mfu

    monkeypatch.setattr(calibrate, "matmul_peak", lambda **kwargs: {"flops": 1e12})
    run = SimpleNamespace(config=CFG, summary={"device": "cpu", "tokens_per_s": 3000.0, "run_tokens_per_s": 2000.0})
    speed = training_mfu(run)
    assert speed["mfu"] == pytest.approx(training_flops(flop_params(CFG), 3000.0) / 1e12)
    assert speed["run_mfu"] == pytest.approx(speed["mfu"] * 2 / 3) and speed["peak_flops"] == 1e12
    del run.summary["run_tokens_per_s"]  # a checkpoint from before the figure existed
    assert training_mfu(run)["run_mfu"] is None


def test_resume_after_stop_or_crash_matches_an_uninterrupted_run_bit_for_bit(tmp_path):
    full = run(tmp_path, SMALL, "full")
    stopped = run(tmp_path, SMALL, "stopped", stop_at=6)
    assert read_meta(stopped.path)["step"] == 6 and not read_meta(stopped.path)["finished"]
    resumed = run(tmp_path, SMALL, "stopped")
    for k, v in weights(full.model).items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k
    assert resumed.metrics == [e | {"elapsed_s": r["elapsed_s"], "tokens_per_s": r["tokens_per_s"]} if "elapsed_s" in e
                               else e for e, r in zip(full.metrics, resumed.metrics)]

    calls = {"n": 0}

    def crashing(model, batch):
        calls["n"] += model.training  # training steps only, not validation batches
        if calls["n"] == 10:
            raise KeyboardInterrupt
        return lm_objective(model, batch)

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, SMALL, "crashed", objective=crashing)
    assert read_meta(tmp_path / "crashed" / "checkpoint")["step"] == 8
    resumed = run(tmp_path, SMALL, "crashed")
    for k, v in weights(full.model).items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k


def test_finished_run_is_reused_and_a_different_config_is_refused(tmp_path):
    first = run(tmp_path, SMALL)
    again = run(tmp_path, SMALL, objective=lambda m, b: pytest.fail("trained again"))
    assert again.reused and not first.reused
    for k, v in weights(first.model).items():
        assert torch.equal(v, again.model.state_dict()[k])
    # Operational fields do not change identity; the learning rate does.
    assert run(tmp_path, TrainConfig(**{**SMALL.to_dict(), "log_every": 3})).reused
    with pytest.raises(CheckpointError, match=r"train\.lr: 0\.01 \(checkpoint\) != 0\.02 \(requested\)"):
        run(tmp_path, TrainConfig(**{**SMALL.to_dict(), "lr": 0.02}))


def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    calls = {"n": 0}

    def exploding(model, batch):
        loss, metrics = lm_objective(model, batch)
        calls["n"] += model.training
        return (loss * float("nan") if calls["n"] == 7 else loss), metrics

    with pytest.raises(TrainingDiverged, match=r"at step 6; the last good checkpoint \(step 4\).*lower lr"):
        run(tmp_path, SMALL, objective=exploding)
    meta = read_meta(tmp_path / "run" / "checkpoint")
    assert meta["step"] == 4 and not meta["finished"]


def test_custom_objective_metrics_are_logged_and_evaluated(tmp_path):
    def with_accuracy(model, batch):
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        return loss, {"accuracy": (logits.argmax(-1) == batch[:, 1:]).float().mean()}

    result = run(tmp_path, SMALL, objective=with_accuracy)
    assert all("accuracy" in e for e in result.metrics)
    assert 0 <= result.summary["accuracy"] <= 1


def test_compile_runs_an_objectives_own_compiled_form_instead_of_compiling_it_whole(tmp_path, monkeypatch):
    """Under `TrainConfig.compile`, an objective with a `compiled()` method (e.g. the SPIRe
    objective, which compiles only the parts that gain) is trained and evaluated through what that
    returns, and the trainer compiles nothing itself."""
    calls = {"train": 0, "eval": 0}

    def counted(model, batch):
        calls["train" if torch.is_grad_enabled() else "eval"] += 1
        return lm_objective(model, batch)

    class OwnCompile:
        def __call__(self, model, batch):
            raise AssertionError("the trainer ran the objective, not its compiled form")

        def compiled(self):
            return counted

    def no_compile(*args, **kwargs):
        raise AssertionError("the trainer compiled an objective that compiles itself")

    monkeypatch.setattr(torch, "compile", no_compile)
    cfg = TrainConfig(batch_size=4, seq_len=16, steps=3, eval_windows=4, log_every=1, compile=True)
    run(tmp_path, cfg, objective=OwnCompile())
    assert calls["train"] == 3 and calls["eval"] == 1


@torch.no_grad()
def test_generate_with_the_kv_cache_matches_greedy_decoding_by_full_forwards():
    torch.manual_seed(0)
    model = Transformer(CFG).eval()
    prompt = torch.randint(0, V, (3, 5))
    out = autoregressive_generate(model, prompt, 6, temperature=0).tokens
    seq = prompt
    for _ in range(6):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq[:, 5:])

    def sampled(seed):
        return autoregressive_generate(model, prompt, 6, temperature=1.0, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(sampled(3).tokens, sampled(3).tokens)


@pytest.mark.parametrize("chunk", [5, 1000])
def test_fused_cross_entropy_matches_logits_then_cross_entropy(chunk):
    from spirelib.model.cross_entropy import _LinearCrossEntropy

    torch.manual_seed(0)
    h = torch.randn(23, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 40, (23,))
    ref = torch.nn.functional.cross_entropy(h @ w.T, y)
    ref_grads = torch.autograd.grad(3 * ref, (h, w))
    fused = _LinearCrossEntropy.apply(h, w, y, chunk)
    torch.testing.assert_close(fused, ref)
    for got, want in zip(torch.autograd.grad(3 * fused, (h, w)), ref_grads):
        torch.testing.assert_close(got, want)


def test_loss_is_the_next_token_loss_of_the_logits():
    torch.manual_seed(0)
    model = Transformer(CFG)
    x = torch.randint(0, V, (2, 9))
    want = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    got = model.loss(x[:, :-1], x[:, 1:])
    torch.testing.assert_close(got, want)
    g_want = torch.autograd.grad(want, model.parameters())
    for a, b in zip(torch.autograd.grad(got, model.parameters()), g_want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(model.loss(x[:, :-1], x[:, 1:]), want)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the GPU path's dtype handling, on CPU
        low = model.loss(x[:, :-1], x[:, 1:])
    assert low.dtype == torch.float32 and abs(low.item() - want.item()) < 0.05


@torch.no_grad()
def test_fused_cross_entropy_without_grad_chunks_rows_too():
    from spirelib.model.transformer import linear_cross_entropy

    torch.manual_seed(0)
    h, w = torch.randn(1100, 8), torch.randn(20_000, 8)  # chunks of 512 rows (`CPU_ROWS`): three
    y = torch.randint(0, 20_000, (1100,))
    torch.testing.assert_close(linear_cross_entropy(h, w, y), torch.nn.functional.cross_entropy(h @ w.T, y))


@pytest.mark.parametrize(("vocab", "rows"), [(256, 8192), (4096, 512), (50_304, 512)])
def test_a_cpu_chunk_holds_a_cache_of_logits_and_at_least_512_rows(vocab, rows, monkeypatch):
    """`cross_entropy.CPU_ROWS`: at the paper's vocabulary the logits rule alone gives 41-row chunks,
    whose skinny matmuls ran 3.4x slower (one thread, 2,048 rows); the workbook's and the smoke
    vocabularies keep the chunks they had, so their trainings stay bit-identical."""
    from spirelib.model import cross_entropy

    chunks = []
    monkeypatch.setattr(cross_entropy._LinearCrossEntropy, "apply", lambda h, w, y, chunk: chunks.append(chunk))
    cross_entropy.linear_cross_entropy(torch.randn(4, 8, requires_grad=True), torch.randn(vocab, 8),
                                       torch.zeros(4, dtype=torch.long))
    assert chunks == [rows]


def test_a_cpus_peak_is_timed_on_2048_matmuls_where_no_sizes_are_given(monkeypatch):
    """4096 matmuls run no faster than 2048 on a CPU, at 8x the seconds (`calibrate.SIZES`)."""
    from spirelib.measure import calibrate

    timed = []
    monkeypatch.setattr(calibrate, "_best_rate", lambda fn, work, *a: timed.append(round((work / 2) ** (1 / 3))) or [1.0])
    assert calibrate.matmul_peak()["sizes"] == [2048] and timed == [2048]


def test_calibration_measures_and_stores_this_machine(monkeypatch):
    import types

    from spirelib.measure import calibrate

    peak = calibrate.matmul_peak(sizes=(64, 128), seconds=0.01, repeats=2)
    assert len(peak["rates"]) == 4 and peak["flops"] == max(peak["rates"]) > 0
    assert peak["precision"] == "fp32"
    saved, asked = {}, []
    fake = types.SimpleNamespace(save_measured=lambda flops, bw: saved.update(flops=flops, bw=bw) or "path")
    monkeypatch.setattr(calibrate, "hardware", fake)

    def fake_peak(device, dtype):
        asked.append(dtype)
        return {"flops": 2e11, "rates": [2e11], "threads": 2, "precision": calibrate.precision(dtype, device)}

    monkeypatch.setattr(calibrate, "matmul_peak", fake_peak)
    monkeypatch.setattr(calibrate, "memory_bandwidth", lambda **kw: {"bandwidth": 2e10, "rates": [2e10]})
    result = calibrate.calibrate()
    assert saved == {"flops": {"fp32": 2e11}, "bw": 2e10} and result["saved_to"] == "path"
    # a bf16 model's peak is asked in bf16 and stored as bf16; a GPU's fp32 matmuls are TF32 (the engine allows it)
    result = calibrate.calibrate(device="cuda", dtype=torch.bfloat16)
    assert asked[-1] == torch.bfloat16 and saved["flops"] == {"bf16": 2e11} and result["precision"] == "bf16"
    assert torch.backends.cuda.matmul.allow_tf32
    assert calibrate.calibrate(device="cuda")["precision"] == "tf32" and saved["flops"] == {"tf32": 2e11}
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        assert calibrate.precision(torch.float32, "cuda") == "fp32"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = True


@pytest.mark.parametrize("headless", [False, True])
def test_progress_bars_stay_out_of_headless_runs(tmp_path, monkeypatch, capsys, headless):
    """The runner's kernels are headless: a progress bar there only leaves lines in the report."""
    from spirelib.frontend import HEADLESS_ENV

    monkeypatch.setenv(HEADLESS_ENV, "1" if headless else "0")
    model = Transformer(CFG)
    train(model, lm_objective, DOCS, SMALL, run=TrainingRun(tmp_path / "bar", {"m": CFG.to_dict()}),
          session=Session("cpu", progress=True))
    printed = capsys.readouterr().err
    assert ("train" not in printed) if headless else ("train" in printed and "step" in printed)


def test_gradient_accumulation_trains_the_same_weights_and_logs_the_same_metrics(tmp_path):
    """Micro-batches of 1 window (4 per step) give the whole-batch step: same weights and logged
    losses to float tolerance, the same schedule and token counts."""
    whole = run(tmp_path, SMALL, "whole")
    accumulated = run(tmp_path, TrainConfig(**{**SMALL.to_dict(), "micro_batch_size": 1}), "accumulated")
    for k, v in weights(whole.model).items():
        torch.testing.assert_close(accumulated.model.state_dict()[k], v, rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
    assert [e["step"] for e in accumulated.metrics] == [e["step"] for e in whole.metrics]
    for a, w in zip(accumulated.metrics, whole.metrics):
        assert a["tokens"] == w["tokens"] and a.get("lr") == w.get("lr")
        for key in ("loss", "val_loss", "grad_norm"):
            if key in w:
                assert a[key] == pytest.approx(w[key], rel=1e-4), (key, a["step"])


def test_resume_with_gradient_accumulation_matches_an_uninterrupted_run_bit_for_bit(tmp_path):
    cfg = TrainConfig(**{**SMALL.to_dict(), "micro_batch_size": 2})
    full = run(tmp_path, cfg, "full")
    assert read_meta(run(tmp_path, cfg, "stopped", stop_at=6).path)["step"] == 6
    resumed = run(tmp_path, cfg, "stopped")
    for k, v in weights(full.model).items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k
    assert [e["loss"] for e in resumed.metrics if e["kind"] == "train"] == [
        e["loss"] for e in full.metrics if e["kind"] == "train"]


def test_micro_batch_size_leaves_config_hashes_unchanged_and_must_divide_the_batch(tmp_path):
    """Hashes computed before `micro_batch_size` existed; it is operational (how the step is
    executed), so a finished run is reused whatever micro-batch size asks for it."""
    assert config_hash(TrainConfig(steps=10).identity()).startswith("48ac0fd9f826e564")
    assert config_hash(TrainConfig(tokens_per_param=20.0).identity()).startswith("42d31bd49a5eec13")
    assert config_hash(SMALL.identity()).startswith("300ecc2eba54e4e6")
    assert TrainConfig(**{**SMALL.to_dict(), "micro_batch_size": 2}).identity() == SMALL.identity()
    run(tmp_path, SMALL)
    assert run(tmp_path, TrainConfig(**{**SMALL.to_dict(), "micro_batch_size": 2}),
               objective=lambda m, b: pytest.fail("trained again")).reused
    with pytest.raises(ValueError, match="micro_batch_size must be 0 .* or divide batch_size"):
        TrainConfig(**{**SMALL.to_dict(), "micro_batch_size": 3})
    with pytest.raises(ValueError, match="must divide the per-rank batch 2"):
        TrainConfig(batch_size=4, micro_batch_size=4, steps=1).micro_batches(world=2)


def test_mfu_counts_one_devices_peak_per_rank(monkeypatch):
    """Under torchrun the run's tokens/s are all ranks' together: 8 ranks at the same total
    speed are each 8 times less utilized than one process."""
    from types import SimpleNamespace

    from spirelib.measure import calibrate
    from spirelib.model.config import ModelConfig
    from spirelib.throughput.costs import flop_params, training_flops
    from spirelib.training.pipeline import training_mfu

    monkeypatch.setattr(calibrate, "matmul_peak", lambda **kwargs: {"flops": 1e12})
    cfg = ModelConfig(vocab_size=64, num_layers=2, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8, d_ff=32)
    summary = {"device": "cpu", "tokens_per_s": 8000.0, "run_tokens_per_s": 4000.0}
    one = training_mfu(SimpleNamespace(config=cfg, summary={**summary, "world_size": 1}))
    eight = training_mfu(SimpleNamespace(config=cfg, summary={**summary, "world_size": 8}))
    assert one["mfu"] == pytest.approx(training_flops(flop_params(cfg), 8000.0) / 1e12)
    assert eight["mfu"] == pytest.approx(one["mfu"] / 8) and eight["run_mfu"] == pytest.approx(one["run_mfu"] / 8)


def test_tf32_is_set_where_the_engine_is_imported_not_by_training():
    import subprocess
    import sys

    code = ("import torch; assert not torch.backends.cuda.matmul.allow_tf32; import spirelib.model.transformer; "
            "assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
