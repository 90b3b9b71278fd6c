"""No module of spirelib is longer than one can hold in one's head: `LIMIT` lines at most.

A module over it holds more than one concept and is split along them (docs/ARCHITECTURE.md: every
module owns one concept). Every module is within it; none is waiting to be split."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "spirelib"
LIMIT = 450


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_is_over_the_limit():
    over = {path.relative_to(PACKAGE).as_posix(): lines(path) for path in sorted(PACKAGE.rglob("*.py"))
            if lines(path) > LIMIT}
    assert not over, f"over {LIMIT} lines: split these along their concepts (docs/ARCHITECTURE.md, 'Modules'): {over}"
