"""Whether a person watches this kernel: live widgets and progress bars only then; and the side
channel through which a headless kernel still tells the terminal of `spire run` how far it is.

The workbook runner sets `HEADLESS_ENV` for the kernels it starts. There no live frontend will
ever show a widget (and nbclient can hang on widget comm traffic, jupyter/nbclient#312), and a
progress bar would only leave its refreshes as lines of stderr in the report. Instead, where the
runner also names a file in `PROGRESS_ENV`, every progress bar (and every `feed` call) appends its
state to that file as one JSON line, which the runner tails and shows in its terminal
(`spirelib.workbook.progress`); nothing of it reaches the notebook's output.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time

from tqdm import tqdm

HEADLESS_ENV = "SPIRE_HEADLESS"
PROGRESS_ENV = "SPIRE_PROGRESS_FILE"  # the JSON-lines file a headless kernel reports its progress to
FED_INTERVAL_S = 1.0  # a fed progress bar writes at most one line a second


def live_frontend() -> bool:
    """Whether a person may be looking at this kernel (JupyterLab, a terminal), not a headless run."""
    return os.environ.get(HEADLESS_ENV) != "1"


def feed(what: str, n: int, total: int | None, **fields) -> None:
    """Tell the runner's terminal that `what` is at `n` of `total` (and `fields`: plain values, e.g.
    "rate" per second, "unit", "tokens_per_s", "postfix"), as one JSON line appended to the file of
    `PROGRESS_ENV`; nothing where no runner asked for it."""
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return
    record = {"t": time.time(), "what": what, "n": n, "total": total, **fields}
    with open(path, "a") as f:
        f.write(json.dumps(record, default=str) + "\n")


class _FedBar(tqdm):
    """A tqdm bar that shows nothing and feeds its state (`feed`) at every refresh instead; the
    tokens it has processed per second where each of its steps is `tokens_per_step` tokens."""

    def __init__(self, *args, tokens_per_step: float | None = None, **kwargs):
        self.tokens_per_step = tokens_per_step
        super().__init__(*args, file=io.StringIO(), mininterval=FED_INTERVAL_S, **kwargs)

    def display(self, msg=None, pos=None) -> bool:
        d = self.format_dict
        rate = d["rate"]  # tqdm's smoothed steps per second; None before its second refresh
        if rate is None and d["elapsed"] and d["n"] > d["initial"]:
            rate = (d["n"] - d["initial"]) / d["elapsed"]
        feed(d["prefix"] or "", d["n"], d["total"], rate=rate, unit=d["unit"], postfix=d["postfix"] or "",
             tokens_per_s=None if rate is None or self.tokens_per_step is None else rate * self.tokens_per_step)
        return True


def progress_bar(iterable=None, *, enabled: bool = True, tokens_per_step: float | None = None,
                 **options) -> tqdm:
    """A plain tqdm bar on stderr, shown only when `enabled` and someone may watch. Where stderr is
    no terminal (a notebook kernel) every refresh becomes a line of output, so it refreshes rarely.
    In a headless kernel of `spire run` an enabled bar feeds the runner's terminal instead
    (`PROGRESS_ENV`), with its tokens per second where a step is `tokens_per_step` tokens."""
    if enabled and not live_frontend() and os.environ.get(PROGRESS_ENV):
        return _FedBar(iterable, tokens_per_step=tokens_per_step, **options)
    return tqdm(iterable, disable=not (enabled and live_frontend()), file=sys.stderr,
                mininterval=1.0 if sys.stderr.isatty() else 30.0, **options)
