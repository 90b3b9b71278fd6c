"""HTML reports of executed notebooks that work offline, and the run's index page.

Notebooks show figures with `fig.show()`; in a kernel plotly emits the
`application/vnd.plotly.v1+json` mimetype, which nbconvert cannot render. `export_html`
turns each such output into a div drawn by `Plotly.newPlot`, using one local `plotly.min.js`
(from the installed plotly package) written next to the reports: no CDN, no network.
ipywidgets views have no static rendering: they become a short text note. The page loads no
require.js (it would capture plotly.js as an AMD module) and no widget manager.
MathJax (from a CDN) is loaded only by reports whose markdown has LaTeX: online it is typeset,
offline it shows as TeX source.

`write_index` builds `index.html` from the run's `run.json` and `results.json`; its content
is the list `INDEX_SECTIONS` of small functions, each rendering one section.
"""

from __future__ import annotations

import copy
import html
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import plotly.io as pio
import plotly.offline
import yaml
from jinja2 import DictLoader
from nbconvert import HTMLExporter

from spirelib.findings import findings_section

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
"""


# ---------------------------------------------------------------------------- notebook reports

def offline_outputs(nb: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, int]:
    """A copy of `nb` whose outputs render statically; also the number of plotly figures."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
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


def has_math(nb: nbformat.NotebookNode) -> bool:
    """Whether any markdown cell has LaTeX delimiters ($, \\( or \\[)."""
    return any(c.cell_type == "markdown" and any(d in c.source for d in ("$", "\\(", "\\["))
               for c in nb.cells)


def figure_html(figure: dict) -> str:
    """A div and script drawing `figure` (plotly's JSON) with an already loaded plotly.js."""
    figure = dict(figure)
    config = figure.pop("config", None)
    return pio.to_html(figure, config=config, include_plotlyjs=False, full_html=False, validate=False)


def export_html(notebook: Path, html_path: Path) -> Path:
    """Export an executed notebook to `html_path`, writing plotly.js beside it if needed."""
    nb, figures = offline_outputs(nbformat.read(notebook, as_version=4))
    exporter = HTMLExporter(template_name="lab", extra_loaders=[DictLoader({"spire_report.j2": _TEMPLATE})],
                            template_file="spire_report.j2")
    resources = {"metadata": {"name": Path(notebook).stem}, "plotly_js": PLOTLY_JS if figures else "",
                 "has_math": has_math(nb)}
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    if figures:
        write_plotly_js(html_path.parent)
    html_path.write_text(body, encoding="utf-8")
    return html_path


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
            f"<style>{_CSS}</style></head>\n<body><h1>{title}</h1>\n"
            f"<p>status <b class='{_e(run.get('status'))}'>{_e(run.get('status'))}</b>; "
            f"started {_e(run.get('started'))}, finished {_e(run.get('finished') or '-')}</p>\n"
            f"{body}\n</body></html>\n")


def reports_section(run: dict, results: dict) -> str:
    """One row per notebook: link to its report, status, elapsed time, error if any."""
    rows = []
    for stem, nb in run.get("notebooks", {}).items():
        link = f"<a href='{_e(nb['html'])}'>{_e(stem)}</a>" if nb.get("html") else _e(stem)
        seconds = f"{nb['seconds']:.1f} s" if nb.get("seconds") is not None else ""
        rows.append(f"<tr><td>{link}</td><td class='{_e(nb.get('status'))}'>{_e(nb.get('status'))}</td>"
                    f"<td class='num'>{seconds}</td><td>{_e(nb.get('error') or '')}</td></tr>")
    return ("<h2>Reports</h2>\n<table><tr><th>notebook</th><th>status</th><th>time</th><th>error</th></tr>\n"
            + "\n".join(rows) + "\n</table>")


def parameters_section(run: dict, results: dict) -> str:
    """The params file as loaded, and what was injected into each notebook."""
    rows = "\n".join(f"<tr><td>{_e(stem)}</td><td>{render_value(nb.get('parameters', {}))}</td></tr>"
                     for stem, nb in run.get("notebooks", {}).items())
    params = yaml.safe_dump(run.get("params", {}), sort_keys=False)
    return (f"<h2>Parameters</h2>\n<p>from <code>{_e(run.get('params_file'))}</code>:</p>\n"
            f"<pre>{_e(params)}</pre>\n<h3>Injected per notebook</h3>\n"
            f"<table><tr><th>notebook</th><th>parameters (others: the notebook's defaults)</th></tr>\n{rows}\n</table>")


def results_section(run: dict, results: dict) -> str:
    """Every result recorded with `spirelib.results.record`, per notebook."""
    parts = [f"<h3>{_e(stem)}</h3>\n{render_value(values)}" for stem, values in results.items() if values]
    return "<h2>Recorded results</h2>\n" + ("\n".join(parts) or "<p>none recorded</p>")


INDEX_SECTIONS: list[Callable[[dict, dict], str]] = [findings_section, reports_section, parameters_section,
                                                     results_section]


def render_value(value: Any, max_items: int = 12) -> str:
    """Readable HTML for a JSON value: dicts as key/value tables, short lists inline."""
    if isinstance(value, dict):
        if not value:
            return "<i>(none)</i>"
        rows = "".join(f"<tr><th>{_e(k)}</th><td>{render_value(v, max_items)}</td></tr>" for k, v in value.items())
        return f"<table class='kv'>{rows}</table>"
    if isinstance(value, list):
        if len(value) <= max_items and all(not isinstance(v, (dict, list)) for v in value):
            return "[" + ", ".join(render_value(v) for v in value) + "]"
        shown = _e(json.dumps(value, indent=1)[:20000])
        return f"<details><summary>list of {len(value)}</summary><pre>{shown}</pre></details>"
    if isinstance(value, float):
        return f"<span class='num'>{value:.6g}</span>"
    if isinstance(value, (bool, int)) or value is None:
        return f"<span class='num'>{_e(json.dumps(value))}</span>"
    return _e(value)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
table.kv th { background: #f6f6f6; font-weight: normal; font-family: monospace; }
.num { font-family: monospace; }
.ok { color: #17702c; } .failed, .interrupted { color: #b00020; font-weight: bold; }
.pending, .running, .skipped { color: #777; }
.scale { color: #555; font-size: 0.9em; }
"""
