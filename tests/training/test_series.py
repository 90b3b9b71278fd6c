"""The series configuration: one checked object for data, target, drafts and decoding protocol."""

from __future__ import annotations

import json

import pytest

from spirelib import cli
from spirelib.throughput.methods import KVBudget
from spirelib.training import series as series_module
from spirelib.training.series import Series, SeriesError

SMALL = dict(device="cpu", seed=0, corpus="stdlib", corpus_path="", tokenizer="bytes", vocab_size=256,
             target=dict(num_layers=1, d_model=8, n_q_per_kv=1, n_kv=1, d_head=8, d_ff=8),
             target_training=dict(steps=1), spire=dict(num_layers=1, window=8, k=2))


def test_defaults_are_the_smoke_configuration_and_round_trip():
    s = Series()
    assert s == Series.from_dict({}) == Series.from_dict(s.to_dict())
    assert (s.corpus, s.tokenizer, s.target.num_layers, s.target_training.steps) == ("stdlib", "bytes", 2, 40)
    assert Series.from_dict(s) is s  # a notebook cell that builds it can run again
    built = Series.from_dict(SMALL)
    assert (built.target.vocab_size, built.target_training.steps, built.target_training.seed) == (256, 1, 0)
    assert Series.from_dict(built.to_dict()) == built


def test_seed_reaches_every_trainer_and_vocab_size_the_target():
    s = Series.from_dict({**SMALL, "seed": 7, "vocab_size": 300, "tokenizer": "bpe"})
    assert {s.target_training.seed, s.vanilla_training.seed, s.spire_training.seed} == {7}
    assert s.target.vocab_size == 300
    assert s.training({"steps": 2}, "ablation_training").seed == 7


@pytest.mark.parametrize("change,message", [
    ({"target": {**SMALL["target"], "n_heads": 4}}, r"target field\(s\) \['n_heads'\]; allowed: .*'n_kv'"),
    ({"target_training": {"steps": 1, "seed": 3}}, "the seed is the series' seed field"),
    ({"target": {**SMALL["target"], "vocab_size": 9}}, "set vocab_size as the series' vocab_size field"),
    ({"corpus": "wiki"}, "unknown corpus"),
    ({"tokenizer": "gpt2", "vocab_size": 50304}, "longcrawl64"),
    ({"vocab_size": 100}, "below the bytes tokenizer's minimum 256"),
    ({"device": "gpu"}, "device"),
    ({"devcie": "cpu"}, r"devcie: not a series field \(did you mean 'device'\?\)"),
    ({"seed": 1.5}, "seed: expected int"),
    ({"temperature": "hot"}, "temperature: expected float"),
    ({"spire": {"num_layers": 2, "window": 8, "k": 2}}, "exceed the target's 1"),
    ({"spire": {"windw": 8}}, r"unknown spire field\(s\) \['windw'\]"),
    ({"magicdec": {"rope_mode": "cached"}}, "rope_mode must be 'cache' or 'original'"),
    ({"k": 0}, "need k >= 1"),
    ({"compile_decoding": "yes"}, "compile_decoding: expected bool"),
])
def test_bad_values_are_refused_before_any_compute(change, message):
    with pytest.raises(SeriesError, match=message):
        Series.from_dict({**SMALL, **change})
    assert series_module.problems({**SMALL, **change})


def test_every_problem_is_reported_at_once():
    bad = {**SMALL, "devcie": "cpu", "seed": "0", "spire": {"windw": 8}, "target_training": {"stepz": 1}}
    found = series_module.problems(bad)
    assert len(found) == 4, found
    with pytest.raises(SeriesError) as e:
        Series.from_dict(bad)
    assert e.value.problems == found and str(e.value).startswith("series: 4 problems")


def test_nested_configs_must_agree_when_built_directly():
    from dataclasses import replace

    from spirelib.training.train import TrainConfig

    with pytest.raises(SeriesError, match="target_training.seed 3 differs"):
        replace(Series.from_dict(SMALL), target_training=TrainConfig(steps=1, seed=3))


def test_cli_trains_the_series_models_from_a_params_file_and_notebooks_reuse_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPIRE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SPIRE_CACHE_DIR", str(tmp_path / "cache"))
    tiny = dict(batch_size=2, seq_len=16, steps=3, eval_windows=2)
    config = dict(device="cpu", seed=0, corpus="text", corpus_path=str(tmp_path / "texts"), tokenizer="bytes",
                  vocab_size=256, target=dict(num_layers=2, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8, d_ff=32),
                  target_training=tiny, vanilla_training=tiny, spire_training=tiny,
                  spire=dict(num_layers=1, window=8, k=2))
    (tmp_path / "texts").mkdir()
    for i in range(4):
        (tmp_path / "texts" / f"{i}.txt").write_text(f"document {i} " * 40)
    params = tmp_path / "p.yaml"
    params.write_text(json.dumps({"series": config}))  # JSON is YAML
    assert cli.main(["train", "target", "--params", str(params), "--no-progress"]) == 0
    assert "target-" in capsys.readouterr().out
    run = Series.from_dict(config).trained_target(progress=False)
    assert run.result.reused and run.summary["steps"] == 3
    for model, variant in (("vanilla", "spire"), ("spire", "spire"), ("spire", "no_feedback")):
        assert cli.main(["train", model, "--params", str(params), "--variant", variant, "--no-progress"]) == 0
    fresh = Series.from_dict(config)
    assert fresh.trained_vanilla_draft(progress=False).result.reused
    assert fresh.trained_spire_draft("no_feedback", progress=False).result.reused
    params.write_text(json.dumps({"series": {**config, "sed": 0}}))
    capsys.readouterr()
    assert cli.main(["train", "spire", "--params", str(params), "--variant", "no_feedbak"]) == 2
    err = capsys.readouterr().err
    assert "2 problems, nothing was run" in err and "series.sed: not a series field (did you mean 'seed'?)" in err
    assert "--variant no_feedbak: no such SPIRe variant" in err
    params.write_text(json.dumps({"series": config}))
    assert cli.main(["train", "vanilla", "--params", str(params), "--variant", "no_feedback"]) == 2
    assert "only the spire draft has variants" in capsys.readouterr().err
    compiled = Series.from_dict({**config, "compile_decoding": True})
    assert compiled.trained_target(progress=False).model.compiled_decoding  # the same checkpoint, compiled
    assert not run.model.compiled_decoding


def _checkpoint(tmp_path):
    """A tiny random Llama checkpoint with a BPE tokenizer.json, as a user would bring one."""
    import torch

    from spirelib.model.config import ModelConfig
    from spirelib.model.transformer import Transformer
    from spirelib.training import hf_export
    from spirelib.training.tokenizer import BPETokenizer, train_bpe

    tok = BPETokenizer(train_bpe(["the cat sat on the mat, the dog ate the hat"] * 20, 300))
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=320, num_layers=2, d_model=64, n_q_per_kv=2, n_kv=2, d_head=16,
                                    d_ff=128))
    return hf_export.save_model(model, tmp_path / "ckpt", tokenizer=tok), model


def test_an_imported_target_gives_the_target_and_the_vocabulary(tmp_path):
    folder, model = _checkpoint(tmp_path)
    s = Series.from_dict({"target_source": f"hf:{folder}", "device": "cpu"})
    assert s.target == model.cfg and s.vocab_size == 320 and s.tokenizer == "hf" and s.imported == folder
    assert Series.from_dict(s.to_dict()) == s
    for change, message in (({"target_source": "hf:nowhere"}, "no config.json in"),
                            ({"target_source": "s3://bucket"}, "neither empty"),
                            ({"target_source": f"hf:{folder}", "vocab_size": 320}, "come from its config.json"),
                            ({"target_source": f"hf:{folder}", "tokenizer": "bpe"}, "tokenizer hf"),
                            ({"tokenizer": "hf"}, "tokenizer hf"),
                            ({"target_source": f"hf:{folder}", "corpus": "longcrawl64", "tokenizer": "hf"}, "GPT-2")):
        with pytest.raises(SeriesError, match=message):
            Series.from_dict(change)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "attention_bias": True}))
    with pytest.raises(SeriesError, match="attention_bias"):
        Series.from_dict({"target_source": f"hf:{folder}"})


def test_the_smoke_series_runs_on_an_imported_checkpoint(tmp_path, monkeypatch):
    """02 evaluates the imported target, 03 trains both drafts for it, 04 measures every method's tau."""
    from pathlib import Path

    monkeypatch.setenv("SPIRE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SPIRE_CACHE_DIR", str(tmp_path / "cache"))
    folder, _ = _checkpoint(tmp_path)
    short = {"batch_size": 4, "seq_len": 64, "steps": 4, "eval_windows": 4, "log_every": 2}
    params = tmp_path / "p.yaml"
    params.write_text(json.dumps({
        "series": {"target_source": f"hf:{folder}", "device": "cpu", "target_training": short,
                   "vanilla_training": short, "spire_training": short, "eagle3_training": short, "new_tokens": 8},
        "notebooks": {"02_train_target": {"num_samples": 1, "prompt_tokens": 8, "sample_tokens": 8},
                      "04_measure_tau": {"context_lengths": [16], "n_contexts": 4, "decode_batch_size": 4}}}))
    out = tmp_path / "out"
    root = Path(__file__).resolve().parents[2]
    assert cli.main(["run", "--params", str(params), "--notebooks", str(root / "notebooks"), "--only",
                          "02,03,04", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["02_train_target"]["target"]["imported_from"] == str(folder)
    assert results["02_train_target"]["target"]["embedding_params"] == 2 * 320 * 64 + 64
    assert set(results["04_measure_tau"]["tau"]) == {"vanilla", "magicdec", "spire", "guided", "lookup", "eagle3"}


def test_an_imported_targets_identity_follows_its_weights(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import save_file

    from spirelib.training import hf_export, hf_weights

    monkeypatch.setenv("SPIRE_CACHE_DIR", str(tmp_path / "cache"))
    folder, model = _checkpoint(tmp_path)
    before = hf_export.checkpoint_digest(folder)
    assert hf_export.checkpoint_digest(folder) == before  # cached, and the same
    with torch.no_grad():
        model.blocks[0].mlp.w_down.weight.add_(1e-3)
    save_file(hf_weights.hf_state_dict(model), str(folder / "model.safetensors"), metadata={"format": "pt"})
    assert hf_export.checkpoint_digest(folder) != before  # same shapes and config, other weights: drafts retrain


def test_the_guided_draft_splits_a_kv_budget_like_magicdecs_and_the_sweep_names_each_budget(monkeypatch):
    s = Series.from_dict({**SMALL, "magicdec": {"sink": 1, "window": 64}})
    assert s.kv_budgets()["guided"] == KVBudget(1, 32, 32)  # MagicDec's 65 entries
    assert s.kv_budgets(16)["guided"] == KVBudget(1, 8, 7) and s.kv_budgets(16)["magicdec"] == KVBudget(1, 15)
    assert s.kv_budgets(257)["guided"].entries == 257 and s.kv_budgets()["spire"] == KVBudget(s.spire.sink, s.spire.window)
    with pytest.raises(ValueError, match="a KV budget of 2 leaves 1 entries past the sink of 1"):
        s.kv_budgets(2)
    built = []
    monkeypatch.setattr("spirelib.decoding.builders.draft_factory",
                        lambda method, target, model=None, **options: built.append((method, options)) or method)
    monkeypatch.setattr(Series, "trained_target", lambda self: type("T", (), {"model": None})())
    factories = s.budget_factories([16, 64])
    assert list(factories) == ["magicdec@16", "guided@16", "magicdec@64", "guided@64"]
    assert built[0] == ("magicdec", {"temperature": 1.0, "budget": KVBudget(1, 15), "rope_mode": "cache"})
    assert built[1] == ("guided", {"temperature": 1.0, "budget": KVBudget(1, 8, 7)})
