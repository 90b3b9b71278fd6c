"""The terminal of `spire run`: the progress a headless kernel feeds (`spirelib.frontend`), the line
`spirelib.workbook.progress` makes of it, its ETA, and the table a run ends with."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from spirelib import frontend
from spirelib.workbook import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def record(n, total, rate=None, **fields):
    return {"t": 0.0, "what": "train target", "n": n, "total": total, "rate": rate, **fields}


def test_the_eta_is_the_plans_unless_the_running_bar_needs_longer_and_the_rate_past_the_plan():
    assert progress.eta(record(10, 100, rate=1.0), elapsed=20.0, planned=200.0) == (180.0, "plan")
    assert progress.eta(record(10, 100, rate=0.1), elapsed=20.0, planned=200.0) == (900.0, "rate")
    assert progress.eta(record(10, 100, rate=1.0), elapsed=250.0, planned=200.0) == (90.0, "rate")
    assert progress.eta(record(10, 100, rate=1.0), elapsed=20.0, planned=None) == (90.0, "rate")
    assert progress.eta(record(100, 100, rate=1.0), elapsed=250.0, planned=200.0) == (None, "")  # bar done
    assert progress.eta({}, elapsed=20.0, planned=float("nan")) == (None, "")


def test_a_record_reads_as_what_runs_step_of_total_tokens_per_second_and_the_eta():
    line = progress.status_line(record(420, 1600, rate=2.0, unit="step", tokens_per_s=2710.4,
                                       postfix="loss=3.412"), elapsed=252.0, planned=1000.0)
    assert line == "train target 420/1,600 step, 2,710 tokens/s, loss=3.412, 4:12 elapsed, ETA 12:28 (plan)"
    assert progress.status_line(None, elapsed=3725.0, planned=None) == "1:02:05 elapsed"


def test_a_headless_bar_feeds_the_file_the_runner_names_and_prints_nothing(tmp_path, monkeypatch, capsys):
    feed = tmp_path / "feed.jsonl"
    monkeypatch.setenv(frontend.HEADLESS_ENV, "1")
    monkeypatch.setenv(frontend.PROGRESS_ENV, str(feed))
    for _ in frontend.progress_bar(range(3), desc="tau", unit="batch", tokens_per_step=10):
        time.sleep(0.01)
    frontend.feed("time AD and SD", 1, 4, unit="run", postfix="(B, L) = (2, 64)")
    assert capsys.readouterr() == ("", "")
    lines = [json.loads(line) for line in feed.read_text().splitlines()]
    assert lines[0]["what"] == "tau" and lines[0]["n"] == 0 and lines[0]["total"] == 3
    bar = lines[-2]
    assert bar["n"] == 3 and bar["unit"] == "batch" and bar["tokens_per_s"] == pytest.approx(10 * bar["rate"])
    assert lines[-1]["what"] == "time AD and SD" and lines[-1]["postfix"] == "(B, L) = (2, 64)"
    monkeypatch.delenv(frontend.PROGRESS_ENV)  # no runner asked: nothing fed, nothing shown
    for _ in frontend.progress_bar(range(2), desc="tau"):
        pass
    frontend.feed("x", 1, 1)
    assert len(feed.read_text().splitlines()) == len(lines) and capsys.readouterr() == ("", "")


def test_on_a_terminal_the_line_is_rewritten_in_place_and_cleared_for_the_outcome(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "TICK_S", 0.02)
    feed, terminal = tmp_path / "feed.jsonl", Terminal()
    with progress.Watch("[2/9] 02_train_target", feed, 100.0, terminal, live=True) as watch:
        with open(feed, "a") as f:
            f.write(json.dumps(record(5, 50, rate=1.0, unit="step")) + "\n" + '{"t": 1.0, "what": "tr')  # half written
        time.sleep(0.2)
    shown = terminal.getvalue()
    assert "\r[2/9] 02_train_target: train target 5/50 step, 0:00 elapsed, ETA 1:40 (plan)\x1b[K" in shown
    assert "\n" not in shown and shown.endswith("\r\x1b[K") and not watch.printed
    assert watch.record["n"] == 5  # the line still being written is not read


def test_without_a_terminal_a_plain_line_comes_at_most_every_interval(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "TICK_S", 0.02)
    feed, log = tmp_path / "feed.jsonl", io.StringIO()
    feed.write_text(json.dumps(record(5, 50, rate=1.0)) + "\n")
    with progress.Watch("[1/2] 01_x", feed, None, log, live=False) as watch:
        time.sleep(0.2)
    assert log.getvalue() == "" and not watch.printed  # the notebook ran less than PLAIN_INTERVAL_S
    monkeypatch.setattr(progress, "PLAIN_INTERVAL_S", 0.1)
    with progress.Watch("[1/2] 01_x", feed, None, log, live=False) as watch:
        time.sleep(0.35)
    lines = log.getvalue().split("\n")
    assert lines[0] == "" and 2 <= len(lines) - 2 <= 4, lines  # a new line first; one per interval
    assert all(line.startswith("[1/2] 01_x: train target 5/50, ") for line in lines[1:-1]) and watch.printed


def test_a_relative_progress_file_is_read_after_the_notebook_changes_the_working_directory(tmp_path, monkeypatch):
    """papermill runs a notebook with the process's working directory set to the notebooks' folder:
    the runner's feed, named relative to where `spire run` started (outputs/default/progress/...),
    must still be the file the watch reads."""
    monkeypatch.setattr(progress, "TICK_S", 0.02)
    monkeypatch.setattr(progress, "PLAIN_INTERVAL_S", 0.05)
    (tmp_path / "out").mkdir()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "out" / "feed.jsonl").write_text(json.dumps(record(5, 50, rate=1.0)) + "\n")
    monkeypatch.chdir(tmp_path)
    log = io.StringIO()
    with progress.Watch("[2/9] 02_x", Path("out") / "feed.jsonl", None, log, live=False) as watch:
        monkeypatch.chdir(tmp_path / "notebooks")  # as papermill.execute_notebook(cwd=...) does
        time.sleep(0.3)
    assert watch.printed and "train target 5/50" in log.getvalue(), log.getvalue()


def test_the_summary_lists_this_runs_notebooks_against_the_plan_then_the_verdict(tmp_path):
    run = {"notebooks": {"01_a": {"status": "ok", "seconds": 9.8, "planned_s": 8.0, "html": "01_a.html"},
                         "02_b": {"status": "failed", "seconds": 80.0, "planned_s": 50.0, "planned_at_tau_1_s": 70.0,
                                  "html": "02_b.html"},
                         "03_c": {"status": "skipped"}, "00_earlier": {"status": "ok", "seconds": 1e4}}}
    text = progress.summary(run, ["01_a", "02_b", "03_c"], tmp_path, "SPIRe wins & more.")
    lines = text.splitlines()
    assert lines[1].split() == ["01_a", "ok", "9.8", "s", "8.0", "s", str(tmp_path / "01_a.html")]
    assert lines[2].split()[:7] == ["02_b", "failed", "80", "s", "50", "-", "70"]  # decoding priced over tau
    assert lines[3].split() == ["03_c", "skipped", "-", "-"]
    assert lines[4].split() == ["the", "run", "90", "s", "58", "-", "78", "s"]  # 00_earlier is not this run's
    assert lines[5] == "verdict: SPIRe wins & more."
