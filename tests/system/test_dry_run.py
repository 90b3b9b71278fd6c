"""The paper-shape dry run: params/paper.yaml at its shapes (8 x 512 target, vocabulary
50,304, GPT-2 ids) with every budget scaled down, on a generated LongCrawl64 fixture.

The full run of all nine notebooks is slow-marked (minutes on two cores); the fast tests cover
the same code: the series' dry run, the notebook override table, the fixture and the runner's
wiring, and one notebook (04: the SPIRe loss in its draft's training, sampling, tau) at the
paper's shapes.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import nbformat
import pytest
import yaml

from spirelib import cli
from spirelib.training import corpus, series_params
from spirelib.training import series as series_config
from spirelib.training.series import Series
from spirelib.workbook import injection, runner
from spirelib.workbook.notebooks import NOTEBOOKS as CONTRACTS

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
PAPER = ROOT / "params" / "paper.yaml"
VOCAB = 50304


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("SPIRE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("SPIRE_CACHE_DIR", raising=False)  # the dry run picks <out>/cache itself
    yield tmp_path
    for cache in tmp_path.glob("**/cache"):  # paper-shape checkpoints: GBs that pytest would keep
        shutil.rmtree(cache, ignore_errors=True)


def paper_series() -> dict:
    return runner.load_params(PAPER)["series"]


# ---------------------------------------------------------------------------- the series' dry run

def test_series_dry_run_keeps_every_shape_and_scales_every_budget():
    full = Series.from_dict(paper_series())
    dry = Series.from_dict(series_config.dry_run(paper_series()))
    assert dry == full.dry_run()  # one rule, two doors
    for name in ("target", "spire", "magicdec", "vocab_size", "corpus", "corpus_path", "tokenizer", "k", "seed",
                 "temperature", "tau_seed"):
        assert getattr(dry, name) == getattr(full, name), name
    assert dry.target.vocab_size == VOCAB and (dry.target.num_layers, dry.target.d_model) == (8, 512)
    assert (dry.device, dry.new_tokens) == ("cpu", series_params.DRY_RUN["new_tokens"])
    for name in series_params.TRAININGS:
        given, got = getattr(full, name), getattr(dry, name)
        assert (got.steps, got.tokens_per_param, got.batch_size, got.seq_len, got.compile) == (2, 0.0, 1, 128, False)
        assert got.eval_windows == 1 and got.total_steps(full.target.num_params()) == 2
        assert (got.lr, got.warmup_fraction) == (given.lr, given.warmup_fraction)  # the optimizer is the file's
    # a training the file leaves out starts from the smoke default and is scaled the same way
    assert Series.from_dict(series_config.dry_run({})).spire_training.steps == 2


# ---------------------------------------------------------------------------- the notebook override table

def test_every_dry_run_override_names_a_declared_parameter_of_its_notebook():
    declared = {p.stem: injection.declared_parameters(p) for p in injection.discover(NOTEBOOKS)}
    for stem, overrides in ((s, nb.dry_run) for s, nb in CONTRACTS.items() if nb.dry_run):
        assert stem in declared, stem
        assert set(overrides) <= set(declared[stem]), (stem, set(overrides) - set(declared[stem]))


@pytest.mark.parametrize("params_file, corpus_path", [("paper.yaml", "/somewhere/lc64"), ("smoke.yaml", None)])
def test_dry_run_plan_applies_the_table_and_the_series_dry_run_to_every_notebook(params_file, corpus_path):
    path = ROOT / "params" / params_file
    _, _, full = injection.prepare(path, NOTEBOOKS)
    _, _, dry = injection.prepare(path, NOTEBOOKS, dry_run=True, corpus_path=corpus_path)
    assert dry.keys() == full.keys()
    for stem, chosen in dry.items():
        table = CONTRACTS[stem].dry_run if stem in CONTRACTS else {}
        for key, value in chosen.items():
            if key == "series":
                want = series_config.dry_run(injection.with_corpus_path(
                    {"series": full[stem].get("series", {})}, corpus_path)["series"])
                assert value == want and Series.from_dict(value).device == "cpu"
            elif key in table:
                rule = table[key]
                assert value == (rule(full[stem].get(key)) if callable(rule) else rule), (stem, key)
            else:
                assert value == full[stem][key], (stem, key)  # not a budget: the file's value
        assert set(chosen) - set(full[stem]) <= set(table) | {"series"}
        # a notebook with the series gets its dry run even when the file has no series section (smoke.yaml)
        assert ("series" in chosen) == ("series" in injection.declared_parameters(NOTEBOOKS / f"{stem}.ipynb"))
    assert dry["05_ablations"]["ablation_training"]["steps"] == 2 and len(dry["05_ablations"]["ablation_seeds"]) == 1
    assert full["01_performance_model"] == dry["01_performance_model"]  # numpy-only notebooks run as they are


def test_the_ablation_budget_of_the_dry_run_is_the_spire_drafts_so_its_model_is_reused():
    _, _, dry = injection.prepare(PAPER, NOTEBOOKS, dry_run=True)
    series = Series.from_dict(dry["05_ablations"]["series"])
    assert series.training(dry["05_ablations"]["ablation_training"], "ablation_training") == series.spire_training


def test_a_dry_run_value_that_does_not_fit_its_notebook_is_reported(monkeypatch):
    monkeypatch.setitem(CONTRACTS, "04_measure_tau", dataclasses.replace(CONTRACTS["04_measure_tau"],
                                                                   dry_run={"n_contexts": "two"}))
    with pytest.raises(runner.ParamsError, match="dry run of 04_measure_tau: n_contexts: expected int"):
        injection.prepare(PAPER, NOTEBOOKS, dry_run=True)


# ---------------------------------------------------------------------------- the runner's wiring

def _probe_notebook(folder: Path) -> Path:
    """One notebook declaring `series` that records what it received and where models would go."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("series: dict = {}")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "import os\nfrom spirelib.workbook.results import record\nfrom spirelib.training.series import Series\n"
        "s = Series.from_dict(series)\n"
        "record('series', series)\nrecord('cache', os.environ.get('SPIRE_CACHE_DIR'))\n"
        "record('train_rows', s.data().dataset.train.rows)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    folder.mkdir()
    nbformat.write(nb, folder / "01_probe.ipynb")
    return folder


def test_dry_run_cli_writes_to_stem_dry_run_with_its_own_cache_on_a_generated_fixture(isolated, monkeypatch, capsys):
    notebooks = _probe_notebook(isolated / "notebooks")
    params = isolated / "paper.yaml"
    params.write_text(yaml.safe_dump({"series": {**paper_series(), "corpus_path": "no/such/folder"}}))
    monkeypatch.setattr(runner, "project_root", lambda: isolated)
    out = isolated / "outputs" / "paper-dry-run"
    assert cli.main(["check", "--params", str(params), "--notebooks", str(notebooks), "--dry-run"]) == 0
    assert "a run uses the generated fixture" in capsys.readouterr().out and not out.exists()  # check writes nothing
    assert cli.main(["run", "--params", str(params), "--notebooks", str(notebooks), "--dry-run"]) == 0
    run = json.loads((out / "run.json").read_text())
    got = json.loads((out / "results.json").read_text())["01_probe"]
    fixture = out / runner.FIXTURE_FOLDER
    assert run["dry_run"] is True and run["notebooks"]["01_probe"]["status"] == "ok"
    assert got["series"] == series_config.dry_run({**paper_series(), "corpus_path": str(fixture.resolve())})
    assert got["cache"] == str(out / "cache") and got["train_rows"] == 8
    assert "using the generated fixture" in capsys.readouterr().out
    # --corpus-path wins over the fixture, and a plain run is no dry run
    corpus.write_longcrawl64_fixture(isolated / "lc", train_docs=3)
    assert cli.main(["run", "--params", str(params), "--notebooks", str(notebooks), "--dry-run",
                          "--corpus-path", str(isolated / "lc"), "--out", str(isolated / "other")]) == 0
    got = json.loads((isolated / "other" / "results.json").read_text())["01_probe"]
    assert got["train_rows"] == 3 and got["series"]["corpus_path"] == str(isolated / "lc")
    assert not (isolated / "other" / runner.FIXTURE_FOLDER).exists()


# ---------------------------------------------------------------------------- at the paper's shapes

def _assert_tau_at_the_paper_shapes(out: Path, methods: list[str]):
    results = json.loads((out / "results.json").read_text())["04_measure_tau"]
    protocol = results["tau_protocol"]
    assert protocol["target"]["vocab_size"] == VOCAB and protocol["target"]["num_layers"] == 8
    assert protocol["target"]["d_model"] == 512 and protocol["spire_draft"]["k"] == 4
    for m in methods:
        for L in ("64", "256"):
            tau = results["tau"][m][L]
            assert tau["n_contexts"] == 2 and 1.0 <= tau["mean"] <= 5.0, (m, L, tau)


def test_notebook_04_runs_at_the_paper_shapes_with_dry_run_budgets(isolated):
    """The SPIRe loss (its draft's k-pass training), the vanilla draft and the target trained at
    V = 50,304, then tau for every method: the heart of the dry run, in under a minute."""
    out = isolated / "out"
    rc = cli.main(["run", "--params", str(PAPER), "--notebooks", str(NOTEBOOKS), "--dry-run", "--only", "04",
                        "--out", str(out)])
    entry = json.loads((out / "run.json").read_text())["notebooks"]["04_measure_tau"]
    assert rc == 0 and entry["status"] == "ok", entry.get("error")
    _assert_tau_at_the_paper_shapes(out, ["vanilla", "magicdec", "spire"])
    assert (out / "04_measure_tau.html").is_file()


@pytest.mark.slow
def test_the_whole_paper_series_runs_as_a_dry_run_on_a_longcrawl64_fixture(isolated):
    out = isolated / "out"
    rc = cli.main(["run", "--params", str(PAPER), "--notebooks", str(NOTEBOOKS), "--dry-run", "--out", str(out)])
    run = json.loads((out / "run.json").read_text())
    failed = {stem: e.get("error") for stem, e in run["notebooks"].items() if e["status"] != "ok"}
    assert rc == 0 and not failed, failed
    results = json.loads((out / "results.json").read_text())
    assert results["02_train_target"]["target"]["params"] == Series.from_dict(paper_series()).target.num_params()
    assert results["02_train_target"]["target"]["embedding_params"] >= 2 * VOCAB * 512  # untied, plus the final norm
    _assert_tau_at_the_paper_shapes(out, ["vanilla", "magicdec", "spire"])
    assert set(results["05_ablations"]["tau"]) == {"spire", "random_init", "distill_only", "hard_target",
                                                    "no_feedback", "no_feedback_no_target_acts"}
    cells = results["09_measured_vs_modeled"]["cells"]
    assert {(c["method"], c["B"], c["L"]) for c in cells} == {(m, b, L) for m in ("vanilla", "magicdec", "spire")
                                                              for b in (1, 2) for L in (64, 256)}
    assert all(c["measured_speedup"] > 0 for c in cells)
    for stem in run["notebooks"]:
        assert (out / f"{stem}.html").is_file()
    assert (out / "index.html").is_file()
