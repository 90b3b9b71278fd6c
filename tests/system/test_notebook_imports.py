"""What a notebook's kernel imports (`notebooks.Notebook.numpy_only`): the modeling notebooks import no
torch, and no notebook imports the runner's report stack (`workbook.report`, nbconvert). Each
notebook's own import statements, run in a fresh interpreter per kind, as its kernel runs them.
(nbformat is not on the list: plotly imports it at a kernel's first figure, to emit its mimetype.)"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from spirelib.workbook.notebooks import NOTEBOOKS

ROOT = Path(__file__).resolve().parents[2]
REPORT_STACK = ("spirelib.workbook.report", "nbconvert")


def imports(stem: str) -> list[str]:
    """The import statements of notebook `stem`'s code cells, in order."""
    nb = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())
    return [ast.unparse(node) for cell in nb["cells"] if cell["cell_type"] == "code"
            for node in ast.parse("".join(cell["source"])).body if isinstance(node, (ast.Import, ast.ImportFrom))]


def loaded(statements: list[str], modules: tuple[str, ...]) -> list[str]:
    """Which of `modules` a fresh interpreter holds after running `statements`."""
    code = "\n".join([*statements, "import sys", f"print([m for m in {modules!r} if m in sys.modules])"])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return ast.literal_eval(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("numpy_only", [True, False], ids=["numpy-only", "the others"])
def test_a_notebooks_kernel_imports_no_report_stack_and_a_numpy_only_one_no_torch(numpy_only):
    stems = [stem for stem, nb in NOTEBOOKS.items() if nb.numpy_only == numpy_only]
    assert stems and all(imports(stem) for stem in stems)
    statements = [line for stem in stems for line in imports(stem)]
    assert loaded(statements, ("torch", *REPORT_STACK) if numpy_only else REPORT_STACK) == []
