"""Every notebook of the series executes under params/smoke.yaml through the runner.

One runner invocation per notebook (`--only NN`), in series order, all into one output
folder, so a notebook sees the results of the earlier ones (as in a full run) and a failure
is attributed to the notebook that failed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from browser import CHROMIUM, NEEDS_BROWSER, sync_playwright

from spirelib import cli
from spirelib.workbook import injection

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
SERIES = injection.discover(NOTEBOOKS) if NOTEBOOKS.is_dir() else []


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory):
    return tmp_path_factory.mktemp("smoke")


@pytest.mark.parametrize("notebook", SERIES, ids=[p.stem for p in SERIES])
def test_notebook_runs_under_smoke_params(notebook, smoke_out):
    rc = cli.main(["run", "--params", str(ROOT / "params" / "smoke.yaml"), "--notebooks", str(NOTEBOOKS),
                        "--only", notebook.stem, "--out", str(smoke_out), "--cell-timeout", "900"])
    entry = json.loads((smoke_out / "run.json").read_text())["notebooks"][notebook.stem]
    assert rc == 0 and entry["status"] == "ok", f"{notebook.name}: {entry.get('error')} (report: {smoke_out})"
    assert (smoke_out / f"{notebook.stem}.html").is_file()


# Absolute paths a report could leak: this checkout, the run's folder, the home folder and the
# usual roots of temporary and working folders (a figure's "tokens/s" or "docs/method.md" is fine).
ABSOLUTE_PATH = re.compile(r"(?<![\w.~])/(?:tmp|home|root|work|Users|var|private|opt|mnt)/[\w.@+-]+")


def _needs_browser(test):
    for mark in NEEDS_BROWSER:
        test = mark(test)
    return test


@_needs_browser
def test_every_report_leads_with_its_conclusion_and_names_no_path_of_this_machine(smoke_out):
    """As a reader sees them in Chromium: every report of the smoke series above (it runs
    after them, in this module's order) has, as its first section after the title, the conclusion
    ("What this run shows", computed by its `conclusion` cells), and none shows an absolute path of
    the machine it ran on."""
    reports = sorted(smoke_out.glob("[0-9][0-9]_*.html"))
    if len(reports) < len(SERIES):
        pytest.skip("the smoke series did not run in this session (run the whole module)")
    leaks = {str(ROOT), str(smoke_out), str(Path.home())} - {"/"}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            for path in reports:
                page.goto(path.as_uri())
                headings = page.locator("h1, h2, h3").all_inner_texts()
                assert headings[0].startswith(path.stem[:2]), (path.name, headings[:3])  # the title
                assert headings[1].startswith("What this run shows"), (path.name, headings[:3])
                text = page.locator("body").inner_text()
                assert not [leak for leak in leaks if leak in text], path.name
                assert not ABSOLUTE_PATH.search(text), (path.name, ABSOLUTE_PATH.search(text).group(0))
        finally:
            browser.close()
