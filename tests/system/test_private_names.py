"""A module's private names (one leading underscore) are its own: no other module of spirelib imports
or reads them, so a change inside a module cannot silently change another's behaviour.

Every module's source is read with ast (imports inside functions count too). A violation is
`from X import _name` with X a spirelib module (relative imports resolved), or `m._name` where `m`
is a spirelib module the file imported (`import spirelib.a.b as m`, `from spirelib.a import b`, or
the dotted `spirelib.a.b._name`). Dunder names are public; a module may read its own private names;
other packages' private names (torch's) are not this test's concern.

An object's attributes are its own too: no code reaches into another object's `__dict__` (nor
subscripts `vars(obj)`) by string; a class may use its own (`self.__dict__`, `vars(self)`), and
`vars(obj)` read whole (all its fields, as `dataclasses.asdict` does) is no reach by name."""

from __future__ import annotations

import ast
from pathlib import Path

from test_layers import PACKAGE, module_name


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_module(dotted: str, package: Path) -> bool:
    """Whether the dotted name is a module or a package of the tree `package` sits in."""
    path = package.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def violations(path: Path, package: Path = PACKAGE) -> list[str]:
    """One line, file:line first, per private name of another spirelib module that `path` imports or reads."""
    here = module_name(path, package)
    parts = here.split(".")
    parent = parts if path.name == "__init__.py" else parts[:-1]
    where = path.relative_to(package.parent)
    modules: dict[str, str] = {}  # local name -> the spirelib module it is bound to
    problems = []
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "spirelib":
                    if alias.asname:
                        modules[alias.asname] = alias.name
                    else:
                        modules["spirelib"] = "spirelib"
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(parent[:len(parent) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "spirelib":
                continue
            for alias in node.names:
                if private(alias.name) and base != here:
                    problems.append((node.lineno, f"imports {alias.name} from {base}"))
                elif is_module(f"{base}.{alias.name}", package):
                    modules[alias.asname or alias.name] = f"{base}.{alias.name}"

    def module_of(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return modules.get(node.id)
        if isinstance(node, ast.Attribute):
            base = module_of(node.value)
            if base is not None and is_module(f"{base}.{node.attr}", package):
                return f"{base}.{node.attr}"
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            owner = module_of(node.value)
            if owner is not None and owner != here:
                problems.append((node.lineno, f"reads {owner}.{node.attr}"))
    return [f"{where}:{line} {what}" for line, what in sorted(problems)]


def dict_reaches(path: Path, package: Path = PACKAGE) -> list[str]:
    """One line, file:line first, per `obj.__dict__` or `vars(obj)[...]` whose `obj` is not `self` or `cls`."""
    own = ("self", "cls")
    problems = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (isinstance(node, ast.Attribute) and node.attr == "__dict__"
                and not (isinstance(node.value, ast.Name) and node.value.id in own)):
            problems.append((node.lineno, f"{ast.unparse(node.value)}.__dict__"))
        elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call)
              and isinstance(node.value.func, ast.Name) and node.value.func.id == "vars" and node.value.args
              and not (isinstance(node.value.args[0], ast.Name) and node.value.args[0].id in own)):
            problems.append((node.lineno, f"{ast.unparse(node.value)}[...]"))
    return [f"{path.relative_to(package.parent)}:{line} reaches into {what}" for line, what in sorted(problems)]


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_no_module_imports_or_reads_another_modules_private_names():
    problems = [problem for path in MODULES for problem in violations(path)]
    assert not problems, "private names used outside their module:\n" + "\n".join(problems)


def test_the_check_sees_private_imports_and_reads(tmp_path):
    """The checker itself, on a fake package: private names imported (absolutely, relatively, inside a
    function) or read through an imported module (aliased, from its package, dotted) are refused; a
    dunder, a public name imported under a private alias, a private attribute of an object that is no
    module and a module's own private names are not."""
    fake = tmp_path / "spirelib"
    (fake / "a").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "a" / "__init__.py").write_text("")
    (fake / "a" / "x.py").write_text("def _helper():\n    pass\n\n\ndef helper():\n    pass\n")
    (fake / "a" / "y.py").write_text(
        "from spirelib.a.x import _helper, helper\n"                # 1: refused
        "from .x import helper as _mine\n"                         # 2: a public name, privately aliased
        "import spirelib.a.x as xm\n"
        "from spirelib.a import x\n"
        "import spirelib.a.x\n"
        "\n"
        "def f(obj):\n"
        "    from . import x as other\n"
        "    from .x import _helper as h\n"                        # 9: refused
        "    return xm._helper, x._helper, spirelib.a.x._helper, other._helper, x.__doc__, obj._state, _own\n"
        "\n"
        "_own = 1\n"
        "from spirelib.a.y import _own as again\n"                 # 13: its own private name
        "from spirelib.a import y\n"
        "y._own\n")
    assert violations(fake / "a" / "y.py", fake) == [
        "spirelib/a/y.py:1 imports _helper from spirelib.a.x",
        "spirelib/a/y.py:9 imports _helper from spirelib.a.x",
        "spirelib/a/y.py:10 reads spirelib.a.x._helper",
        "spirelib/a/y.py:10 reads spirelib.a.x._helper",
        "spirelib/a/y.py:10 reads spirelib.a.x._helper",
        "spirelib/a/y.py:10 reads spirelib.a.x._helper",
    ]
    assert violations(fake / "a" / "x.py", fake) == []


def test_no_module_reaches_into_another_objects_dict_by_string():
    problems = [problem for path in MODULES for problem in dict_reaches(path)]
    assert not problems, "attributes read through another object's __dict__:\n" + "\n".join(problems)


def test_the_dict_check_sees_another_objects_dict_but_not_its_own(tmp_path):
    fake = tmp_path / "spirelib"
    fake.mkdir()
    (fake / "m.py").write_text(
        "class A:\n"
        "    def f(self, other):\n"
        "        memo = self.__dict__['_memo']\n"
        "        mine = vars(self)['x']\n"
        "        theirs = other.__dict__['_memo']\n"          # 5: refused
        "        fields = dict(vars(other))\n"
        "        one = vars(other)['x']\n"                    # 7: refused
        "        return type(other).__dict__\n")             # 8: refused
    assert dict_reaches(fake / "m.py", fake) == ["spirelib/m.py:5 reaches into other.__dict__",
                                                 "spirelib/m.py:7 reaches into vars(other)[...]",
                                                 "spirelib/m.py:8 reaches into type(other).__dict__"]
