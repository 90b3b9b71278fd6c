"""What the real-browser tests share: Debian's chromium (never a downloaded browser) driven by
playwright, and the skip marks for machines without them (.ci/run installs chromium)."""

from __future__ import annotations

import os
import shutil

import pytest

CHROMIUM = os.environ.get("SPIRE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - the test extra installs it
    sync_playwright = None

NEEDS_BROWSER = [
    pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium; .ci/run does)"),
    pytest.mark.skipif(sync_playwright is None, reason="playwright not installed (pip install -e '.[test]')"),
]
