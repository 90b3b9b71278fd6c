"""HTML reports: offline plotly, harmless widgets, the run index, and a real headless browser."""

from __future__ import annotations

import base64
import datetime
import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import plotly.graph_objects as go
import plotly.offline
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from spirelib import paths
from spirelib.workbook import report


def notebook_with(*outputs, markdown="# title"):
    cell = new_code_cell("x", outputs=list(outputs))
    return new_notebook(cells=[new_markdown_cell(markdown), cell], metadata={"widgets": {"state": {}}})


def test_plotly_outputs_become_html_that_draws_them_and_widgets_become_text():
    fig = go.Figure(go.Bar(x=["a", "b"], y=[1, 2], name="bars"))
    nb = notebook_with(new_output("display_data", {report.PLOTLY_MIME: fig.to_plotly_json()}),
                       new_output("display_data", {report.WIDGET_VIEW_MIME: {"model_id": "m"},
                                                   "text/plain": "IntSlider(value=3)"}))
    static, figures = report.offline_outputs(nb)
    assert figures == 1
    first, second = static.cells[1].outputs
    assert list(first.data) == ["text/html"]
    assert "Plotly.newPlot" in first.data["text/html"] and '"bars"' in first.data["text/html"]
    assert "<script src" not in first.data["text/html"]  # plotly.js comes from the page head, once
    assert second.data == {"text/plain": "[interactive widget; open the notebook in JupyterLab] IntSlider(value=3)"}
    assert "widgets" not in static.metadata
    assert report.PLOTLY_MIME in nb.cells[1].outputs[0].data  # the input notebook is untouched


def test_exported_report_loads_one_local_plotly_js_and_nothing_from_a_cdn(fixture_run):
    _, out, _ = fixture_run
    page = (out / "01_record.html").read_text()
    assert page.count('<script src="plotly.min.js"></script>') == 1
    assert (out / "plotly.min.js").read_text() == plotly.offline.get_plotlyjs()
    for remote in ("cdn.plot.ly", "require.js", "mathjax", "unpkg.com", "embed-amd", report.WIDGET_VIEW_MIME):
        assert remote not in page.lower(), remote
    assert "[interactive widget; open the notebook in JupyterLab] IntSlider(value=4" in page
    assert '<script src="plotly.min.js">' not in (out / "02_consume.html").read_text()  # no figure, no plotly.js


def plain_text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def test_report_shows_the_injected_parameters_not_the_notebook_defaults(fixture_run):
    _, out, _ = fixture_run
    text = plain_text((out / "01_record.html").read_text())
    assert 'label = "from-params"' in text  # papermill's injected-parameters cell
    assert 'label: str = "default"' not in text  # the notebook's own parameters cell is left out
    nb = nbformat.read(out / "01_record.ipynb", as_version=4)
    assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells)  # the notebook itself keeps it


def test_long_lines_wrap_and_missing_plotly_js_is_said_in_words(fixture_run):
    _, out, _ = fixture_run
    page = (out / "01_record.html").read_text()
    assert "white-space: pre-wrap" in page
    fallback = page[page.index('<div class="plotly-fallback">'):]
    assert "Figure: fixture figure" in fallback[:400] and "plotly.min.js" in fallback[:400]
    assert "document.querySelectorAll('.plotly-fallback').forEach(e => e.remove())" in page


def test_executed_notebook_keeps_a_static_rendering_of_each_figure(fixture_run):
    _, out, _ = fixture_run
    nb = nbformat.read(out / "01_record.ipynb", as_version=4)
    figures = [o for c in nb.cells for o in c.get("outputs", []) if report.PLOTLY_MIME in o.get("data", {})]
    assert len(figures) == 1
    data = figures[0].data
    assert data["text/plain"].startswith("[plotly figure: fixture figure;")  # GitHub shows at least this
    if report._png_renderer() is not None:  # kaleido and a chromium: a picture too
        assert base64.b64decode(data["image/png"])[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.add_static_figures(nb) == 0  # exporting again changes nothing


def test_mathjax_only_for_reports_with_latex(tmp_path):
    path = tmp_path / "m.ipynb"
    nbformat.write(notebook_with(markdown="throughput multiplier $TM = \\tau / \\Delta t$"), path)
    assert "mathjax" in report.export_html(path, tmp_path / "m.html").read_text().lower()


def test_index_links_reports_and_shows_status_params_and_results(fixture_run):
    _, out, _ = fixture_run
    index = (out / "index.html").read_text()
    for stem in ("01_record", "02_consume", "03_fail"):
        assert f"<a href='{stem}.html'>{stem}</a>" in index
    assert "04_after_failure</td><td class='skipped'>skipped" in index
    assert "ValueError: deliberate failure in a fixture notebook" in index
    assert "label: from-params" in index  # the params file as YAML, folded
    assert index.index("<h2>Parameters</h2>\n<details>") < index.index("label: from-params")
    assert "<a href='results.json'>results.json</a>" in index  # raw results behind a link, not inline
    assert "seen_mean" not in index and "01_record (4)" in index


def test_index_sections_are_extendable():
    def findings(run, results):
        return f"<h2>Findings</h2><p>{len(results)} notebooks</p>"
    page = report.render_index({"status": "ok"}, {"a": {"x": 1}}, report.INDEX_SECTIONS + [findings])
    assert page.index("Raw results") < page.index("<h2>Findings</h2><p>1 notebooks</p>")


def _chromium() -> str | None:
    return os.environ.get("SPIRE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="chromium not installed (apt-get install chromium; .ci/run does)")
def test_plotly_figure_is_drawn_by_a_real_browser_offline(fixture_run, tmp_path):
    _, out, _ = fixture_run
    url = Path(out / "01_record.html").resolve().as_uri()
    proc = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--virtual-time-budget=10000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120)
    dom = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'class="main-svg"' in dom  # plotly.js ran and drew the figure
    assert 'class="trace scatter' in dom and "fixture figure" in dom


def test_a_report_leads_with_what_its_conclusion_cells_say(tmp_path):
    nb = new_notebook(cells=[
        new_markdown_cell("# 09 · A notebook"),
        new_code_cell("evidence()", outputs=[new_output("stream", name="stdout", text="a long table of timings\n")]),
        new_code_cell("conclude()", metadata={"tags": ["conclusion"]}, outputs=[
            new_output("display_data", data={"text/markdown": "**SD was slower than AD in 15 of 18 cells.**"}),
            new_output("stream", name="stdout", text="3 of 6 parts are resolved at this scale\n")]),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "09_a.ipynb"
    nbformat.write(nb, path)
    page = report.export_html(path, tmp_path / "09_a.html").read_text()
    conclusion, evidence = page.index("SD was slower than AD in 15 of 18 cells"), page.index("a long table of timings")
    assert page.index("What this run shows") < conclusion < evidence
    assert page.index("3 of 6 parts are resolved") < evidence
    assert report.conclusion_cell(nbformat.read(path, as_version=4)).cell_type == "markdown"


# ---------------------------------------------------------------------------- the index while the run runs

NOW = datetime.datetime(2026, 5, 4, 14, 10, 0)  # when a live index below is written


def run_record(status: str = "running", **notebooks) -> dict:
    """A run's record (run.json) as the runner keeps it: started at 14:00, these notebooks in order."""
    return {"params_file": "p.yaml", "status": status, "started": "2026-05-04T14:00:00",
            "finished": None if status == "running" else "2026-05-04T14:30:00", "params": {}, "notebooks": notebooks}


def entry(status: str, planned: float | None = 60.0, at_tau_1: float | None = None, **more) -> dict:
    """One notebook's entry of the record: its status, the plan's seconds (a range up to `at_tau_1`)."""
    return {"status": status, "parameters": {}, "planned_s": planned,
            "planned_at_tau_1_s": planned if at_tau_1 is None else at_tau_1, **more}


def index_at(run: dict, results: dict | None = None, now: datetime.datetime = NOW, sections=None) -> str:
    return report.render_index(run, results or {}, sections or report.INDEX_SECTIONS, now)


def test_the_index_before_the_first_notebook_says_none_ran_and_when_the_plan_ends():
    page = index_at(run_record(**{"01_a": entry("pending", 60.0), "02_b": entry("pending", 120.0),
                                  "03_c": entry("pending", 600.0)}))
    assert "<p class='live'>0 of 3 notebooks done.\nThe plan has 13.0 min left: the run ends about 14:23." in page
    for stem in ("01_a", "02_b", "03_c"):
        assert f"<td>{stem}</td><td class='pending'>not yet run</td><td class='num'></td>" in page
    assert "This page was written at 14:10:00, is rewritten as each notebook starts" in page
    assert f"<meta http-equiv='refresh' content='{report.LIVE_RELOAD_S}'>" in page  # a browser follows the run


def test_mid_run_the_index_shows_what_ran_what_runs_and_what_the_plan_has_left():
    """01 ran; 02 runs since 14:09 (60 s of its 120 planned, so 60 s left); 03 waits, priced 600 s to
    900 s (decoding at tau 1): 11 to 16 min left at 14:10."""
    run = run_record(**{"01_a": entry("ok", 60.0, started="2026-05-04T14:00:00", seconds=50.0, html="01_a.html"),
                        "02_b": entry("running", 120.0, started="2026-05-04T14:09:00"),
                        "03_c": entry("pending", 600.0, 900.0)})
    page = index_at(run, {"01_a": {"x": 1}})
    assert ("<p class='live'>1 of 3 notebooks done; 02_b running since 14:09:00.\n"
            "The plan has 11.0 - 16.0 min left: the run ends about 14:21 - 14:26.") in page
    assert "<a href='01_a.html'>01_a</a></td><td class='ok'>ok</td><td class='num'>50.0 s</td>" in page
    assert "<td>02_b</td><td class='running'>running</td><td class='num'>since 14:09:00</td>" in page
    assert "<td>03_c</td><td class='pending'>not yet run</td>" in page
    late = index_at(run, now=NOW + datetime.timedelta(minutes=5))  # 02 past its plan: only 03 is left
    assert "The plan has 10.0 - 15.0 min left: the run ends about 14:25 - 14:30." in late


def test_a_failed_notebook_shows_as_failed_while_the_run_closes_and_after():
    notebooks = {"01_a": entry("ok", started="2026-05-04T14:00:00", seconds=50.0),
                 "02_b": entry("failed", started="2026-05-04T14:01:00", seconds=3.0, error="ValueError: boom")}
    closing = index_at(run_record(**notebooks, **{"03_c": entry("pending")}))
    assert "2 of 3 notebooks done." in closing
    assert "<td>02_b</td><td class='failed'>failed</td><td class='num'>3.0 s</td>" in closing
    assert "ValueError: boom" in closing
    final = index_at(run_record("failed", **notebooks, **{"03_c": entry("skipped", error="not run")}))
    assert "<td>02_b</td><td class='failed'>failed</td>" in final and "<td class='skipped'>skipped</td>" in final
    assert "class='live'" not in final and "not yet run" not in final


def test_notebooks_of_an_earlier_run_in_the_folder_do_not_count_and_a_dry_run_has_no_plan():
    """With --only the record keeps the folder's other notebooks, started before this run (or never)."""
    run = run_record(**{"01_a": entry("ok", started="2026-05-03T09:00:00", seconds=5.0),
                        "02_b": entry("pending", None), "03_c": entry("skipped", error="not run")})
    page = index_at(run)
    assert "<p class='live'>0 of 1 notebook done.\nNo plan times this run (a dry run)." in page
    assert "<td>01_a</td><td class='ok'>ok</td>" in page


def test_mid_run_a_section_the_results_cannot_fill_yet_is_left_out_not_the_run_stopped():
    def broken_section(run, results):
        raise KeyError("04_measure_tau")
    sections = [broken_section, report.reports_section]
    page = index_at(run_record(**{"01_a": entry("pending")}), sections=sections)
    assert "Left out until the run ends: broken." in page and "<h2>Reports</h2>" in page
    with pytest.raises(KeyError):  # the final index hides nothing
        index_at(run_record("ok", **{"01_a": entry("ok", seconds=1.0)}), sections=sections)


def test_the_final_index_is_the_run_as_it_ended_written_atomically(tmp_path, monkeypatch):
    """A finished run's index has no trace of the live one and does not depend on when it is written;
    `write_index` renames a file written beside it over index.html (a reloading browser never reads
    half a page)."""
    run = run_record("ok", **{"01_a": entry("ok", started="2026-05-04T14:00:00", seconds=50.0, html="01_a.html")})
    page = index_at(run, {"01_a": {"x": 1}})
    assert page == index_at(run, {"01_a": {"x": 1}}, now=NOW + datetime.timedelta(days=1))
    assert "refresh" not in page and "class='live'" not in page and "not yet run" not in page
    (tmp_path / "run.json").write_text(json.dumps(run))
    (tmp_path / "results.json").write_text(json.dumps({"01_a": {"x": 1}}))
    replaced = []
    monkeypatch.setattr(paths.os, "replace", lambda src, dst: replaced.append((Path(src), Path(dst))) or
                        os.rename(src, dst))
    path = report.write_index(tmp_path)
    assert path.read_text() == page and [dst for _, dst in replaced] == [path]  # `paths.write_atomically`
    assert replaced[0][0].parent == tmp_path and replaced[0][0].name.startswith("index.html.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.html", "results.json", "run.json"]
