"""HTML reports of executed notebooks that work offline, and the run's index page.

Notebooks show figures with `fig.show()`; in a kernel plotly emits the
`application/vnd.plotly.v1+json` mimetype, which nbconvert cannot render. `export_html`
turns each such output into a div drawn by `Plotly.newPlot`, using one local `plotly.min.js`
(from the installed plotly package) written next to the reports: no CDN, no network.
Where plotly.js does not load (the report opened without its `plotly.min.js`), each figure
says so in words instead of leaving empty space. ipywidgets views have no static rendering:
they become a short text note. The page loads no require.js (it would capture plotly.js as an
AMD module) and no widget manager. The notebook's own default parameters cell (tagged
`parameters`) is left out where papermill injected the run's (`injected-parameters`), so a
reader sees only the values the run used; long code and output lines wrap.

`export_html` also gives every plotly output of the executed .ipynb a static rendering, so
GitHub and nbviewer show the figures: a PNG (kaleido, driving the installed Chromium; no
browser download) where one can be made, and always a line of text naming the figure.
MathJax (from a CDN) is loaded only by reports whose markdown has LaTeX: online it is typeset,
offline it shows as TeX source.

`write_index` builds `index.html` from the run's `run.json` and `results.json`; its content
is the list `INDEX_SECTIONS` of small functions, each rendering one section: the verdict and
what was (not) reproduced first, then the reports, the details, the parameters (folded) and a
link to the raw results.json.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import copy
import html
import json
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import plotly.io as pio
import plotly.offline
import yaml
from jinja2 import DictLoader
from nbconvert import HTMLExporter

from spirelib.workbook.deploy import index_section as schedules_section
from spirelib.workbook.findings import escape, findings_section, verdict_section

PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
PLOTLY_JS = "plotly.min.js"

_TEMPLATE = """\
{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}
{%- if resources.plotly_js -%}<script src="{{ resources.plotly_js }}"></script>{%- endif -%}
{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}
{%- if resources.has_math -%}{{ super() }}{%- endif -%}
{%- endblock html_head_js_mathjax -%}
{%- block extra_css -%}
<style>
.jp-InputArea-editor pre, .jp-RenderedText pre, .jp-OutputArea-output pre, .highlight pre {
  white-space: pre-wrap; overflow-wrap: anywhere; }
.jp-RenderedMarkdown table { display: block; overflow-x: auto; }
.plotly-fallback { border: 1px dashed #999; color: #555; padding: 0.6em 1em; margin: 0.4em 0; }
</style>
{%- endblock extra_css -%}
{%- block footer_js -%}
<script>if (window.Plotly) { document.querySelectorAll('.plotly-fallback').forEach(e => e.remove()); }</script>
{%- endblock footer_js -%}
"""
PARAMETERS_TAG, INJECTED_TAG = "parameters", "injected-parameters"
CONCLUSION_TAG = "conclusion"  # cells whose text output a report shows first, under its title
PNG_SIZE = (960, 540)  # default size of a static figure; a figure's own layout height wins


# ---------------------------------------------------------------------------- notebook reports

def offline_outputs(nb: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, int]:
    """A copy of `nb` whose outputs render statically, without the default parameters cell
    where papermill injected the run's; also the number of plotly figures."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    nb.cells = [c for c in nb.cells if c.cell_type == "markdown" or not _drop_parameters_cell(nb, c)]
    conclusion = conclusion_cell(nb)
    if conclusion is not None:  # a report leads with its conclusion, in words, before the evidence
        nb.cells.insert(1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0, conclusion)
    figures = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if PLOTLY_MIME in data:
                output["data"] = {"text/html": figure_html(data[PLOTLY_MIME])}
                figures += 1
            elif WIDGET_VIEW_MIME in data:
                text = data.get("text/plain", "")
                output["data"] = {"text/plain": f"[interactive widget; open the notebook in JupyterLab] {text}"}
    return nb, figures


def conclusion_cell(nb: nbformat.NotebookNode):
    """A markdown cell with what the cells tagged `conclusion` printed or displayed as text
    (their figures stay where they are), or None: the report shows it under the title."""
    parts = []
    for cell in nb.cells:
        if CONCLUSION_TAG not in _tags(cell):
            continue
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "text/markdown" in data:
                parts.append("".join(data["text/markdown"]))
            elif output.get("output_type") == "stream" and output.get("name") == "stdout":
                parts.append("".join(output.get("text", "")).strip())
    if not parts:
        return None
    return nbformat.v4.new_markdown_cell("### What this run shows\n\n" + "\n\n".join(parts)
                                         + "\n\n*(computed at the end of this notebook; the evidence follows)*")


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _drop_parameters_cell(nb: nbformat.NotebookNode, cell) -> bool:
    injected = any(INJECTED_TAG in _tags(c) for c in nb.cells)
    return injected and PARAMETERS_TAG in _tags(cell)


def figure_title(figure: dict) -> str:
    """The title text of a plotly figure (JSON), without markup; "" if it has none."""
    title = (figure.get("layout") or {}).get("title")
    text = title.get("text", "") if isinstance(title, dict) else (title or "")
    return re.sub(r"<[^>]+>", " ", str(text)).replace("  ", " ").strip()


def has_math(nb: nbformat.NotebookNode) -> bool:
    """Whether any markdown cell has LaTeX delimiters ($, \\( or \\[)."""
    return any(c.cell_type == "markdown" and any(d in c.source for d in ("$", "\\(", "\\["))
               for c in nb.cells)


def figure_html(figure: dict) -> str:
    """A div and script drawing `figure` (plotly's JSON) with an already loaded plotly.js."""
    figure = dict(figure)
    config = figure.pop("config", None)
    title = figure_title(figure)
    fallback = (f"<div class='plotly-fallback'>Figure{': ' + html.escape(title) if title else ''}. "
                f"It is drawn by plotly.js, which did not load: keep <code>{PLOTLY_JS}</code> next to this "
                "report (the run writes it there), or open the notebook in JupyterLab.</div>")
    return fallback + pio.to_html(figure, config=config, include_plotlyjs=False, full_html=False, validate=False)


def timing_note(seconds: float, planned: float | None, machine: str | None) -> str:
    """A report's last words: how long its notebook ran against the run's plan (`spirelib.workbook.plan`)."""
    ran = f"This notebook ran in {seconds:.0f} s"
    if planned is None:
        return ran + " (no plan was made: a dry run)."
    ratio = f", {seconds / planned:.2f}x the plan" if planned > 0 else ""
    return f"{ran}; the run's plan predicted {planned:.0f} s{ratio} ({machine})."


def export_html(notebook: Path, html_path: Path, note: str | None = None) -> Path:
    """Export an executed notebook to `html_path`, writing plotly.js beside it if needed; `note`
    (Markdown) closes the report (the measured time against the plan)."""
    executed = nbformat.read(notebook, as_version=4)
    if add_static_figures(executed):
        nbformat.write(executed, notebook)
    nb, figures = offline_outputs(executed)
    if note:
        nb.cells.append(nbformat.v4.new_markdown_cell(note))
    exporter = HTMLExporter(template_name="lab", extra_loaders=[DictLoader({"spire_report.j2": _TEMPLATE})],
                            template_file="spire_report.j2")
    resources = {"metadata": {"name": Path(notebook).stem}, "plotly_js": PLOTLY_JS if figures else "",
                 "has_math": has_math(nb)}
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    if figures:
        write_plotly_js(html_path.parent)
    html_path.write_text(body, encoding="utf-8")
    return html_path


def add_static_figures(nb: nbformat.NotebookNode) -> int:
    """Give every plotly output of `nb` (in place) a text line naming the figure and, where
    kaleido and a Chromium are installed, a PNG; returns how many outputs changed. One kaleido
    browser serves every notebook of the process (started on first use, stopped at exit)."""
    outputs = [o for c in nb.cells for o in c.get("outputs", []) if PLOTLY_MIME in o.get("data", {})]
    todo = [o for o in outputs if "text/plain" not in o["data"]]
    if not todo:
        return 0
    render = _png_renderer()
    for output in todo:
        figure = output["data"][PLOTLY_MIME]
        title = figure_title(figure)
        output["data"]["text/plain"] = (f"[plotly figure{': ' + title if title else ''}; interactive in "
                                        "the HTML report and in JupyterLab]")
        png = render(figure) if render else None
        if png:
            output["data"]["image/png"] = png
    return len(todo)


class _PngRenderer:
    """Plotly figures to base64 PNGs through one kaleido browser session."""

    def __init__(self, kaleido):
        self.kaleido = kaleido
        kaleido.start_sync_server(silence_warnings=True)
        atexit.register(self.close)

    def __call__(self, figure: dict) -> str | None:
        figure = {k: v for k, v in figure.items() if k != "config"}
        height = (figure.get("layout") or {}).get("height") or PNG_SIZE[1]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "kopts is ignored if using a server"
                png = pio.to_image(figure, format="png", width=PNG_SIZE[0], height=height, validate=False)
        except Exception:  # noqa: BLE001 - a figure kaleido can not draw keeps its text line
            return None
        return base64.b64encode(png).decode("ascii")

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already stopped
            self.kaleido.stop_sync_server(silence_warnings=True)


_RENDERER: list = []  # [renderer or None] once looked for


def _png_renderer() -> _PngRenderer | None:
    """The PNG renderer, or None where kaleido or a Chromium for it is missing (it never downloads
    one) or `SPIRE_NO_PNG=1`."""
    if os.environ.get("SPIRE_NO_PNG") == "1":
        return None
    if not _RENDERER:
        try:
            import kaleido  # optional: text-only figures without it
            from choreographer.browsers.chromium import Chromium

            _RENDERER.append(_PngRenderer(kaleido) if Chromium.find_browser(skip_local=True) else None)
        except Exception:  # noqa: BLE001 - no kaleido, no browser, or an API change: text only
            _RENDERER.append(None)
    return _RENDERER[0]


def write_plotly_js(folder: Path) -> Path:
    """The installed plotly.js bundle as `folder/plotly.min.js` (rewritten only if it differs)."""
    path = folder / PLOTLY_JS
    bundle = plotly.offline.get_plotlyjs()
    if not path.is_file() or path.read_text(encoding="utf-8") != bundle:
        path.write_text(bundle, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- the run index

def write_index(out_dir: Path, sections: list[Callable[[dict, dict], str]] | None = None) -> Path:
    """Write `out_dir/index.html` from `run.json` and `results.json`; returns its path."""
    run = _read(out_dir / "run.json")
    results = _read(out_dir / "results.json")
    path = out_dir / "index.html"
    path.write_text(render_index(run, results, sections or INDEX_SECTIONS), encoding="utf-8")
    return path


def render_index(run: dict, results: dict, sections: list[Callable[[dict, dict], str]]) -> str:
    """The index page: a header, then each section function's HTML in order."""
    title = f"spire-workbook run: {html.escape(str(run.get('params_file', '?')))}"
    body = "\n".join(section(run, results) for section in sections)
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{title}</title>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<style>{_CSS}</style></head>\n<body><h1>{title}</h1>\n"
            f"<p>status <b class='{escape(run.get('status'))}'>{escape(run.get('status'))}</b>; "
            f"started {escape(run.get('started'))}, finished {escape(run.get('finished') or '-')}</p>\n"
            f"{body}\n</body></html>\n")


def reports_section(run: dict, results: dict) -> str:
    """One row per notebook: link to its report, status, elapsed time, error if any."""
    rows = []
    for stem, nb in run.get("notebooks", {}).items():
        link = f"<a href='{escape(nb['html'])}'>{escape(stem)}</a>" if nb.get("html") else escape(stem)
        seconds = f"{nb['seconds']:.1f} s" if nb.get("seconds") is not None else ""
        planned = f"{nb['planned_s']:.0f} s" if nb.get("planned_s") is not None else ""
        rows.append(f"<tr><td>{link}</td><td class='{escape(nb.get('status'))}'>{escape(nb.get('status'))}</td>"
                    f"<td class='num'>{seconds}</td><td class='num'>{planned}</td>"
                    f"<td>{escape(nb.get('error') or '')}</td></tr>")
    return ("<h2>Reports</h2>\n<table><tr><th>notebook</th><th>status</th><th>time</th><th>plan</th>"
            "<th>error</th></tr>\n"
            + "\n".join(rows) + "\n</table>")


def parameters_section(run: dict, results: dict) -> str:
    """The params file as loaded, and what was injected into each notebook (folded)."""
    rows = "\n".join(f"<tr><td>{escape(stem)}</td><td>{render_value(nb.get('parameters', {}))}</td></tr>"
                     for stem, nb in run.get("notebooks", {}).items())
    params = yaml.safe_dump(run.get("params", {}), sort_keys=False)
    return (f"<h2>Parameters</h2>\n<details><summary>from <code>{escape(run.get('params_file'))}</code> "
            f"(click to show)</summary>\n<pre>{escape(params)}</pre>\n<h3>Injected per notebook</h3>\n"
            f"<table><tr><th>notebook</th><th>parameters (others: the notebook's defaults)</th></tr>\n{rows}\n"
            "</table></details>")


def changed_claims_section(run: dict, results: dict) -> str:
    """The claims whose verdict changed since the previous run in this folder on the same params and
    machine (`spirelib.workbook.claims`), each before and after with its evidence now; a line saying
    the verdicts held, or why the runs were not compared."""
    compared = run.get("claims_compared") or {}
    changed = run.get("claims_changed")
    if not compared:
        return ""
    if changed is None:
        return f"<p class='aside'>Claims not compared with an earlier run: {escape(compared.get('why_not'))}.</p>"
    since = escape(compared.get("with"))
    if not changed:
        return f"<p class='aside'>Every verdict is the same as in the run of {since} in this folder.</p>"
    rows = "".join(f"<tr><td>{escape(c['claim'])}</td><td>{escape(c['before'] or '(not made)')}</td>"
                   f"<td><b>{escape(c['after'] or '(not made)')}</b></td><td>{escape(c['evidence'])}</td></tr>"
                   for c in changed)
    return (f"<h2 id='changed'>Changed since the run of {since}</h2>\n<p>{len(changed)} of this run's verdicts differ "
            "from the previous run in this folder, on the same params and machine: asked again, the workbook "
            "answered these differently.</p>\n<table><tr><th>claim</th><th>before</th><th>now</th>"
            f"<th>evidence now</th></tr>{rows}</table>")


def results_section(run: dict, results: dict) -> str:
    """A link to every result recorded with `spirelib.workbook.results.record` (results.json), and what it holds."""
    counts = ", ".join(f"{escape(stem)} ({len(values)})" for stem, values in results.items() if values)
    return ("<h2>Raw results</h2>\n<p>Every value the notebooks recorded, per notebook: "
            "<a href='results.json'>results.json</a>" + (f" &mdash; {counts}" if counts else " (none recorded)")
            + ".</p>")


INDEX_SECTIONS: list[Callable[[dict, dict], str]] = [verdict_section, changed_claims_section, schedules_section,
                                                     reports_section, findings_section, parameters_section,
                                                     results_section]


def render_value(value: Any, max_items: int = 12) -> str:
    """Readable HTML for a JSON value: dicts as key/value tables, short lists inline."""
    if isinstance(value, dict):
        if not value:
            return "<i>(none)</i>"
        rows = "".join(f"<tr><th>{escape(k)}</th><td>{render_value(v, max_items)}</td></tr>" for k, v in value.items())
        return f"<table class='kv'>{rows}</table>"
    if isinstance(value, list):
        if len(value) <= max_items and all(not isinstance(v, (dict, list)) for v in value):
            return "[" + ", ".join(render_value(v) for v in value) + "]"
        shown = escape(json.dumps(value, indent=1)[:20000])
        return f"<details><summary>list of {len(value)}</summary><pre>{shown}</pre></details>"
    if isinstance(value, float):
        return f"<span class='num'>{value:.6g}</span>"
    if isinstance(value, (bool, int)) or value is None:
        return f"<span class='num'>{escape(json.dumps(value))}</span>"
    return escape(value)


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 84em; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
table.kv th { background: #f6f6f6; font-weight: normal; font-family: monospace; }
.num { font-family: monospace; }
.ok { color: #17702c; } .failed, .interrupted { color: #b00020; font-weight: bold; }
.pending, .running, .skipped { color: #777; }
.scale, .aside { color: #555; font-size: 0.9em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
p.verdict { font-size: 1.1em; background: #f3f6fb; border-left: 4px solid #2166ac; padding: 0.5em 0.8em; }
table.verdict { width: 100%; table-layout: fixed; }
table.verdict th:nth-child(1) { width: 18%; } table.verdict th:nth-child(2) { width: 28%; }
table.verdict th:nth-child(3) { width: 22%; } table.verdict td:nth-child(4) { font-size: 0.9em; color: #333; }
p.scale-line { margin: 0.3em 0 0.6em; }
.maps { display: flex; flex-wrap: wrap; gap: 0.8em 1.4em; align-items: flex-start; }
figure.map { margin: 0; max-width: 15em; } figure.map figcaption { font-weight: bold; font-size: 0.9em; }
table.map { border-collapse: separate; border-spacing: 1px; margin: 0.2em 0; font-size: 0.72em; }
table.map th { border: none; padding: 0 0.25em; color: #555; font-weight: normal; text-align: right;
  white-space: nowrap; }
table.map td { border: 2px solid transparent; padding: 0; width: 1.9em; height: 1.35em; text-align: center;
  color: #fff; font-weight: bold; }
table.map td.differs { border-color: #000; }
p.where { font-size: 0.85em; margin: 0.2em 0; }
p.legend { font-size: 0.85em; color: #444; margin: 0.4em 0; }
span.key { display: inline-block; min-width: 1.6em; text-align: center; color: #fff; font-weight: bold;
  font-size: 0.85em; }
.claims { display: flex; gap: 2em; } .claims > div { flex: 1; }
.claims h3 { margin: 0.5em 0 0.2em; } .claims ul { margin: 0; padding-left: 1.2em; } .claims li { margin: 0.2em 0; }
pre { white-space: pre-wrap; }
"""
