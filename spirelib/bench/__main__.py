"""Dispatch `python -m spirelib.bench NAME [options]` to `spirelib.bench.<NAME>.main`."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import spirelib.bench as bench_pkg


def available() -> list[str]:
    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(bench_pkg.__path__) if not m.name.startswith("_"))


def main(argv: list[str]) -> int:
    names = available()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in names:
        print("usage: python -m spirelib.bench {" + ",".join(names) + "} [options]", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(f"spirelib.bench.{argv[0].replace('-', '_')}")
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
