"""The live explorer in a real JupyterLab: a loopback server started here, Debian's chromium
driven by playwright (launched with `executable_path`; no browser download). Runs notebook 01,
moves the batch and context sliders and picks a device, and checks that the summary settles on what
`perfmodel` computes for those settings (the dropdown must stick once the HOI slider has
snapped the device's HOI to its step). Skipped only where chromium or playwright is missing
(.ci/run installs chromium; playwright is in the test extra).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from browser import CHROMIUM, NEEDS_BROWSER, sync_playwright

from spirelib.frontend import HEADLESS_ENV
from spirelib.throughput import perfmodel as pm
from spirelib.throughput.hardware import BYTES_PER_VALUE, HARDWARE

ROOT = Path(__file__).resolve().parents[2]
pytestmark = NEEDS_BROWSER

DEVICE, DTYPE = "h100-sxm", "bf16"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 serving a copy of notebook 01: (base url, token)."""
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(ROOT / "notebooks" / "01_performance_model.ipynb", root)
    port, token = _free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k != HEADLESS_ENV}  # a person watches this kernel
    env.update(JUPYTER_CONFIG_DIR=str(root / ".config"), JUPYTER_RUNTIME_DIR=str(root / ".runtime"),
               OMP_NUM_THREADS="1")
    log = open(root / "server.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={token}", "--LabApp.expose_app_in_browser=True",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--ServerApp.disable_check_xsrf=True", "--allow-root"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=1)
                break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError((root / "server.log").read_text()[-3000:]) from None
                time.sleep(0.25)
        else:
            raise RuntimeError("JupyterLab did not start in 60 s: " + (root / "server.log").read_text()[-3000:])
        yield base, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def expected_summary_numbers(B: int, L: int) -> dict[str, str]:
    """The explorer's numbers for notebook 01's scenario at (B, L) on DEVICE DTYPE, from perfmodel."""
    hoi, nbytes = HARDWARE[DEVICE].hoi(DTYPE), float(BYTES_PER_VALUE[DTYPE])
    drafts, taus = pm.PAPER_DRAFTS["seqax-67m"], pm.PAPER_TAU[512]
    numbers = {"hoi": f"HOI {hoi:.0f} FLOP/byte", "bytes": f"{nbytes:g} byte per value"}
    for method, name in (("vanilla", "vanilla SD"), ("magicdec", "MagicDec"), ("spire", "SPIRe")):
        tm = pm.throughput_multiplier(method, taus[method], B, L, "seqax-67m", drafts.get(method), k=4, hoi=hoi,
                                      bytes_per_weight=nbytes, bytes_per_kv=nbytes)
        numbers[name] = f"{float(tm):.2f}x"
    return numbers


def plain(text: str) -> str:
    """Text as shown, with non-breaking spaces (ipywidgets' dropdown labels) as spaces."""
    return re.sub(r"\s+", " ", text.replace("\xa0", " ")).strip()


def test_explorer_in_jupyterlab_follows_the_batch_slider_and_the_hardware_dropdown(lab):
    base, token = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(30_000)
            page.goto(f"{base}/lab/tree/01_performance_model.ipynb?token={token}")
            page.wait_for_function("window.jupyterapp && document.querySelector('.jp-Notebook')", timeout=60_000)
            page.wait_for_function(  # the kernel has started
                "window.jupyterapp.shell.currentWidget?.sessionContext?.session?.kernel?.status === 'idle'",
                timeout=60_000)
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")  # no await
            summary = page.locator(".widget-html-content", has_text="At B = 64, L = 512")
            summary.wait_for(timeout=60_000)
            summary.scroll_into_view_if_needed()
            page.wait_for_timeout(1000)  # the sliders have rendered and may have written a snapped value back
            first = plain(summary.inner_text())
            assert "HOI 600 FLOP/byte" in first, first  # the notebook's HOI, not the slider's nearest step

            batch = page.locator(".widget-slider", has_text="batch B").locator(".noUi-handle")
            batch.focus()
            batch.press("End")  # 64 -> 1024, the last stop
            page.locator(".widget-html-content", has_text="At B = 1024, L = 512").wait_for(timeout=20_000)
            context = page.locator(".widget-slider", has_text="context L").locator(".noUi-handle")
            context.focus()
            for _ in range(3):
                context.press("ArrowLeft")  # 512 -> 64
            page.locator(".widget-html-content", has_text="At B = 1024, L = 64").wait_for(timeout=20_000)

            dropdown = page.locator(".widget-dropdown", has_text="hardware").locator("select")
            dropdown.select_option(label=f"{DEVICE}\xa0{DTYPE}")
            page.wait_for_timeout(1500)  # longer than the slider takes to snap the HOI and write it back
            chosen = dropdown.evaluate("e => e.options[e.selectedIndex].text")
            assert plain(chosen) == f"{DEVICE} {DTYPE}", chosen  # it stuck
            text = plain(page.locator(".widget-html-content", has_text="At B = 1024, L = 64").inner_text())
            assert f"{DEVICE} {DTYPE}" in text, text
            for name, value in expected_summary_numbers(1024, 64).items():
                wanted = value if name in ("hoi", "bytes") else f"{name} {value}"
                assert wanted in text, (wanted, text)
        finally:
            browser.close()
