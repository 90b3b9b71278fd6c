"""Whether a person watches this kernel: live widgets and progress bars only then.

The workbook runner sets `HEADLESS_ENV` for the kernels it starts. There no live frontend will
ever show a widget (and nbclient can hang on widget comm traffic, jupyter/nbclient#312), and a
progress bar would only leave its refreshes as lines of stderr in the report.
"""

from __future__ import annotations

import os
import sys

from tqdm import tqdm

HEADLESS_ENV = "SPIRE_HEADLESS"


def live_frontend() -> bool:
    """Whether a person may be looking at this kernel (JupyterLab, a terminal), not a headless run."""
    return os.environ.get(HEADLESS_ENV) != "1"


def progress_bar(iterable=None, *, enabled: bool = True, **options) -> tqdm:
    """A plain tqdm bar on stderr, shown only when `enabled` and someone may watch. Where stderr is
    no terminal (a notebook kernel) every refresh becomes a line of output, so it refreshes rarely."""
    return tqdm(iterable, disable=not (enabled and live_frontend()), file=sys.stderr,
                mininterval=1.0 if sys.stderr.isatty() else 30.0, **options)
