"""What the terminal of `spire run` shows while a notebook runs, and the table the run ends with.

The runner's kernels are headless (`spirelib.frontend`): their progress bars, and `frontend.feed`,
append JSON lines to a file the runner names in `frontend.PROGRESS_ENV` (one per notebook, under
<out>/progress/), never to the notebook's output, so the reports stay clean. `Watch` tails that
file in a thread and shows its latest record as one line: what runs ("train target", "tau of
vanilla, spire", "time AD and SD" with its (B, L) cell), step / total, tokens/s and what the bar adds
(the trainer's loss and tok_s), the notebook's elapsed time and an ETA. On a terminal the line is
rewritten in place (`TICK_S`); elsewhere (CI, a log file) a plain line is printed at most every
`PLAIN_INTERVAL_S`, the first once the notebook has run that long.

The ETA (`eta`): within the notebook's planned seconds (`spirelib.workbook.plan`) it is what the
plan has left, unless the running bar's own measured rate says that bar alone needs longer
((total - n) / rate), which then wins; past the plan, or with no plan (a dry run), the measured
rate alone.
"""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
from pathlib import Path
from typing import Self, TextIO

from spirelib.units import duration
from spirelib.workbook.plan import time_range

TICK_S = 1.0  # a terminal's line is redrawn this often
PLAIN_INTERVAL_S = 30.0  # without a terminal, at most one progress line this often


def clock(seconds: float) -> str:
    """Seconds as m:ss, or h:mm:ss from an hour. Not tqdm's `format_interval`: that truncates and
    pads the minutes ("00:59" for 59.6 s, where this line says "1:00")."""
    s = max(0, round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def eta(record: dict, elapsed: float, planned: float | None) -> tuple[float | None, str]:
    """(seconds left in the notebook, where they come from: "plan" or "rate"); (None, "") when
    neither the plan nor the bar's rate can say (module docstring)."""
    rate, n, total = record.get("rate"), record.get("n"), record.get("total")
    by_rate = (total - n) / rate if rate and total is not None and n is not None and n < total else None
    by_plan = planned - elapsed if planned is not None and not math.isnan(planned) and elapsed < planned else None
    if by_plan is not None and (by_rate is None or by_plan >= by_rate):
        return by_plan, "plan"
    return (by_rate, "rate") if by_rate is not None else (None, "")


def status_line(record: dict | None, elapsed: float, planned: float | None) -> str:
    """One record of a progress file in words, with the notebook's elapsed time and ETA."""
    if record is None:
        parts = []
    else:
        count = f"{record['n']:,}" + (f"/{record['total']:,}" if record.get("total") is not None else "")
        parts = [f"{record['what']} {count} {record.get('unit') or ''}".rstrip()]
        if record.get("tokens_per_s"):
            parts.append(f"{record['tokens_per_s']:,.0f} tokens/s")
        if record.get("postfix"):
            parts.append(str(record["postfix"]))
    left, source = eta(record or {}, elapsed, planned)
    when = f"{clock(elapsed)} elapsed" + (f", ETA {clock(left)} ({source})" if left is not None else "")
    return ", ".join(parts + [when])


class Watch:
    """Shows a running notebook's progress (module docstring) from `path`, the progress file its
    kernel writes, under `header` ("[2/9] 02_train_target"): on `stream` rewritten in place when
    `live`, else as plain lines. A context manager; `printed` says whether it left any line."""

    def __init__(self, header: str, path: Path, planned: float | None, stream: TextIO, live: bool):
        # resolved now: papermill runs the notebook with the process's working directory changed
        self.header, self.planned, self.stream, self.live = header, planned, stream, live
        self.path = Path(path).resolve()
        self.record: dict | None = None
        self.printed, self._shown, self._offset, self._partial = False, False, 0, ""
        self._rates: dict[str, tuple[float, int]] = {}  # what -> (t, n) when first seen: a fed record's rate
        self._start = self._last_plain = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spire-progress", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._tick(final=True)
        if self._shown:  # the outcome line takes the live line's place
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def _run(self) -> None:
        while True:
            self._tick()
            if self._stop.wait(TICK_S):
                return

    def _read(self) -> None:
        if not self.path.is_file():
            return
        with open(self.path) as f:
            f.seek(self._offset)
            chunk = f.read()
            self._offset = f.tell()
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()  # a line the kernel is still writing
        for line in lines:
            if line.strip():
                record = json.loads(line)
                first = self._rates.setdefault(record["what"], (record["t"], record["n"]))
                if record.get("rate") is None and record["t"] > first[0]:
                    record["rate"] = (record["n"] - first[1]) / (record["t"] - first[0])
                self.record = record

    def _tick(self, final: bool = False) -> None:
        self._read()
        now = time.perf_counter()
        line = f"{self.header}: {status_line(self.record, now - self._start, self.planned)}"
        if self.live and not final:
            width = shutil.get_terminal_size().columns - 1
            self.stream.write("\r" + line[:width] + "\x1b[K")
            self._shown = True
        elif not self.live and self.record is not None and now - self._last_plain >= PLAIN_INTERVAL_S:
            self.stream.write(("" if self.printed else "\n") + line + "\n")
            self.printed, self._last_plain = True, now
        else:
            return
        self.stream.flush()


def summary(record: dict, stems: list[str], out_dir: Path, verdict: str | None) -> str:
    """The table a run ends with: each notebook of `stems` (this run's) with its status, time, the
    plan's time (a range where the plan priced decoding over tau) and its report's path; the run's
    totals; then the index's one-line `verdict`."""
    def where(name: str) -> str:
        path = out_dir / name
        try:
            return str(path.resolve().relative_to(Path.cwd()))
        except ValueError:
            return str(path)

    rows = [(stem, record["notebooks"][stem]) for stem in stems]
    def plan(e: dict) -> tuple[float, float]:
        return e["planned_s"], e.get("planned_at_tau_1_s") or e["planned_s"]

    lines = [f"  {'notebook':28s} {'status':8s} {'time':>9s} {'plan':>13s}  report"]
    for stem, e in rows:
        seconds = duration(e["seconds"]) if e.get("seconds") is not None else "-"
        planned = time_range(*plan(e)) if e.get("planned_s") is not None else "-"
        report = where(e["html"]) if e.get("html") else ""
        lines.append(f"  {stem:28s} {e['status']:8s} {seconds:>9s} {planned:>13s}  {report}")
    spent = sum(e.get("seconds") or 0.0 for _, e in rows)
    plans = [plan(e) for _, e in rows if e.get("planned_s") is not None]
    total = time_range(sum(a for a, _ in plans), sum(b for _, b in plans)) if plans else "-"
    lines.append(f"  {'the run':28s} {'':8s} {duration(spent):>9s} {total:>13s}")
    if verdict:
        lines.append(f"verdict: {verdict}")
    return "\n".join(lines)
