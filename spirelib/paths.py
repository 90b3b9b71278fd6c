"""Where the workbook keeps corpora, caches and run outputs, and how it writes a file there.

`data/` holds downloaded corpora and tokenized arrays; `outputs/cache/` holds trained
checkpoints keyed by config hash; both are git-ignored. Environment variables
`SPIRE_DATA_DIR` and `SPIRE_CACHE_DIR` move them (e.g. to a shared disk on a cluster).
Every file another process may read while it is written goes through `write_atomically`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """Write `path` whole or not at all: `write(tmp)` fills a temporary file beside it (the same
    folder, so that the rename is atomic), which then replaces `path`. A reader sees the old file
    or the new one, never half of one; a failed `write` leaves `path` as it was and no temporary."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def project_root() -> Path:
    """The checkout that holds this package (editable install), else the working directory."""
    here = Path(__file__).resolve().parent.parent
    if (here / "pyproject.toml").is_file() and (here / "spirelib").is_dir():
        return here
    return Path.cwd()


def resolve_path(path: str) -> Path:
    """A user-given path; relative ones are taken from the project root."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else project_root() / p


def data_dir() -> Path:
    """Downloaded corpora, tokenizers and token arrays."""
    return Path(os.environ.get("SPIRE_DATA_DIR") or project_root() / "data")


def cache_dir() -> Path:
    """Expensive deterministic artifacts: trained checkpoints, calibration results."""
    return Path(os.environ.get("SPIRE_CACHE_DIR") or project_root() / "outputs" / "cache")
