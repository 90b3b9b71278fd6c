"""Shared fixtures: one runner invocation over the fixture series, reused by several test files."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from spirelib import cli

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(scope="session")
def fixture_run(tmp_path_factory):
    """Run tests/fixtures/notebooks (01 ok, 02 ok, 03 fails, 04 never runs) once.

    Returns (exit code, output folder, printed progress).
    """
    out = tmp_path_factory.mktemp("fixture_run")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = cli.main(["run", "--params", str(FIXTURES / "params.yaml"),
                            "--notebooks", str(FIXTURES / "notebooks"), "--out", str(out)])
    return rc, out, printed.getvalue()
