"""Timing a generation's sections (draft, verify, bookkeeping, a replayed round) without a host sync.

On the CPU, wall time; on a GPU, CUDA events around each section, read once after the generation
(`SectionTimer`). The engine takes a timer wherever it may be timed; `no_timer` is the one it
uses otherwise.
"""

from __future__ import annotations

import contextlib
import time

import torch


class SectionTimer:
    """Accumulates time per named section (`with timer("verify"): ...`). On the CPU, wall time.
    On a GPU, the device's own time between a section's start and end: a CUDA event recorded at
    each on the current stream, their elapsed times read only when `seconds` is asked for, after
    the generation, with one synchronize for every section recorded since. Timing so adds no host
    sync to a generation, and AD and SD pay alike: a synchronize before and after every section, as
    timed before, made AD wait 4 times a token (2 sections) and SD 8 times a round (4 sections)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self._seconds: dict[str, float] = {}
        self._recorded: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []  # on the device, not read yet

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.device.type != "cuda":
            start = time.perf_counter()
            yield
            self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - start
            return
        stream = torch.cuda.current_stream(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        yield
        end.record(stream)
        self._recorded.append((name, start, end))

    @property
    def seconds(self) -> dict[str, float]:
        """Seconds per section so far; on a GPU this waits once for the device to finish the sections
        recorded since the last read."""
        if self._recorded:
            torch.cuda.synchronize(self.device)
        return self.finished_seconds()

    def finished_seconds(self) -> dict[str, float]:
        """Seconds per section of the sections the device has finished, without waiting for the rest:
        a look while a generation runs (`wallclock`'s round-by-round interleaving)."""
        while self._recorded and self._recorded[0][2].query():
            name, start, end = self._recorded.pop(0)
            self._seconds[name] = self._seconds.get(name, 0.0) + start.elapsed_time(end) / 1000  # ms
        return self._seconds


def no_timer(name: str):
    return contextlib.nullcontext()
