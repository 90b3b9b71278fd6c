"""Every page the workbook writes is a Jinja2 template (spirelib/workbook/templates/, autoescaped)
rendered from data: no module of spirelib builds an HTML tag from Python strings, and the
templates ship in the package."""

from __future__ import annotations

import ast
import glob
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TAG = re.compile(r"</?[a-zA-Z][a-zA-Z0-9]*(\s[^<>]*)?/?>")
TEMPLATES = ROOT / "spirelib" / "workbook" / "templates"

# Folders (relative to the repository) whose strings may hold these tags alone, and why they are not HTML
# of ours: plotly's own label markup in figure titles and hover templates is plotly text, not a page.
EXEMPT_FOLDERS = {"spirelib/workbook/plots": {"b", "br", "sup", "sub", "i", "extra"}}
# (file, exact string) -> why that string is not HTML; none today.
EXEMPT_STRINGS: dict[tuple[str, str], str] = {}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of `tree` (module, classes, functions)."""
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, owners) and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str)}


def _shape(node: ast.AST) -> str | None:
    """The text a string expression builds, each value computed at run time read as "x" (f-strings,
    and + between strings: "<td" + cls + ">" is "<tdx>"); None where `node` builds no string."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _shape(node.left), _shape(node.right)
        return None if left is None and right is None else (left or "x") + (right or "x")
    return None


def html_literals(source: str, path: str) -> list[str]:
    """"path:line: the tag", once per line, for every string expression of `source` (docstrings
    apart) that builds an HTML tag, except the strings `EXEMPT_STRINGS` names for `path`."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found: dict[int, str] = {}
    for node in ast.walk(tree):  # outer expressions first: a line reports the whole string it builds
        text = _shape(node) if id(node) not in docs else None
        match = TAG.search(text) if text else None
        if match and (path, text) not in EXEMPT_STRINGS:
            found.setdefault(node.lineno, f"{path}:{node.lineno}: {match.group(0)}")
    return [found[line] for line in sorted(found)]


def test_no_module_builds_html_from_strings():
    found = []
    for file in sorted((ROOT / "spirelib").rglob("*.py")):
        path = file.relative_to(ROOT).as_posix()
        allowed = next((tags for folder, tags in EXEMPT_FOLDERS.items() if path.startswith(folder + "/")), set())
        found += [f for f in html_literals(file.read_text(encoding="utf-8"), path)
                  if re.match(r"</?([a-zA-Z][a-zA-Z0-9]*)", f.split(": ", 1)[1]).group(1).lower() not in allowed]
    assert not found, "HTML built from Python strings (make it a template):\n" + "\n".join(found)


def test_the_checker_finds_tags_in_strings_f_strings_and_sums_but_not_in_docstrings_or_comparisons():
    fake = '''"""A module's <b>docstring</b> may show markup."""


def f(cls, x):
    """So may a <i>function's</i>."""
    head = "<h2 id='verdict'>Which draft</h2>"
    cell = f"<td{cls}>{x}</td>"
    row = "<tr" + cls + ">"
    words = "a < b and c > d; x <- differs; B \\\\ L"
    return head, cell, row, words, f"{x}"
'''
    assert html_literals(fake, "fake.py") == ["fake.py:6: <h2 id='verdict'>", "fake.py:7: <tdx>", "fake.py:8: <trx>"]
    EXEMPT_STRINGS[("fake.py", "<h2 id='verdict'>Which draft</h2>")] = "a test of the exemption"
    try:
        assert html_literals(fake, "fake.py") == ["fake.py:7: <tdx>", "fake.py:8: <trx>"]
        assert html_literals(fake, "other.py")[0] == "other.py:6: <h2 id='verdict'>"  # exempt in its file only
    finally:
        del EXEMPT_STRINGS[("fake.py", "<h2 id='verdict'>Which draft</h2>")]


def test_every_template_ships_in_the_package():
    """pyproject's package-data names every file of templates/ (read as setuptools globs them), so a
    wheel, not only the editable install, carries them."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "spirelib.workbook"]
    shipped = {Path(f) for p in patterns for f in glob.glob(str(TEMPLATES.parent / p), recursive=True)}
    files = {f for f in TEMPLATES.rglob("*") if f.is_file() and "__pycache__" not in f.parts}
    assert files and files <= shipped, sorted(str(f) for f in files - shipped)
