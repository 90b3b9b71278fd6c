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
from spirelib.throughput.methods import DECODED, card

ROOT = Path(__file__).resolve().parents[2]
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


def test_bench_decode_profiled_fits_its_grid_and_judges_the_held_out_cell(monkeypatch):
    """`bench decode --profiled` at toy sizes: every cell of the grid and the held-out one beyond
    it timed (cells taking turns), the model fitted without the held-out cell, every cell judged.
    The machine is calibrated at toy sizes too (the full-size calibration takes 10 s on a CPU)."""
    import functools
    import json

    from spirelib.measure import calibrate

    monkeypatch.setattr(calibrate, "matmul_peak", functools.partial(calibrate.matmul_peak, sizes=(512,), seconds=0.05))
    monkeypatch.setattr(calibrate, "memory_bandwidth",
                        functools.partial(calibrate.memory_bandwidth, mbytes=64, seconds=0.05))
    code, out, err = run(["bench", "decode", "--profiled", "--json", "--batch", "1", "2", "--context", "16", "24",
                          "--held-out", "2", "32", "--new-tokens", "6", "-k", "3", "--window", "4", "--vocab-size",
                          "64", "--target-layers", "2", "--d-model", "32", "--n-kv", "2", "--d-head", "16",
                          "--d-ff", "64", "--repeats", "2", "--max-repeats", "2", "--threads", "1"])
    assert code == 0, err
    report = json.loads(out)
    cells = {(c["B"], c["L"], c["method"]): c for c in report["cells"]}
    methods = DECODED  # every decoded draft's card
    assert set(cells) == {(B, L, m) for B, L in ((1, 16), (2, 16), (1, 24), (2, 24), (2, 32)) for m in methods}
    assert [key for key, c in cells.items() if c["held_out"]] == [(2, 32, m) for m in methods]
    assert all(c["runs"] == 2 and c["profiled_speedup"] > 0 for c in cells.values())
    assert report["verdict"]["held_out_max_error"] == max(abs(cells[2, 32, m]["profiled_error"]) for m in methods)


def test_bench_spire_train_times_a_real_step_and_its_parts_at_a_hugging_face_configs_shapes(tmp_path):
    """`bench spire-train --hf-config` at toy sizes: the target's shapes come from the config.json
    (its vocabulary too), and a real objective step is timed whole and by part."""
    import json

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 96, "hidden_size": 32,
              "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, err = run(["bench", "spire-train", "--hf-config", str(tmp_path / "config.json"), "--json",
                          "--batch", "2", "--seq-len", "33", "--window", "8", "--draft-layers", "1", "--repeats", "1",
                          "--naive-blocks", "1"])
    assert code == 0, err
    results = json.loads(out)
    from spirelib.bench.spire_train import ROWS

    assert all(results[row]["median_s"] > 0 for row in ROWS)
    code, out, _ = run(["bench", "spire-train", "--hf-config", str(tmp_path / "config.json"), "--batch", "2",
                        "--seq-len", "33", "--window", "8", "--draft-layers", "1", "--repeats", "1", "--naive-blocks", "1"])
    assert code == 0 and "target 3x32 (vocabulary 96)" in out and "a real step (objective) by part: teacher" in out


DECODE_TOY = ["--vocab-size", "64", "--target-layers", "2", "--d-model", "32", "--n-kv", "2", "--d-head", "16",
              "--d-ff", "64", "--window", "4", "-k", "3", "--threads", "1"]


def toy_calibration(monkeypatch):
    """This machine calibrated at toy sizes (the full-size calibration takes 10 s on a CPU)."""
    import functools

    from spirelib.measure import calibrate

    monkeypatch.setattr(calibrate, "matmul_peak", functools.partial(calibrate.matmul_peak, sizes=(512,), seconds=0.05))
    monkeypatch.setattr(calibrate, "memory_bandwidth",
                        functools.partial(calibrate.memory_bandwidth, mbytes=64, seconds=0.05))


def test_bench_decode_roofline_gives_every_forward_and_every_whole_round(monkeypatch):
    """`bench decode --roofline`: each forward kind and each method's whole round timed, each against
    the roofline of the calibration: a round's is the sum of its forwards' (k draft passes and the
    verification), and `forwards_ms` sums its forwards' measured times."""
    import json

    toy_calibration(monkeypatch)
    code, out, err = run(["bench", "decode", "--roofline", "--json", "--batch", "2", "--context", "24",
                          "--temperature", "0", *DECODE_TOY])
    assert code == 0, err
    rows = {r["kind"]: r for r in json.loads(out)}
    steps = {f"{card(m).label} step" for m in DECODED if card(m).drafter is not None}  # every card with a draft pass
    rounds = [f"{m} round" for m in ("ad", *DECODED)]
    assert list(rows)[:3] == ["AD step", "verify (4 tokens)", "verify (4) + scores"] and list(rows)[-len(rounds):] == rounds
    assert set(list(rows)[3:-len(rounds)]) == steps
    assert {"MagicDec step", "guided sparse step", "SPIRe step", "EAGLE-3 step", "lookup round"} < set(rows)
    roof = {kind: r["roofline_ms"] for kind, r in rows.items()}
    assert roof["ad round"] == pytest.approx(roof["AD step"])
    for method, step, verify in (("magicdec", "MagicDec step", "verify (4 tokens)"),
                                 ("spire", "SPIRe step", "verify (4 tokens)"),
                                 ("eagle3", "EAGLE-3 step", "verify (4 tokens)"),
                                 ("guided", "guided sparse step", "verify (4) + scores")):  # k = 3 passes + verify
        assert roof[f"{method} round"] == pytest.approx(3 * roof[step] + roof[verify])
        assert rows[f"{method} round"]["forwards_ms"] == pytest.approx(3 * rows[step]["ms"] + rows[verify]["ms"])
    assert roof["vanilla round"] > 3 * roof["vanilla SD step"] + roof["verify (4 tokens)"]  # its first pass: 2 tokens
    assert roof["lookup round"] == pytest.approx(roof["verify (4 tokens)"])  # no draft pass
    assert roof["verify (4) + scores"] > roof["verify (4 tokens)"]  # the scoring's FLOPs and key reads
    assert rows["guided sparse step"]["gflop"] == rows["MagicDec step"]["gflop"]  # the same budget of entries
    assert all(r["ms"] > 0 and r["fraction"] == pytest.approx(r["roofline_ms"] / r["ms"]) for r in rows.values())


def test_bench_decode_refuses_timed_runs_that_do_not_fit_the_free_memory(monkeypatch):
    """Before any compute: the caches the timed runs hold at their largest cell against the memory
    free on the device; interleaved round by round every method holds a target cache, so
    `--interleave runs` may fit where it does not. The free memory is patched."""
    from spirelib.bench import decode, decode_memory, decode_models

    argv = ["bench", "decode", "--profiled", "--batch", "1", "2", "--context", "16", "24", "--new-tokens", "6",
            *DECODE_TOY]
    args = cli.parser().parse_args(argv)
    cfg = bench.model_config(args)
    rounds, runs = (sum(decode_memory.held_bytes(cfg, args.methods, 2, 24, decode.decoding(args), 4, how).values())
                    for how in ("rounds", "runs"))
    assert rounds > runs
    monkeypatch.setattr(decode_memory, "available_bytes", lambda device: (rounds + runs) // 2)
    code, _, err = run(argv)
    assert code == 2 and "--profiled: at B 2 x L 24 the timed runs hold" in err
    n = len(decode_models.TIMED)  # AD and every decoded draft, each on its own copy of the prefill
    assert f"target caches ({n}) {n * decode_memory.cache_bytes(cfg, 2, 24 + 6 + 6, 4) / 1e9:.2f}" in err
    assert "--interleave runs (one target cache) holds" in err and "which fits" in err
    assert decode.problems(cli.parser().parse_args([*argv, "--interleave", "runs"])) == []
    monkeypatch.setattr(decode_memory, "available_bytes", lambda device: runs - 1)
    assert "which does not fit either" in run(argv)[2]
    monkeypatch.setattr(decode_memory, "available_bytes", lambda device: None)  # unknown: not checked
    assert decode.problems(args) == []
    assert "--device meta: the benchmarks run on cpu or cuda[:N]" in run(["bench", "decode", "--device", "meta"])[2]


def test_whole_rounds_are_timed_after_a_warm_up_whatever_the_repeats():
    """`decode.round_rows`: every generation has the rounds its warm-up (3) and its timed run
    (repeats + 1) take, even at one repeat."""
    from spirelib.bench import decode, decode_models
    from spirelib.bench.roofline import RooflineTiming
    from spirelib.model.config import ModelConfig
    from spirelib.model.transformer import Transformer
    from spirelib.throughput.hardware import Machine

    torch.manual_seed(0)
    target = Transformer(ModelConfig(vocab_size=64, num_layers=2, d_model=32, n_q_per_kv=1, n_kv=2, d_head=16,
                                     d_ff=64)).eval()
    factories, models = decode_models.build_methods(target, ["vanilla"], 1.0, 4)
    rows = decode.round_rows(target, factories, models, ["ad", "vanilla"], decode.RoundCell(2, 12, 3, 1.0), 4,
                             RooflineTiming(Machine(1e10, 1e10, 4), repeats=1))
    assert [r["kind"] for r in rows] == ["ad round", "vanilla round"] and all(r["ms"] > 0 for r in rows)


def test_a_command_imports_only_what_it_runs():
    """`spire deploy`'s and `spire train`'s arguments import no torch (the other commands' modules are
    not imported to list them; the series' checks need none); `spire bench`'s do."""
    probe = ("import sys; from spirelib import cli; cli.parser({!r}).parse_args({!r}); "
             "print('torch' in sys.modules)")
    commands = {"deploy": ["deploy", "out"], "train": ["train", "target", "--params", "p.yaml"],
                "bench": ["bench", "decode"]}
    seen = {name: subprocess.run([sys.executable, "-c", probe.format(name, argv)], capture_output=True, text=True,
                                 cwd=ROOT, check=True).stdout.strip() for name, argv in commands.items()}
    assert seen == {"deploy": "False", "train": "False", "bench": "True"}
