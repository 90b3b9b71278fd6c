"""docs/ARCHITECTURE.md is the project's map: its "Modules" section names every module of spirelib
(a package's `__init__` where it holds more than its docstring) and every template, each in one
short line under the heading of its folder, and names nothing that is not there."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "spirelib"


def does_something(path: Path) -> bool:
    """Whether a module holds more than its docstring and `from __future__` imports."""
    body = ast.parse(path.read_text()).body
    return any(not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
               and not (isinstance(node, ast.ImportFrom) and node.module == "__future__") for node in body)


def modules(package: Path = PACKAGE) -> set[str]:
    """What the map must name, as paths under spirelib/: modules without `.py`, templates whole."""
    found = {str(p.relative_to(package).with_suffix("")) for p in package.rglob("*.py")
             if p.name != "__init__.py" or does_something(p)}
    templates = package / "workbook" / "templates"
    return found | {str(p.relative_to(package)) for p in templates.rglob("*") if p.is_file()}


def named(architecture: str) -> set[str]:
    """The paths the "Modules" section names: a bold heading names a folder (its first backticked
    word, `workbook/tables/`; none: spirelib's top) and each line under it opens with the backticked
    names it describes (`train`, `spire_train`: ...), relative to that folder."""
    section = architecture.split("\n## Modules", 1)[1].split("\n## ", 1)[0]
    paths, folder = set(), ""
    for line in section.splitlines():
        if line.startswith("**"):
            heading = line.split("**")[1]
            folder = heading.split("`")[1].rstrip("/") if "`" in heading else ""
        elif line.startswith("- "):
            for name in line[2:].split(": ", 1)[0].split("`")[1::2]:
                paths.add(f"{folder}/{name}".lstrip("/").rstrip("/"))
    return paths


def test_the_map_names_every_module_and_only_those():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    names = named(text)
    assert sorted(modules() - names) == [], "add a line for each to docs/ARCHITECTURE.md, 'Modules'"
    stale = sorted(n for n in names - modules() if not (PACKAGE / n).is_dir())
    assert stale == [], "docs/ARCHITECTURE.md names these, which spirelib no longer has"
    long = [i for i, line in enumerate(text.splitlines(), 1) if len(line) > 160]
    assert long == [], f"docs/ARCHITECTURE.md: lines over 160 characters: {long}"


def test_the_check_reads_headings_and_subfolders():
    text = ("# map\n\n## Modules\n\n**Base (0)**\n- `paths`: where.\n**`bench/` (6)**, one per NAME\n"
            "- `train`, `spire_train`: speed.\n- `templates/`: pages.\n**`workbook/templates/`**\n"
            "- `details/table1.html`: 04's tau.\n\n## Tests\n- `tests/x`: not a module.\n")
    assert named(text) == {"paths", "bench/train", "bench/spire_train", "bench/templates",
                           "workbook/templates/details/table1.html"}
