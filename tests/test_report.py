"""HTML reports: offline plotly, harmless widgets, the run index, and a real headless browser."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import nbformat
import plotly.graph_objects as go
import plotly.offline
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from spirelib import report


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
    assert "label: from-params" in index  # the params file as YAML
    assert "<th>seen_mean</th><td><span class='num'>0.75</span>" in index
    assert "[<span class='num'>0</span>, <span class='num'>0.5</span>" in index


def test_index_sections_are_extendable():
    def findings(run, results):
        return f"<h2>Findings</h2><p>{len(results)} notebooks</p>"
    page = report.render_index({"status": "ok"}, {"a": {"x": 1}}, report.INDEX_SECTIONS + [findings])
    assert page.index("Recorded results") < page.index("<h2>Findings</h2><p>1 notebooks</p>")


def test_render_value_escapes_and_folds_long_lists():
    assert report.render_value("<b>") == "&lt;b&gt;"
    assert report.render_value(1 / 3) == "<span class='num'>0.333333</span>"
    assert report.render_value(list(range(100))).startswith("<details><summary>list of 100</summary>")


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
