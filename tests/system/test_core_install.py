"""`spire` on a core install (`pip install .`, no notebook extra): a torchrun node or a GPU box
trains, benchmarks, checks and deploys without papermill, jupyter, nbconvert or plotly; only
`spire run` needs them, and says what to install.

The notebook stack is made unimportable in a subprocess (a `sitecustomize` on PYTHONPATH that
refuses the modules, inherited by every process the command starts), as on such an install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOT_CORE = ("papermill", "jupyter_client", "jupyter_core", "nbclient", "nbconvert", "nbformat", "ipykernel",
            "ipywidgets", "IPython", "plotly", "kaleido", "jupyterlab", "transformers")  # the extras' packages
BLOCKER = f"""
import importlib.abc, sys

class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {NOT_CORE!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, _NotInstalled())
"""


@pytest.fixture(scope="module")
def core_env(tmp_path_factory):
    site = tmp_path_factory.mktemp("core-install")
    (site / "sitecustomize.py").write_text(BLOCKER)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
            "SPIRE_CACHE_DIR": str(site / "cache")}


def spire(env, *argv, timeout=600):
    return subprocess.run([sys.executable, "-m", "spirelib", *argv], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout)


def test_the_blocker_stands_in_for_a_missing_extra(core_env):
    proc = subprocess.run([sys.executable, "-c", "import plotly"], capture_output=True, text=True, env=core_env)
    assert proc.returncode == 1 and "No module named 'plotly'" in proc.stderr


def test_train_bench_check_and_deploy_start_without_the_notebook_extra(core_env, tmp_path):
    train = spire(core_env, "train", "target", "--params", "params/smoke.yaml", "--no-progress")
    assert train.returncode == 0, train.stderr[-2000:]
    check = spire(core_env, "check", "--params", "params/smoke.yaml")
    assert check.returncode == 0 and "params/smoke.yaml: ok (9 notebooks)" in check.stdout, check.stderr[-2000:]
    for command in (["deploy", "--help"], ["bench", "decode", "--help"]):
        proc = spire(core_env, *command)
        assert proc.returncode == 0 and proc.stdout.startswith("usage: spire"), proc.stderr[-2000:]
    # Every row but the smoke series (notebooks: the extra), compiled decoding and the profiled model (a
    # minute of cold compilation, and a fit, here; tests/decoding/test_compiled.py and tests/bench/test_gpu_check.py run
    # them with the extras installed). The peer row needs transformers (the test extra): it says so.
    check = spire(core_env, "bench", "gpu-check", "--device", "cpu", "--quick", "--steps", "4",
                  "--skip", "series", "cuda-graphs", "profiled")
    assert check.returncode == 0, check.stdout + check.stderr[-2000:]
    rows = {line.split()[0]: line.split()[1] for line in check.stdout.splitlines()[1:] if line.strip()}
    assert {row: rows.get(row) for row in ("bf16-target", "mfu", "memory", "roofline", "peer")} == \
        {"bf16-target": "ok", "mfu": "ok", "memory": "ok", "roofline": "unjudged", "peer": "skip"}, check.stdout


def test_run_says_which_extra_to_install_before_any_compute(core_env, tmp_path):
    proc = spire(core_env, "run", "--params", "params/smoke.yaml", "--out", str(tmp_path / "out"), timeout=60)
    assert proc.returncode == 2
    assert "pip install 'spire-workbook[notebooks]'" in proc.stderr
    assert not (tmp_path / "out").exists() and "plan" not in proc.stdout.lower()  # refused before the plan's probes
