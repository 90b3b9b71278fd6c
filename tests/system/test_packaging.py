"""Packaging rules: environment.yml agrees with pyproject; notebooks are committed clean and typed."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import nbformat
import pytest
import yaml
from packaging.requirements import Requirement

from spirelib.workbook import injection

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ALL_NOTEBOOKS = NOTEBOOKS + sorted((ROOT / "tests" / "fixtures").rglob("*.ipynb"))
CONDA_NAMES = {"torch": "pytorch", "kaleido": "python-kaleido"}  # PyPI name -> conda-forge name, where they differ


def conda_requirements(spec: dict) -> dict[str, str]:
    reqs = {}
    for dep in spec["dependencies"]:
        if isinstance(dep, str):
            name, version = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", dep).groups()
            reqs[name] = version
    return reqs


def test_environment_yml_agrees_with_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    wanted = project["dependencies"] + project["optional-dependencies"]["notebooks"] \
        + project["optional-dependencies"]["test"]
    expected = {}
    for line in wanted:
        req = Requirement(line)
        expected[CONDA_NAMES.get(req.name, req.name)] = str(req.specifier)
    conda = conda_requirements(env)
    python = conda.pop("python")
    conda.pop("pip")
    assert conda == expected
    assert python == project["requires-python"]
    assert env["channels"] == ["conda-forge", "nodefaults"]
    assert {"pip": ["-e .[notebooks,test]"]} in env["dependencies"]


def test_pyproject_keeps_the_torch_floor_and_lists_numpy():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch>=2.8" in deps and any(Requirement(d).name == "numpy" for d in deps)  # FSDP2's force-sum reductions


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_notebook_has_no_outputs(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs; strip them (nbstripout {path})"
    assert "widgets" not in nb.metadata, f"{path.name}: widget state in metadata; strip it"


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_notebook_is_valid_as_it_is_read(path):
    """Every cell has its id (nbformat 4.5): reading one without warns (MissingIDFieldWarning) in
    every run's terminal, and validating it would rewrite it."""
    import json
    import warnings

    cells = json.loads(path.read_text())["cells"]
    missing = [i for i, c in enumerate(cells) if "id" not in c]
    assert not missing, f"{path.name}: cells {missing} have no id; normalize it (nbformat.validator.normalize)"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nbformat.validate(nbformat.read(path, as_version=4))


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_has_one_parameters_cell_of_typed_assignments(path):
    nb = nbformat.read(path, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: {len(tagged)} cells tagged 'parameters', want exactly 1"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernelspec python3 missing"
    declared = injection.declared_parameters(path)
    untyped = [name for name, t in declared.items() if t == "None"]
    assert not untyped, f"{path.name}: parameters without a type annotation: {untyped}"
    assigned = [node.target.id if isinstance(node, ast.AnnAssign) else node.targets[0].id
                for node in ast.parse(tagged[0].source).body if isinstance(node, (ast.AnnAssign, ast.Assign))]
    unseen = [name for name in assigned if name not in declared]
    assert not unseen, f"{path.name}: papermill cannot read {unseen} (an '=' in the comment?), so params can't set them"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_series_notebook_is_named_nn_name(path):
    assert injection.NOTEBOOK_NAME.match(path.name), f"{path.name}: name it NN_name.ipynb"


def _screenshot_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("screenshot", ROOT / "docs" / "screenshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_picture_was_made_from_a_default_run_by_the_make_target():
    """The README shows docs/index-verdict.png, and `make screenshot` makes it from a run: the picture
    names that run (a PNG text chunk docs/screenshot.py writes), a run of the default params."""
    readme, makefile = (ROOT / "README.md").read_text(), (ROOT / "Makefile").read_text()
    assert "docs/index-verdict.png" in readme and "make screenshot" in readme
    assert re.search(r"^screenshot:.*\n\t\$\(PY\) docs/screenshot\.py \$\(RUN_DIR\)$", makefile, re.M)
    shot = _screenshot_module()
    named = shot.text_chunks((ROOT / "docs" / "index-verdict.png").read_bytes()).get(shot.SOURCE, "")
    assert re.fullmatch(r"spire run of params/default\.yaml, started 20\d\d-\d\d-\d\dT[\d:]+, on .+", named), named
