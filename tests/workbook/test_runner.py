"""The runner: params validation, notebook selection, execution, results and failure handling."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import signal
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import own_cache
from jupyter_client.provisioning import LocalProvisioner
from terminal import terminal_output

from spirelib import cli
from spirelib.throughput.recorded import RecordedBudget
from spirelib.units import duration
from spirelib.workbook import execute, progress, report, results, runner

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SERIES = FIXTURES / "notebooks"

# ---------------------------------------------------------------------------- params files

def test_load_params_rejects_bad_layout(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("shraed: {}\nnotebooks:\n  01_perf: [1, 2]\n")
    with pytest.raises(runner.ParamsError) as e:
        runner.load_params(bad)
    assert "shraed: unknown top-level key (did you mean 'shared'?)" in str(e.value)
    assert "notebooks.01_perf: must map" in str(e.value)


def test_load_params_does_not_construct_python_objects(tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("shared: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(Exception, match="python/object"):
        runner.load_params(evil)


# ---------------------------------------------------------------------------- results helper

def test_record_converts_numpy_and_torch_and_replaces_keys(tmp_path, monkeypatch):
    monkeypatch.setenv(results.RESULTS_FILE_ENV, str(tmp_path / "r.json"))
    results.record("a", np.float32(0.5))
    results.record("arr", np.arange(3))
    results.record("t", {"x": torch.tensor([1.5, 2.5]), "n": np.int64(7), "pair": (1, "b")})
    results.record("a", 2)
    results.record("budgets", {"draft": RecordedBudget(10, 5, 100, np.float64(0.1))})  # a shape read back typed
    assert json.loads((tmp_path / "r.json").read_text()) == {
        "a": 2, "arr": [0, 1, 2], "t": {"x": [1.5, 2.5], "n": 7, "pair": [1, "b"]},
        "budgets": {"draft": {"tokens": 10, "body_params": 5, "paper_tokens": 100, "fraction": 0.1,
                              "paper_seconds": None}}}
    assert results.recorded()["a"] == 2


def test_record_refuses_what_json_cannot_hold(tmp_path, monkeypatch):
    monkeypatch.setenv(results.RESULTS_FILE_ENV, str(tmp_path / "r.json"))
    with pytest.raises(TypeError, match=r"cfg\['path'\]: cannot record a PosixPath"):
        results.record("cfg", {"path": tmp_path})
    with pytest.raises(TypeError, match="dict keys must be str"):
        results.record("m", {1: 2})
    assert not (tmp_path / "r.json").exists()


def test_without_runner_results_stay_in_memory(monkeypatch):
    monkeypatch.delenv(results.RESULTS_FILE_ENV, raising=False)
    monkeypatch.delenv(results.RUN_RESULTS_ENV, raising=False)
    results.record("interactive_key", 1.25)
    assert results.recorded()["interactive_key"] == 1.25
    assert results.run_results() == {}


# ---------------------------------------------------------------------------- running

def test_bad_params_exit_nonzero_before_any_kernel_starts(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("notebooks:\n  01_record:\n    nn: 4\n")
    out = tmp_path / "out"
    assert cli.main(["run", "--params", str(bad), "--notebooks", str(SERIES), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "notebooks.01_record.nn: not a parameter of 01_record (did you mean 'n'?)" in err
    assert "allowed: n, scale, label, device" in err
    assert not out.exists()


def test_check_validates_without_running(capsys):
    rc = cli.main(["check", "--params", str(FIXTURES / "params.yaml"), "--notebooks", str(SERIES)])
    assert rc == 0
    assert "01_record: {'device': 'fixture-device', 'n': 4, 'scale': 0.5" in capsys.readouterr().out


def test_run_executes_in_order_injects_params_and_merges_results(fixture_run):
    rc, out, printed = fixture_run
    assert rc == 1  # 03_fail fails on purpose
    lines = printed.splitlines()
    assert lines[0].startswith("plan: 4 notebooks")  # the plan comes first (tests/workbook/test_plan.py)
    lines = [line for line in lines if line.startswith("[")]
    assert lines[0].startswith("[1/4] 01_record ok in ") and lines[0].endswith(" s (plan 8 s)")
    assert lines[1].startswith("[2/4] 02_consume ok in ")
    merged = json.loads((out / "results.json").read_text())
    assert merged["01_record"] == {"label": "from-params", "n": 4, "values": [0.0, 0.5, 1.0, 1.5], "mean": 0.75}
    assert merged["02_consume"] == {"seen_mean": 0.75, "device": "fixture-device"}  # read via run_results()
    run = json.loads((out / "run.json").read_text())
    assert run["notebooks"]["01_record"]["parameters"] == {"device": "fixture-device", "n": 4, "scale": 0.5,
                                                           "label": "from-params"}
    assert run["notebooks"]["01_record"]["seconds"] > 0


def test_failing_notebook_stops_the_run_and_its_report_shows_the_error(fixture_run):
    rc, out, printed = fixture_run
    assert rc == 1
    assert "[3/4] 03_fail failed in" in printed and "ValueError: deliberate failure" in printed
    assert "[4/4]" not in printed  # planned (the plan lists it), never started
    assert [line for line in printed.splitlines() if line.startswith("  04_after_failure ")][-1].split() == [
        "04_after_failure", "skipped", "-", "8.0", "s"]  # the summary's row
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "failed"
    assert run["notebooks"]["03_fail"]["error"] == "ValueError: deliberate failure in a fixture notebook"
    assert run["notebooks"]["04_after_failure"]["status"] == "skipped"
    assert not (out / "04_after_failure.ipynb").exists()
    report = (out / "03_fail.html").read_text()
    assert "deliberate failure in a fixture notebook" in report and "about to fail" in report


#: Python's warning filters when neither -W nor PYTHONWARNINGS sets any (the docs' "Default Warning
#: Filter"), the last one applied first: what `spire run` started from a shell shows.
SHELL_WARNING_FILTERS = [("ignore", DeprecationWarning, ""), ("ignore", PendingDeprecationWarning, ""),
                         ("ignore", ImportWarning, ""), ("ignore", ResourceWarning, ""),
                         ("default", DeprecationWarning, "__main__")]
#: A line of the notebook stack's warnings: Python's ("...: MissingIDFieldWarning: ...", "RuntimeWarning"),
#: logging's ("WARNING:papermill:Passed unknown parameter: x", as `as_from_a_shell` writes records) and
#: tornado's and the Jupyter applications' ("[W 2025-01-01 12:00:00.000 ServerApp] ...").
WARNING_LINE = re.compile(r"\w+Warning\b|\bWARNING\b|^\[W[ \d]")


class _Records(logging.Handler):
    def __init__(self, into: list[str]):
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(f"{record.levelname}:{record.name}:{record.getMessage()}")


@contextlib.contextmanager
def as_from_a_shell():
    """What this process would print, besides its own writes, run from a shell, where pytest records it
    instead: the warnings Python's default filters show, and the log records of WARNING and above that
    logging's last-resort handler prints (nothing configures logging without --log-output; papermill
    warns of an unknown parameter so). Yields a list of those lines, complete once the block is left."""
    shown: list[str] = []
    handler = _Records(shown)
    logging.getLogger().addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.resetwarnings()
            for action, category, module in SHELL_WARNING_FILTERS:
                warnings.filterwarnings(action, category=category, module=module)
            yield shown
    finally:
        logging.getLogger().removeHandler(handler)
        shown += [warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught]


@pytest.fixture(scope="module")
def rerun(fixture_run, tmp_path_factory):
    """The fixture run's folder copied, then 01 and 02 run again into it (`--only`, with a cache of its
    own): a series of two notebooks that succeeds, with a plain progress line for every record its
    kernels feed.
    Returns (exit code, output folder, what reached the terminal (what this process would print from a
    shell included: `as_from_a_shell`), the signals sent to its kernels, each index.html as written)."""
    _, out, _ = fixture_run
    again = tmp_path_factory.mktemp("rerun") / "again"
    shutil.copytree(out, again)
    signals, send_signal = [], LocalProvisioner.send_signal
    indexes, write_index = [], report.write_index

    async def record_signal(self, signum):
        signals.append(signum)
        await send_signal(self, signum)

    def keep_index(*args, **kwargs):
        path = write_index(*args, **kwargs)
        indexes.append(path.read_text())
        return path

    with pytest.MonkeyPatch.context() as m, terminal_output() as terminal, as_from_a_shell() as shell, \
            own_cache(again.with_name("cache")):
        m.setattr(progress, "PLAIN_INTERVAL_S", 0.0)
        m.setattr(LocalProvisioner, "send_signal", record_signal)
        m.setattr(report, "write_index", keep_index)
        rc = cli.main(["run", "--params", str(FIXTURES / "params.yaml"), "--notebooks", str(SERIES),
                       "--out", str(again), "--only", "01,02"])
    return rc, again, terminal[0] + "".join(line if line.endswith("\n") else line + "\n" for line in shell), \
        signals, indexes


def test_only_rerun_keeps_earlier_results_of_the_same_output_folder(rerun):
    rc, again, terminal, *_ = rerun
    assert rc == 0, terminal
    run = json.loads((again / "run.json").read_text())
    assert run["status"] == "ok" and run["notebooks"]["03_fail"]["status"] == "failed"
    assert json.loads((again / "results.json").read_text())["02_consume"]["seen_mean"] == 0.75


def test_a_successful_series_leaves_no_error_line_on_the_terminal(rerun):
    """Every kernel ends cleanly: no "[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel" nor
    any other ERROR line, kernels' writes included. That line is ipykernel's report of the SIGINT
    jupyter_client sends before every shutdown when it lands while a handler runs (a race: it did not
    show on a loaded 2-core VM), so no kernel of a finished notebook gets a SIGINT; and a shutdown
    request races too (tornado's "ZMQError: Socket operation on non-socket", seen once in a clean
    clone's CI run), so each finished kernel is killed with its process group (`execute.SHUTDOWN`)."""
    rc, _, terminal, signals, _ = rerun
    assert rc == 0
    assert signals == [signal.SIGKILL, signal.SIGKILL], signals  # 01's kernel, 02's: no SIGINT, no request
    assert "[2/2] 02_consume ok in " in terminal  # the whole run reached the terminal
    assert not [line for line in terminal.splitlines() if "ERROR" in line], terminal


def test_a_successful_series_leaves_no_warning_line_on_the_terminal(rerun):
    """Nothing of the notebook stack warns on the terminal: not nbformat (MissingIDFieldWarning),
    papermill (an unknown parameter), jupyter_client, zmq or tornado (DeprecationWarning, a "[W ...]"
    log line), nor a RuntimeWarning, from the runner's process (as it would print them run from a
    shell) or its kernels."""
    rc, _, terminal, _, _ = rerun
    assert rc == 0 and "[2/2] 02_consume ok in " in terminal
    assert not [line for line in terminal.splitlines() if WARNING_LINE.search(line)], terminal


def test_the_index_is_written_before_the_first_notebook_and_as_each_starts(rerun):
    """Its path printed after the plan and before the first notebook; then index.html marks this run's
    notebooks "not yet run", then "running" one by one (the folder's earlier 03 stays failed); the last
    one written is the run as it ended."""
    _, again, terminal, _, indexes = rerun
    lines = terminal.splitlines()
    said = lines.index(f"index: {again / 'index.html'} (rewritten as each notebook starts and when the run ends)")
    assert said < next(i for i, line in enumerate(lines) if line.startswith("[1/2] 01_record"))
    assert said > next(i for i, line in enumerate(lines) if line.startswith("plan: 2 notebooks"))
    start, first, second, final = indexes  # before 01, as 01 starts, as 02 starts, at the end
    assert "<p class='live'>0 of 2 notebooks done.\nThe plan has " in start
    assert "<td>01_record</td><td class='pending'>not yet run</td>" in start
    assert "<td>02_consume</td><td class='pending'>not yet run</td>" in start
    assert "<a href='03_fail.html'>03_fail</a></td><td class='failed'>failed</td>" in start
    assert "Claims not compared" not in start and "Claims not compared" in final  # compared once the run ends
    assert "<p class='live'>0 of 2 notebooks done; 01_record running since " in first
    assert "<td>01_record</td><td class='running'>running</td><td class='num'>since " in first
    assert "<p class='live'>1 of 2 notebooks done; 02_consume running since " in second
    assert "<a href='01_record.html'>01_record</a></td><td class='ok'>ok</td>" in second
    assert "<td>02_consume</td><td class='running'>running</td>" in second
    assert final == (again / "index.html").read_text() and "class='live'" not in final and "refresh" not in final
    assert "<a href='02_consume.html'>02_consume</a></td><td class='ok'>ok</td>" in final
    assert not (again / "index.html.tmp").exists()


def test_a_kernels_progress_reaches_the_terminal_and_not_the_report(rerun):
    """01's progress bar, fed through the side channel: its last state as a plain line (no TTY) under
    the notebook's header, then the notebook's outcome on a line of its own; the report has none of it."""
    _, again, terminal, *_ = rerun
    lines = terminal.splitlines()
    fed = [line for line in lines if line.startswith("[1/2] 01_record: fixture loop ")]
    assert fed and fed[-1].startswith("[1/2] 01_record: fixture loop 4/4 step, "), terminal
    assert " tokens/s, " in fed[-1] and " elapsed" in fed[-1]
    outcome = next(i for i, line in enumerate(lines) if line.startswith("[1/2] 01_record ok in "))
    assert outcome > lines.index(fed[-1])
    assert not re.search(r"fixture loop: |\d+/\d+ \[", (again / "01_record.html").read_text())  # tqdm's own line
    cell = next(c for c in json.loads((again / "01_record.ipynb").read_text())["cells"]
                if "progress_bar(" in "".join(c["source"]))
    assert cell["outputs"] == []


def test_a_run_ends_with_its_summary_table(rerun):
    """After the last notebook: each notebook of this run with its status, time, planned time and
    report, the run's totals, then the index."""
    _, again, terminal, *_ = rerun
    lines = terminal.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split() == ["notebook", "status", "time", "plan", "report"])
    rows = [line.split() for line in lines[head + 1 : head + 4]]
    assert [r[:2] for r in rows[:2]] == [["01_record", "ok"], ["02_consume", "ok"]]
    # each notebook's plan: a numpy notebook's fixed 8 s, or what the fixture run before measured of it
    planned = {nb: entry["planned_s"] for nb, entry in json.loads((again / "run.json").read_text())["notebooks"].items()}
    assert rows[0][-1].endswith("01_record.html") and rows[0][-3:-1] == duration(planned["01_record"]).split()
    total = planned["01_record"] + planned["02_consume"]
    assert rows[2][:2] == ["the", "run"] and rows[2][-2:] == duration(total).split()
    assert lines[head + 4] == f"reports: {again / 'index.html'}"


@pytest.mark.parametrize("params_file", sorted((ROOT / "params").glob("*.yaml")), ids=lambda p: p.name)
def test_injected_parameters_read_as_a_block(params_file):
    """What papermill writes into a report's injected cell, for every notebook of every committed
    params file: no line over 120 characters, and the cell evaluates to exactly the parameters."""
    from papermill.translators import papermill_translators

    translator = papermill_translators.find_translator("python3", "python")
    params = runner.load_params(params_file)
    values = {"series": params["series"], **params["shared"]}
    for section in params["notebooks"].values():
        values.update(section)
    code = translator.codify(values)
    too_long = [line for line in code.splitlines() if len(line) > execute.INJECTED_WIDTH]
    assert not too_long, f"{len(too_long)} injected lines over {execute.INJECTED_WIDTH} characters: {too_long[0]}"
    namespace = {}
    exec(code, namespace)  # noqa: S102 - our own literal, checked to round-trip
    assert {k: namespace[k] for k in values} == values
    if len(str(params["series"])) > execute.INJECTED_WIDTH:  # a long series section spans lines: a block
        assert code.splitlines()[1] == "series = {"


def test_python_literal_breaks_only_what_does_not_fit():
    value = {"a": [1, 2], "b": {"c": "x" * 30, "d": {"e": 1.5, "f": None, "g": True}}}
    assert execute.python_literal(value) == ('{"a": [1, 2], "b": {"c": "' + "x" * 30
                                            + '", "d": {"e": 1.5, "f": None, "g": True}}}')
    assert execute.python_literal(value, width=50) == (
        '{\n    "a": [1, 2],\n    "b": {\n        "c": "' + "x" * 30 + '",\n'
        '        "d": {"e": 1.5, "f": None, "g": True},\n    },\n}')
