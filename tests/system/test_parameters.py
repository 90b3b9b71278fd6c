"""No function of spirelib takes more than `LIMIT` parameters (self and cls not counted) unless a
one-line comment right above it (above its decorators, if any) says why: `# parameters: <why>`.

What travels together travels as one value: a device as `hardware.Machine`, a decoding protocol as
`tau.DecodingProtocol` (batched and seeded: `tau.TauProtocol`), a cell's stopping rule as
`stopping.SpeedupRule`, a model's shape as `config.ModelConfig`, a generation's options (temperature,
lengths, generator, timer, prefill) as `speculative.Options`, the target a round is priced against as
`profiled.PricedTarget`, a training session as `train.Session`, 09's cells as `recorded.RecordedCell`."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "spirelib"
LIMIT = 8
MARK = "# parameters: "


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function, methods and nested functions included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")


def parameters(node: ast.FunctionDef) -> int:
    """Every parameter a caller may pass: positional, keyword-only, *args and **kwargs; not self or cls."""
    a = node.args
    named = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]
    return len(named) + (a.vararg is not None) + (a.kwarg is not None)


def says_why(lines: list[str], node: ast.FunctionDef) -> bool:
    """Whether the line above the function (above its first decorator) is a `# parameters: <why>` comment."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    above = lines[first - 2].strip() if first >= 2 else ""
    return above.startswith(MARK) and len(above) > len(MARK) + 10


def over_the_limit(source: str, name: str) -> dict[str, tuple[int, bool]]:
    """"name:qualified name" -> (parameters, says why) of each function of `source` over `LIMIT`."""
    lines = source.splitlines()
    return {f"{name}:{qual}": (parameters(node), says_why(lines, node))
            for qual, node in _functions(ast.parse(source)) if parameters(node) > LIMIT}


def package_over_the_limit() -> dict[str, tuple[int, bool]]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found.update(over_the_limit(path.read_text(), path.relative_to(PACKAGE).as_posix()))
    return found


def test_the_count_takes_every_parameter_but_self_and_the_reason_must_sit_right_above():
    source = '''
class A:
    def method(self, a, b, c, d, e, f, g, h): ...

    # parameters: a figure's options, keyword-only, each with its default
    @staticmethod
    def wide(a, b, /, c, d, *args, e, f, g, h, **kw): ...


# parameters: too short
def unexplained(a, b, c, d, e, f, g, h, i): ...
'''
    assert over_the_limit(source, "m") == {"m:A.wide": (10, True), "m:unexplained": (9, False)}


def test_no_function_takes_more_than_the_limit_unless_a_comment_says_why():
    unexplained = [f"{name} ({count})" for name, (count, why) in package_over_the_limit().items() if not why]
    assert not unexplained, (f"over {LIMIT} parameters: pass what travels together as one value, or say why on the "
                             f"line above ('{MARK}...'): {unexplained}")
