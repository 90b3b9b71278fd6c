"""tests/ mirrors spirelib/ (docs/ARCHITECTURE.md, "The rooms"): every module has a test file named
after it, tests/<folder>/test_<module>*.py (a module in a subfolder may also be named with its folder,
test_tables_costs.py for workbook/tables/costs.py), or one line in `COVERED_BY` naming the test file
that covers it, checked to import it (or to run its command); a new module comes with its own test file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Modules tested from another module's test file, and that file (a module split out of another kept its
#: tests there); the file must import the module, or run the command it serves (`COMMANDS`).
COVERED_BY = {
    "bench/gpu_goals.py": "tests/bench/test_gpu_check.py",
    "bench/perfmodel.py": "tests/throughput/test_perfmodel.py",
    "bench/spire_train.py": "tests/cli/test_cli.py",
    "bench/train.py": "tests/bench/test_gpu_check.py",
    "decoding/graphs.py": "tests/bench/test_rounds.py",
    "decoding/sampling.py": "tests/decoding/test_speculative.py",
    "frontend.py": "tests/workbook/test_progress.py",
    "measure/ablations.py": "tests/measure/test_ablation_family.py",
    "measure/calibrate.py": "tests/cli/test_cli.py",
    "measure/cells.py": "tests/workbook/test_tables_measured.py",
    "measure/intervals.py": "tests/measure/test_tau.py",
    "model/cross_entropy.py": "tests/training/test_train.py",
    "model/kpass_attention.py": "tests/model/test_spire.py",
    "model/rope.py": "tests/model/test_transformer.py",
    "throughput/profile_fit.py": "tests/throughput/test_profiled.py",
    "throughput/recorded_ablations.py": "tests/workbook/test_tables_ablations.py",
    "throughput/savings.py": "tests/workbook/test_tables_costs.py",
    "throughput/schedule.py": "tests/workbook/test_deploy.py",
    "throughput/sharding.py": "tests/training/test_fsdp.py",
    "training/config.py": "tests/training/test_train.py",
    "training/hf_export.py": "tests/training/test_hf.py",
    "training/hf_tokenizer.py": "tests/training/test_hf.py",
    "training/hf_weights.py": "tests/training/test_hf.py",
    "training/losses.py": "tests/model/test_spire.py",
    "training/metrics.py": "tests/training/test_step_clock.py",
    "training/objectives.py": "tests/training/test_train.py",
    "training/params.py": "tests/workbook/test_injection.py",
    "training/series_params.py": "tests/system/test_dry_run.py",
    "workbook/deploy_explain.py": "tests/workbook/test_deploy.py",
    "workbook/deploy_inputs.py": "tests/workbook/test_deploy.py",
    "workbook/details.py": "tests/workbook/test_findings.py",
    "workbook/display.py": "tests/workbook/test_tables_perf.py",
    "workbook/execute.py": "tests/workbook/test_runner.py",
    "workbook/narrative/ablations.py": "tests/workbook/test_tables_ablations.py",
    "workbook/narrative/costs.py": "tests/workbook/test_tables_costs.py",
    "workbook/narrative/decoding.py": "tests/workbook/test_tables_decoding.py",
    "workbook/narrative/measured.py": "tests/workbook/test_tables_measured.py",
    "workbook/narrative/perf.py": "tests/workbook/test_tables_perf.py",
    "workbook/narrative/training.py": "tests/workbook/test_tables_training.py",
    "workbook/narrative/winners.py": "tests/throughput/test_winners.py",
    "workbook/paper_claims.py": "tests/workbook/test_findings.py",
    "workbook/plots/ablations.py": "tests/workbook/test_tables_ablations.py",
    "workbook/plots/decoding.py": "tests/workbook/test_plots_perf.py",
    "workbook/plots/explorer.py": "tests/workbook/test_plots_perf.py",
    "workbook/plots/training.py": "tests/workbook/test_plots_perf.py",
    "workbook/probe.py": "tests/workbook/test_plan.py",
    "workbook/results.py": "tests/workbook/test_runner.py",
    "workbook/work.py": "tests/workbook/test_plan.py",
}
#: Modules a test reaches through the command line, not an import: the command as the test spells it.
COMMANDS = {"bench/perfmodel.py": '"bench", "perfmodel"', "workbook/deploy_explain.py": '"deploy", "--explain"'}


def reaches(test_source: str, module: str) -> bool:
    """Whether a test file's source imports spirelib/`module` (its dotted path, or its name from its
    package) or runs the command it serves (`COMMANDS`)."""
    dotted = "spirelib." + module.removesuffix(".py").replace("/", ".")
    package, name = dotted.rsplit(".", 1)
    imported = re.search(rf"\b{re.escape(dotted)}\b|from {re.escape(package)} import (\([^)]*|[^\n]*)\b{name}\b",
                         test_source)
    return imported is not None or (module in COMMANDS and COMMANDS[module] in test_source)


def mirrored(module: Path, root: Path = ROOT) -> bool:
    """Whether spirelib/`module` has its test file under tests/ (module docstring)."""
    parts = module.with_suffix("").parts
    folders = [root / "tests" / parts[0]] if len(parts) > 1 else [root / "tests", root / "tests" / parts[0]]
    names = (f"test_{parts[-1]}", "test_" + "_".join(parts[1:])) if len(parts) > 2 else (f"test_{parts[-1]}",)
    return any(p.name.startswith(names) for folder in folders if folder.is_dir() for p in folder.glob("test_*.py"))


def modules(root: Path = ROOT) -> list[Path]:
    package = root / "spirelib"
    return sorted(p.relative_to(package) for p in package.rglob("*.py")
                  if "__pycache__" not in p.parts and p.name not in ("__init__.py", "__main__.py"))


def test_every_module_has_its_test_file_or_the_one_that_covers_it():
    missing = {m.as_posix() for m in modules() if not mirrored(m)}
    assert missing <= set(COVERED_BY), ("give each its test file, tests/<folder>/test_<module>.py, or name the one "
                                        f"that covers it in COVERED_BY: {sorted(missing - set(COVERED_BY))}")
    assert not set(COVERED_BY) - missing, f"mirrored now: take these off COVERED_BY: {sorted(set(COVERED_BY) - missing)}"
    stale = [f"{m} -> {f}" for m, f in COVERED_BY.items() if not (ROOT / f).is_file()
             or not reaches((ROOT / f).read_text(), m)]
    assert not stale, f"these files do not import the module they cover (or run its command): {stale}"


def test_a_covering_file_must_import_the_module_or_run_its_command():
    assert reaches("from spirelib.workbook.narrative import measured as words", "workbook/narrative/measured.py")
    assert reaches("from spirelib.bench import (\n    decode,\n    train,\n)", "bench/train.py")
    assert reaches('cli.main(["bench", "perfmodel", "--repeat", "1"])', "bench/perfmodel.py")
    assert not reaches("from spirelib.workbook.narrative import perf", "workbook/narrative/measured.py")
    assert not reaches("from spirelib.bench import train_step", "bench/train.py")


def test_the_mirror_check_sees_a_module_without_a_test(tmp_path):
    (tmp_path / "spirelib" / "measure").mkdir(parents=True)
    (tmp_path / "tests" / "measure").mkdir(parents=True)
    for name in ("tau", "stopping"):
        (tmp_path / "spirelib" / "measure" / f"{name}.py").write_text("")
    (tmp_path / "tests" / "measure" / "test_tau_calibration.py").write_text("")
    assert [mirrored(m, tmp_path) for m in modules(tmp_path)] == [False, True]  # stopping, tau
