"""The folders are the layers of docs/ARCHITECTURE.md: imports point down only.

Every module's imports are read from its source (ast, so imports inside functions count too) and
mapped to the layer of the module they name; a module may import its own folder and the layers
below it, never a layer above or beside it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "spirelib"

#: Layer of each top-level part of spirelib (docs/ARCHITECTURE.md, "Layers"). Parts of equal rank
#: sit beside each other and may not import each other (the workbook and the benchmarks).
LAYERS = {
    "paths": 0, "frontend": 0, "units": 0,  # the base every layer uses
    "throughput": 1,            # the performance model (numpy)
    "model": 2,                 # the torch models: transformer, caches, the SPIRe draft's architecture
    "decoding": 3,              # sampling, the speculative round, the drafting methods
    "measure": 4,               # tau, the wall clock, the machine's calibration
    "training": 5,              # losses and objectives, the trainer, data, checkpoints
    "workbook": 6, "bench": 6,  # notebooks' library and benchmarks, beside each other
    "cli": 7,                   # the one command line
    "__main__": 8,              # python -m spirelib: runs the cli
}


def part_of(module: str) -> str:
    """The top-level part of a dotted module name under spirelib ("spirelib.model.kvcache" -> "model")."""
    return module.split(".")[1] if module.count(".") else "__init__"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, package: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, module) for every spirelib module `path` imports, relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module_name(path, package).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "spirelib"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "spirelib":
                continue
            if base == "spirelib":  # from spirelib import engine: each name is a module
                found += [(node.lineno, f"spirelib.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, base))
    return found


def violations(path: Path, package: Path = PACKAGE) -> list[str]:
    """One line per import of `path` that points at a layer above or beside its own."""
    me = part_of(module_name(path, package))
    if me == "__init__":
        return []
    problems = []
    where_am_i = path.relative_to(package.parent)
    for line, target in imported_modules(path, package):
        other = part_of(target)
        if other == me:
            continue
        if other not in LAYERS:
            problems.append(f"{where_am_i}:{line} imports {target}, which is in no layer")
        elif LAYERS[other] >= LAYERS[me]:
            where = "above" if LAYERS[other] > LAYERS[me] else "beside"
            problems.append(f"{where_am_i}:{line} ({me}) imports {target} ({other}), a layer "
                            f"{where} its own")
    return problems


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_part_of_the_package_has_a_layer():
    parts = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    assert parts == set(LAYERS), f"parts without a layer: {parts - set(LAYERS)}; layers of no part: {set(LAYERS) - parts}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    assert not violations(path), "\n".join(violations(path))


def test_the_check_sees_upward_and_sideways_imports(tmp_path):
    """The checker itself: a decoding module importing the workbook (relatively, inside a function)
    or the measurement layer is refused; the workbook importing the benchmarks beside it too."""
    fake = tmp_path / "spirelib"
    for part in ("decoding", "workbook"):
        (fake / part).mkdir(parents=True)
    (fake / "decoding" / "x.py").write_text("def f():\n    from ..workbook import report\n")
    (fake / "decoding" / "y.py").write_text("from spirelib import measure\nfrom spirelib.model import kvcache\n")
    (fake / "workbook" / "z.py").write_text("import spirelib.bench.decode\nfrom spirelib.measure import tau\n")
    assert violations(fake / "decoding" / "x.py", fake) == [
        "spirelib/decoding/x.py:2 (decoding) imports spirelib.workbook (workbook), a layer above its own"]
    assert violations(fake / "decoding" / "y.py", fake) == [
        "spirelib/decoding/y.py:1 (decoding) imports spirelib.measure (measure), a layer above its own"]
    assert violations(fake / "workbook" / "z.py", fake) == [
        "spirelib/workbook/z.py:1 (workbook) imports spirelib.bench.decode (bench), a layer beside its own"]


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the spirelib modules it imports (inside functions too); `from pkg import name`
    counts `pkg.name` where that is a module, else `pkg`."""
    graph = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "spirelib":
                folder = package.parent.joinpath(*node.module.split("."))
                for a in node.names:
                    sub = folder / f"{a.name}.py"
                    targets.add(f"{node.module}.{a.name}" if sub.is_file() or (folder / a.name).is_dir()
                                else node.module)
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.split(".")[0] == "spirelib"}
        me = module_name(path, package)
        graph[me] = targets - {me}
    return graph


def a_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of `graph` (its modules in order, the first again at the end), or []."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = "done"
        stack.pop()
        return []
    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return []


def test_no_module_imports_itself_through_others():
    """No import circle among spirelib's modules (the layer rule allows one inside a folder)."""
    assert a_cycle(import_graph()) == [], " -> ".join(a_cycle(import_graph()))


def test_the_circle_check_sees_a_circle_through_a_function_level_import(tmp_path):
    fake = tmp_path / "spirelib" / "bench"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "peer.py").write_text("from spirelib.bench.gpu_check import TIE\n")
    (fake / "gpu_check.py").write_text("TIE = 1\ndef f():\n    from spirelib.bench import peer\n")
    assert a_cycle(import_graph(tmp_path / "spirelib")) == ["spirelib.bench.gpu_check", "spirelib.bench.peer",
                                                            "spirelib.bench.gpu_check"]
