"""What a training session measures and logs: its steps' seconds (`StepClock`) and metrics.jsonl (`MetricsLog`).

The clock reads the time only once the device has finished the steps it times (`_drain`), and only
where the host waits anyway, so no step makes a host sync; a logging interval's sums come to the
host at once (`host_means`). The log holds one JSON object per log line or evaluation, written by
rank 0 and cut back to the checkpoint's step on resume (`read_metrics` reads it).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch


class MetricsLog:
    """metrics.jsonl, written by rank 0; on resume, entries after the checkpoint are dropped."""

    def __init__(self, path: Path, keep_until: int, enabled: bool):
        self.path, self.enabled = path, enabled
        self.entries = [e for e in read_metrics(path) if e["step"] <= keep_until] if keep_until else []
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(e) + "\n" for e in self.entries))

    def add(self, entry: dict) -> None:
        self.entries.append(entry)
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(entry) + "\n")


def read_metrics(path: Path) -> list[dict]:
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _drain(device: torch.device) -> None:
    """Wait until `device` has finished the work queued on it (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepClock:
    """Seconds of a session's training steps, read only once the device has finished them
    (`_drain`): a step's kernels are queued, and a clock read when `opt.step()` returns would stop
    before the device does. It drains only where the host waits anyway: after the first step (kept
    apart: compilation and warm-up), at a log line, before an evaluation or a checkpoint; steps in
    between run back to back, so no step makes a host sync. Work between steps is not timed."""

    def __init__(self, device: torch.device):
        self.device = device
        self.first_step_s: float | None = None
        self.timed_s, self.timed_steps, self.interval_s = 0.0, 0, 0.0
        self._start, self._pending = time.perf_counter(), 0

    def start(self) -> None:
        """Before a step: a span of back-to-back steps begins here unless one is running."""
        if not self._pending:
            self._start = time.perf_counter()

    def stepped(self) -> None:
        self._pending += 1
        if self.first_step_s is None:
            self.first_step_s = self._bank(timed=False)

    def pause(self) -> None:
        """Drain and bank the running span (before untimed work or reading `interval_s`)."""
        if self._pending:
            self._bank(timed=True)

    def take_interval(self) -> float:
        """Seconds of the steps since the last call (the first step's included)."""
        self.pause()
        seconds, self.interval_s = self.interval_s, 0.0
        return seconds

    def _bank(self, timed: bool) -> float:
        _drain(self.device)
        seconds = time.perf_counter() - self._start
        self.interval_s += seconds
        if timed:
            self.timed_s, self.timed_steps = self.timed_s + seconds, self.timed_steps + self._pending
        self._pending = 0
        return seconds


def host_means(sums: dict[str, torch.Tensor | float], count: int) -> dict[str, float]:
    """Means of a logging interval's sums (device tensors or floats), brought to the host at once:
    one sync for them all."""
    on = next((v.device for v in sums.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
    values = torch.stack([torch.as_tensor(v, device=on).double().reshape(()) for v in sums.values()]).tolist()
    return {k: v / count for k, v in zip(sums, values)}
