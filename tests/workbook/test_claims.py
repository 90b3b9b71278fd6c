"""The claims a run made (spirelib.workbook.claims), kept in run.json and compared with the previous
run in the same folder: a verdict that flips between two runs of the same params on the same
machine is printed."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json

import pytest

from spirelib.workbook import claims, execute, plan, report, runner
from spirelib.workbook.notebooks import NOTEBOOKS

NOTEBOOK = "09_measured_vs_modeled"


def cells(speedups: list[float], ci: float = 0.05) -> dict:
    """09's record of SPIRe measured at B = 1 and 2, L = 256, with these speedups over AD, each
    +/- `ci` (its 95% interval)."""
    return {NOTEBOOK: {"cells": [{"method": "spire", "B": B, "L": 256, "measured_speedup": s, "modeled_speedup": s,
                                  "error": 0.0, "ci_low": s - ci, "ci_high": s + ci}
                                 for B, s in zip((1, 2), speedups)]}}


def test_a_runs_claims_are_its_verdicts_and_the_changed_ones_are_those_that_flipped():
    run = {"notebooks": {NOTEBOOK: {"html": f"{NOTEBOOK}.html"}}}
    fast, slow = claims.record(run, cells([1.2, 1.3])), claims.record(run, cells([1.2, 0.9]))
    faster = "Speculative decoding is faster than AD on the clock (measured)"
    assert fast["sd-faster-measured"]["claim"] == faster
    assert fast["sd-faster-measured"]["verdict"] == "reproduced" and slow["sd-faster-measured"]["verdict"] == "not reproduced"
    assert fast["sd-faster-measured"]["evidence"].startswith("faster in 2 of 2 measured cells")
    cell = "winner at B = 2, L = 256 (this machine, measured)"
    assert fast["winner:measured:B2:L256"]["claim"] == cell
    assert fast["winner:measured:B2:L256"]["verdict"] == "SPIRe" and slow["winner:measured:B2:L256"]["verdict"] == "AD"
    # only verdicts count: other numbers with the same verdicts are no change
    assert claims.changes(fast, claims.record(run, cells([1.25, 1.4]))) == []
    changed = claims.changes(fast, slow)
    assert [(c["claim"], c["before"], c["after"]) for c in changed] == [
        (faster, "reproduced", "not reproduced"), (cell, "SPIRe", "AD")]
    # the same winner, no longer resolved (its interval reaches below AD's 1): a changed verdict too
    wide = claims.record(run, cells([1.2, 1.3], ci=0.4))
    assert wide["winner:measured:B2:L256"]["verdict"] == "SPIRe (not resolved)"
    assert [c["claim"] for c in claims.changes(fast, wide)] == ["winner at B = 1, L = 256 (this machine, measured)", cell]
    gone = claims.changes(fast, {})
    assert {c["claim"] for c in gone} == {c["claim"] for c in fast.values()} and all(c["after"] is None for c in gone)
    # a claim reworded by a later version of the workbook is the same claim: compared by its key
    reworded = {k: {**c, "claim": c["claim"].upper()} for k, c in fast.items()}
    assert claims.changes(reworded, fast) == []
    text = claims.report(changed, "2026-12-04T10:00:00")
    assert text.splitlines()[1] == f"  {faster}: reproduced -> not reproduced"
    assert "now: faster in 1 of 2 measured cells" in text


def test_runs_compare_only_on_the_same_params_and_machine():
    kept = {"claims": {"x": {"verdict": "reproduced", "evidence": ""}}, "params": {"a": 1}, "machine": "m"}
    assert claims.comparable(kept, {"params": {"a": 1}, "machine": "m"}) is None
    assert "other params" in claims.comparable(kept, {"params": {"a": 2}, "machine": "m"})
    assert "another machine (m)" in claims.comparable(kept, {"params": {"a": 1}, "machine": "n"})
    assert "kept no claims" in claims.comparable({**kept, "claims": {}}, {"params": {"a": 1}, "machine": "m"})


@pytest.fixture
def series(tmp_path, monkeypatch):
    """A one-notebook series (09, a stub) and a `spire run` of it whose notebook execution only records
    `speedups` as 09's results (the notebook stack and the plan replaced), in a fresh cache."""
    monkeypatch.setenv("SPIRE_CACHE_DIR", str(tmp_path / "cache"))
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    cell = {"cell_type": "code", "execution_count": None, "id": "p", "metadata": {"tags": ["parameters"]},
            "outputs": [], "source": ["x: int = 1\n"]}
    (notebooks / f"{NOTEBOOK}.ipynb").write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4,
                                                             "nbformat_minor": 5}))
    recorded = {"speedups": [1.2, 1.3]}

    class Execute:
        Kernels = execute.Kernels

        @staticmethod
        def execute(nb, injected, out_dir, *args):
            (out_dir / "results" / f"{nb.stem}.json").write_text(json.dumps(cells(recorded["speedups"])[nb.stem]))
            return "ok", 1.0, None

    class Report:
        @staticmethod
        def write_index(out_dir):
            return out_dir / "index.html"

    monkeypatch.setattr(runner, "notebook_stack", lambda: (Execute, Report))
    monkeypatch.setitem(NOTEBOOKS, "09_measured_vs_modeled", dataclasses.replace(  # the stub declares none of 09's
        NOTEBOOKS["09_measured_vs_modeled"], checks=None))                              # parameters
    monkeypatch.setattr(runner, "work_plan", lambda params, selected, *a: plan.Plan(
        [], [nb.stem for nb in selected], "cpu: the test's", 0.0, []))  # 09's work is not the point here

    def run(x: int = 1) -> tuple[str, dict]:
        params = tmp_path / "params.yaml"
        params.write_text(f"notebooks:\n  {NOTEBOOK}:\n    x: {x}\n")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert runner.run(params, notebooks, tmp_path / "out") == 0
        return printed.getvalue(), json.loads((tmp_path / "out" / "run.json").read_text())

    return run, recorded


def test_spire_run_prints_the_verdicts_that_flipped_since_the_last_run_of_the_same_params(series):
    run, recorded = series
    first, record = run()
    assert "claims: not compared (no earlier run in this folder)" in first and record["claims_changed"] is None
    assert record["claims"]["sd-faster-measured"]["verdict"] == "reproduced"
    same, record = run()
    assert "claims: the same verdicts as the run of" in same and record["claims_changed"] == []
    recorded["speedups"] = [1.2, 0.9]
    flipped, record = run()
    assert ("  Speculative decoding is faster than AD on the clock (measured): reproduced -> not reproduced"
            in flipped.splitlines())
    assert "winner at B = 2, L = 256 (this machine, measured): SPIRe -> AD" in flipped
    assert {c["claim"] for c in record["claims_changed"]} >= {"winner at B = 2, L = 256 (this machine, measured)"}
    index = report.changed_claims_section(record, {})
    assert "<h2 id='changed'>Changed since the run of " in index and "2 of this run's verdicts differ" in index
    assert ("<tr><td>winner at B = 2, L = 256 (this machine, measured)</td><td>SPIRe</td><td><b>AD</b></td>"
            in index)
    recorded["speedups"] = [1.2, 1.3]
    other, record = run(x=2)
    assert "claims: not compared (the previous run in this folder had other params)" in other
    assert record["claims_changed"] is None and "->" not in other
    assert "not compared with an earlier run: the previous run in this folder had other params" in (
        report.changed_claims_section(record, {}))


def test_the_index_says_when_every_verdict_held():
    record = {"claims_changed": [], "claims_compared": {"with": "2026-12-04T10:00:00", "why_not": None}}
    assert "Every verdict is the same as in the run of 2026-12-04T10:00:00" in report.changed_claims_section(record, {})
    assert report.changed_claims_section({}, {}) == ""  # a run from before claims were compared
