"""Shared fixtures: one runner invocation over the fixture series, reused by several test files."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

# `make test` runs the suite on two pytest-xdist workers (`--dist loadfile`: a file's tests stay on
# one worker, so its module fixtures are built once and its tests keep their order). On 2 cores each
# worker computes on one thread, set before torch is imported (kernels and torchrun ranks the tests
# start inherit it), compiles in its own process (torch.compile's default pool of compile workers per
# process would put four on two cores; the compiled-decoding test's cold compile, alone on the
# machine, took 63-65 s in-process against 73-79 s with the pool), and trains into its own model
# cache: two workers training the same smoke model would race on its checkpoint folder.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    os.environ.setdefault("SPIRE_CACHE_DIR", str(Path(__file__).resolve().parent.parent / "outputs" / f"cache-{WORKER}"))

import pytest  # noqa: E402

from spirelib import cli  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


@contextlib.contextmanager
def own_cache(path: Path):
    """SPIRE_CACHE_DIR set to `path` inside: a run whose plan must not read, nor leave, figures that
    other runs of the session learned (`plan.learn` writes each run's measured times back)."""
    saved = os.environ.get("SPIRE_CACHE_DIR")
    os.environ["SPIRE_CACHE_DIR"] = str(path)
    try:
        yield path
    finally:
        if saved is None:
            os.environ.pop("SPIRE_CACHE_DIR", None)
        else:
            os.environ["SPIRE_CACHE_DIR"] = saved


@pytest.fixture(scope="session")
def fixture_run(tmp_path_factory):
    """Run tests/fixtures/notebooks (01 ok, 02 ok, 03 fails, 04 never runs) once, with a cache of its
    own (`fixture_cache(out)`: nothing learned before it; what it learns stays there).

    Returns (exit code, output folder, printed progress).
    """
    out = tmp_path_factory.mktemp("fixture_run")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), own_cache(fixture_cache(out)):
        rc = cli.main(["run", "--params", str(FIXTURES / "params.yaml"),
                            "--notebooks", str(FIXTURES / "notebooks"), "--out", str(out)])
    return rc, out, printed.getvalue()


def fixture_cache(out: Path) -> Path:
    """The cache folder of the fixture run into `out`."""
    return out.with_name(out.name + "-cache")

