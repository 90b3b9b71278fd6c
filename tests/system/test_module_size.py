"""No module of spirelib is longer than one can hold in one's head: `LIMIT` lines at most.

A module over it holds more than one concept and is split along them (docs/ARCHITECTURE.md: every
module owns one concept). The ones not split yet are listed in `NOT_YET_SPLIT`, each with its
length when it was listed as its ceiling, so that none grows while it waits; a module split below
`LIMIT` leaves the list."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "spirelib"
LIMIT = 450

#: Modules over `LIMIT` not split yet (path under spirelib/ -> its ceiling: its lines when listed).
NOT_YET_SPLIT = {
    "bench/gpu_check.py": 571,  # the GPU acceptance check's rows (what they judge: bench/gpu_goals.py)
}


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_is_over_the_limit_and_none_not_yet_split_grows():
    over = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        ceiling = NOT_YET_SPLIT.get(name, LIMIT)
        if lines(path) > ceiling:
            over[name] = f"{lines(path)} lines, at most {ceiling}"
    assert not over, f"split these along their concepts (docs/ARCHITECTURE.md, 'Modules'): {over}"


def test_the_list_names_only_modules_still_over_the_limit():
    gone = sorted(name for name in NOT_YET_SPLIT if not (PACKAGE / name).is_file())
    done = sorted(name for name in NOT_YET_SPLIT if name not in gone and lines(PACKAGE / name) <= LIMIT)
    assert not gone, f"NOT_YET_SPLIT names modules spirelib no longer has: {gone}"
    assert not done, f"these are within {LIMIT} lines now: take them off NOT_YET_SPLIT: {done}"
