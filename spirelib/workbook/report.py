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
is the list `INDEX_SECTIONS` of small functions, each rendering one section from data
(`findings`, `paper_claims`, `details`, `deploy`) with a Jinja2 template of templates/ (autoescaped):
the verdict and what was (not) reproduced first, then the reports, the details, the parameters
(folded) and a link to the raw results.json. The runner writes it before the first notebook and as
each starts, not only at the end: while the run's status is "running" the page says how far the run
is and when the plan expects it to end (`live_state`), reloads itself every `LIVE_RELOAD_S` in a
browser, marks each notebook "running" or "not yet run", and leaves out, rather than stop the run,
a section the results so far cannot fill. Once the run ends it is what the notebooks' results make.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import copy
import datetime
import json
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import nbformat
import plotly.io as pio
import plotly.offline
import yaml
from jinja2 import PackageLoader
from markupsafe import Markup
from nbconvert import HTMLExporter

from spirelib.paths import write_atomically
from spirelib.throughput.engines import SERVING
from spirelib.workbook import deploy, findings, paper_claims
from spirelib.workbook.details import DETAILS
from spirelib.workbook.plan import time_range
from spirelib.workbook.templating import render

PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
PLOTLY_JS = "plotly.min.js"

REPORT_TEMPLATE = "spire_report.j2"  # templates/nbconvert/: nbconvert's lab template, our head and CSS
PARAMETERS_TAG, INJECTED_TAG = "parameters", "injected-parameters"
CONCLUSION_TAG = "conclusion"  # cells whose text output a report shows first, under its title
PNG_SIZE = (960, 540)  # default size of a static figure; a figure's own layout height wins
LIVE_RELOAD_S = 30  # a browser reloads the index of a running run this often


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
    fallback = render("plotly_fallback.html", title=title, plotly_js=PLOTLY_JS)
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
    exporter = HTMLExporter(template_name="lab", template_file=REPORT_TEMPLATE,
                            extra_loaders=[PackageLoader("spirelib.workbook", "templates/nbconvert")])
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
    """Write `out_dir/index.html` from `run.json` and `results.json`, atomically (a browser reloading it
    mid-run never reads half a page); returns its path."""
    run = _read(out_dir / "run.json")
    results = _read(out_dir / "results.json")
    path = out_dir / "index.html"
    write_atomically(path, lambda tmp: tmp.write_text(render_index(run, results, sections or INDEX_SECTIONS),
                                                        encoding="utf-8"))
    return path


def render_index(run: dict, results: dict, sections: list[Callable[[dict, dict], str]],
                 now: datetime.datetime | None = None) -> str:
    """The index page: a header, then each section function's HTML in order. While the run runs
    (status "running", at `now`), the header says how far it is (`live_state`), and a section that
    fails on the results so far is left out, named in the header, instead of stopping the run."""
    if run.get("status") != "running":
        return render("run_index.html", run=run, live=None,
                      body=Markup("\n".join(section(run, results) for section in sections))) + "\n"
    live = live_state(run, now or datetime.datetime.now())
    parts = []
    for section in sections:
        try:
            parts.append(section(run, results))
        except Exception:  # noqa: BLE001 - mid-run, a section the results so far cannot fill waits for the end
            live["left_out"].append(section.__name__.removesuffix("_section"))
    return render("run_index.html", run=run, live=live, body=Markup("\n".join(parts))) + "\n"


def live_state(run: dict, now: datetime.datetime) -> dict:
    """How far a running run is at `now`, for its index's header: this run's notebooks done (finished,
    whatever their status) of all, the one running and since when, and the time the plan has left
    (each waiting notebook's `planned_s`, with `planned_at_tau_1_s` the range's other end; the running
    one's less its elapsed time, down to 0) in words and as the clock time the run ends. `planned`:
    whether a plan prices what is left (not in a dry run); `left` and `ends` None without one, or
    where its time is spent."""
    ours = {stem: e for stem, e in run.get("notebooks", {}).items()
            if e.get("status") in ("pending", "running") or (e.get("started") or "") >= (run.get("started") or "")}
    waiting = {stem: e for stem, e in ours.items() if e.get("status") in ("pending", "running")}
    running = next((stem for stem, e in waiting.items() if e["status"] == "running" and e.get("started")), None)
    planned = bool(waiting) and all(e.get("planned_s") is not None for e in waiting.values())
    state = {"done": len(ours) - len(waiting), "of": len(ours), "running": running, "written": f"{now:%H:%M:%S}",
             "since": waiting[running]["started"][11:] if running else None, "planned": planned, "left": None,
             "ends": None, "reload_s": LIVE_RELOAD_S, "left_out": []}
    if not planned:
        return state
    ran = (now - datetime.datetime.fromisoformat(waiting[running]["started"])).total_seconds() if running else 0.0

    def left(stem: str, e: dict, key: str) -> float:
        return max(0.0, (e.get(key) or e["planned_s"]) - (ran if stem == running else 0.0))

    low, high = (sum(left(stem, e, key) for stem, e in waiting.items()) for key in ("planned_s", "planned_at_tau_1_s"))
    if max(low, high) <= 0:
        return state
    first, last = (_clock(now, now + datetime.timedelta(seconds=x)) for x in sorted((low, high)))
    return {**state, "left": time_range(low, high), "ends": first if first == last else f"{first} - {last}"}


def _clock(now: datetime.datetime, then: datetime.datetime) -> str:
    """`then` as a clock time, with its date where it is not `now`'s day."""
    return f"{then:%H:%M}" if then.date() == now.date() else f"{then:%Y-%m-%d %H:%M}"




def verdict_section(run: dict, results: dict) -> str:
    """The index's first section: the decision maps (`findings.verdict`), then what this run checked
    of the paper's claims (`paper_claims.claims`), then what each answer is good for (`findings.answers`)."""
    found = paper_claims.claims(run, results)
    return render("verdict.html", verdict=findings.verdict(run, results),
                  claims=found if any(found.values()) else None, answers=findings.answers(run, results)).strip()


def changed_claims_section(run: dict, results: dict) -> str:
    """The claims whose verdict changed since the previous run in this folder on the same params and
    machine (`spirelib.workbook.claims`), each before and after with its evidence now; a line saying
    the verdicts held, or why the runs were not compared."""
    return render("changed_claims.html", compared=run.get("claims_compared") or {}, changed=run.get("claims_changed"))


def schedules_section(run: dict, results: dict) -> str:
    """The index's links to the run's serving schedules (`deploy.index_rows`); "" when it wrote none."""
    return render("schedules.html", rows=deploy.index_rows(run), serving=SERVING)


def reports_section(run: dict, results: dict) -> str:
    """One row per notebook: link to its report, status, elapsed time, error if any."""
    return render("reports.html", notebooks=run.get("notebooks", {}))


def findings_section(run: dict, results: dict) -> str:
    """The details behind the verdict: every finding of `details.DETAILS` whose notebook recorded its results."""
    details = [(detail.__name__, found) for detail in DETAILS if (found := detail(run, results))]
    return render("details.html", details=details).strip()


def parameters_section(run: dict, results: dict) -> str:
    """The params file as loaded, and what was injected into each notebook (folded)."""
    return render("parameters.html", run=run, params=yaml.safe_dump(run.get("params", {}), sort_keys=False))


def results_section(run: dict, results: dict) -> str:
    """A link to every result recorded with `spirelib.workbook.results.record` (results.json), and what it holds."""
    return render("raw_results.html", counts=[f"{stem} ({len(values)})" for stem, values in results.items() if values])


INDEX_SECTIONS: list[Callable[[dict, dict], str]] = [verdict_section, changed_claims_section, schedules_section,
                                                     reports_section, findings_section, parameters_section,
                                                     results_section]


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
