"""`spire` (and `python -m spirelib`): one program, every subcommand explained in one screen and
refusing bad input, naming every problem, before any compute."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from spirelib import bench, cli

ROOT = Path(__file__).resolve().parent.parent
SCREEN = 50  # lines of --help that fit one terminal screen


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # argparse: --help, or a malformed command line
            code = e.code
    return code, out.getvalue(), err.getvalue()


def test_spire_and_python_m_spirelib_are_the_same_program():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"spire": "spirelib.cli:main"}
    proc = subprocess.run([sys.executable, "-m", "spirelib", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout == run(["--help"])[1]


HELPS = [[], *[[c] for c in cli.COMMANDS], ["train"], ["data", "fetch"], ["data", "fixture"],
         *[["bench", name] for name in bench.available()]]


@pytest.mark.parametrize("command", HELPS, ids=lambda c: " ".join(c) or "spire")
def test_help_says_what_each_command_does_in_one_screen(command):
    code, out, _ = run([*command, "--help"])
    assert code == 0
    lines = out.splitlines()
    assert 3 < len(lines) <= SCREEN, f"spire {' '.join(command)} --help: {len(lines)} lines"
    assert out.startswith("usage: spire"), out[:80]


def test_bench_options_are_checked_all_at_once_before_anything_runs():
    code, _, err = run(["bench", "decode", "--batch", "1", "0", "--repeats", "-1", "--d-model", "0"])
    assert code == 2
    assert "3 problems, nothing was run" in err
    for problem in ("--batch: must be > 0, got [1, 0]", "--repeats: must be > 0, got -1", "--d-model: must be > 0"):
        assert problem in err


@pytest.mark.parametrize("name", list(bench.available()))
def test_every_benchmark_declares_its_checks(name):
    module = bench.available()[name]
    args = cli.parser().parse_args(["bench", name] + (["--device", "cpu", "--quick"] if name == "gpu-check" else []))
    assert module.problems(args) == []  # the defaults are valid (the GPU check's, where there is a GPU)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_the_gpu_check_refuses_a_machine_without_a_gpu():
    code, _, err = run(["bench", "gpu-check", "--steps", "0"])
    assert code == 2 and "2 problems, nothing was run" in err
    assert "no CUDA device here; run it on a GPU machine" in err and "--steps: must be > 0" in err
    code, _, err = run(["bench", "gpu-check", "--device", "cpu"])
    assert code == 2 and "--quick dry-runs it on the CPU" in err


def test_a_missing_or_broken_params_file_is_refused_with_exit_2(tmp_path):
    code, _, err = run(["train", "target", "--params", str(tmp_path / "nope.yaml")])
    assert code == 2 and "nope.yaml" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("series: [1, 2\n")
    code, _, err = run(["check", "--params", str(bad)])
    assert code == 2 and "not valid YAML" in err
