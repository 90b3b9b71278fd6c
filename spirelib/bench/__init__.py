"""Benchmarks: `spire bench NAME [options]`, one module per NAME.

Each module has `add_arguments(parser)`, `problems(args)` (every invalid option, checked before
anything is measured) and `main(args)`; `spirelib.cli` builds `spire bench` from them."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from types import ModuleType


def available() -> dict[str, ModuleType]:
    """NAME (as typed: "spire-train") -> its module, in name order."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    return {n.replace("_", "-"): importlib.import_module(f"{__name__}.{n}") for n in names}


def positive(args: argparse.Namespace, *names: str) -> list[str]:
    """A problem for each option in `names` (or any value of a list option) that is not > 0."""
    out = []
    for name in names:
        value = getattr(args, name)
        if any(v <= 0 for v in (value if isinstance(value, list) else [value])):
            out.append(f"--{name.replace('_', '-')}: must be > 0, got {value}")
    return out
