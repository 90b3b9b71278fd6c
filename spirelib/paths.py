"""Where the workbook keeps corpora, caches and run outputs.

`data/` holds downloaded corpora and tokenized arrays; `outputs/cache/` holds trained
checkpoints keyed by config hash; both are git-ignored. Environment variables
`SPIRE_DATA_DIR` and `SPIRE_CACHE_DIR` move them (e.g. to a shared disk on a cluster).
"""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    """The checkout that holds this package (editable install), else the working directory."""
    here = Path(__file__).resolve().parent.parent
    if (here / "pyproject.toml").is_file() and (here / "spirelib").is_dir():
        return here
    return Path.cwd()


def data_dir() -> Path:
    """Downloaded corpora, tokenizers and token arrays."""
    return Path(os.environ.get("SPIRE_DATA_DIR") or project_root() / "data")


def cache_dir() -> Path:
    """Expensive deterministic artifacts: trained checkpoints, calibration results."""
    return Path(os.environ.get("SPIRE_CACHE_DIR") or project_root() / "outputs" / "cache")
