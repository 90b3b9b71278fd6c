"""What a run will cost, before it starts: `spire run --plan`, and the plan every `spire run` prints.

`make_plan` sums each selected notebook's work (`spirelib.workbook.work`: the models it trains, the
contexts it decodes, its fixed cost), each item's seconds here from figures of the real code timed
at the run's own shapes (`spirelib.workbook.probe`), into a `Plan`: item by item and per notebook,
here and on the GPUs of the hardware table, rendered as the terminal shows it (`duration`,
`time_range`). Every run then writes what it measured back (`learn`): each trained model's step
times over its probe's figure, and each notebook's seconds under its identity on this machine,
which the next plan of the same notebook with the same parameters applies (`_ran`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from spirelib.paths import cache_dir
from spirelib.throughput.hardware import GPU_DTYPE, GPU_MFU, GPU_ROOFLINE_FRACTION, HARDWARE
from spirelib.throughput.methods import CARDS
from spirelib.throughput.perfmodel import PAPER_TAU, PAPER_TAU_CONTEXT
from spirelib.throughput.recorded import tau_records
from spirelib.training.checkpoint import checkpoint_path, finished_checkpoint, read_meta
from spirelib.training.devices import resolve_device
from spirelib.units import duration, si
from spirelib.workbook.probe import (
    PROBE_ATTEMPTS,
    PROBE_FORMAT,
    Probe,
    contradicts,
    read_cached,
    timestamp,
    write_cached,
)
from spirelib.workbook.results import read_json
from spirelib.workbook.work import (
    NOTEBOOK_SECONDS,
    WORK,
    Item,
    Models,
    fixed,
)


@dataclass
class Plan:
    """A run's work by notebook (`items`), the machine it was calibrated on and what the
    calibration itself cost (`probe_seconds`; 0 when every probe came from the cache), and the
    machine's calibration in this call (`calibration`, `Speed`; None where nothing was probed). `busy`:
    the probes that stayed noisy or ran on a busy machine (not cached); `replaced`: cached figures
    a measurement of this call contradicted; `notebook_keys`: each notebook's identity (its
    parameters on this machine), under which `learn` keeps its pace."""

    items: list[Item]
    notebooks: list[str]
    machine: str
    probe_seconds: float
    assumptions: list[str]
    busy: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    notebook_keys: dict[str, str] = field(default_factory=dict)
    recalibrated: bool = False
    calibration: dict | None = None

    def seconds(self, notebook: str | None = None) -> float:
        return sum(i.seconds for i in self.items if notebook is None or i.notebook == notebook)

    def seconds_at_tau_1(self, notebook: str | None = None) -> float:
        """The other end of the time's range: decoding at tau 1 where the plan prices a range (longer,
        except where a cell's time is capped: 09's, whose slower runs are fewer)."""
        return sum(i.at_tau_1 for i in self.items if notebook is None or i.notebook == notebook)

    def gpu_seconds(self, device: str, notebook: str | None = None) -> float:
        return sum(i.gpu_seconds[device] for i in self.items if notebook is None or i.notebook == notebook)

    def by_notebook(self) -> dict[str, float]:
        return {nb: self.seconds(nb) for nb in self.notebooks}

    def to_dict(self) -> dict:
        return {"machine": self.machine, "probe_seconds": self.probe_seconds, "assumptions": self.assumptions,
                "busy": self.busy, "replaced": self.replaced, "notebook_keys": self.notebook_keys,
                "calibration": self.calibration,
                "notebooks": {nb: {"seconds": self.seconds(nb), "seconds_at_tau_1": self.seconds_at_tau_1(nb),
                                   "gpu_seconds": {d: self.gpu_seconds(d, nb) for d in HARDWARE}}
                              for nb in self.notebooks},
                "seconds": self.seconds(), "seconds_at_tau_1": self.seconds_at_tau_1(),
                "gpu_seconds": {d: self.gpu_seconds(d) for d in HARDWARE},
                "items": [dataclasses.asdict(i) for i in self.items]}

    def span(self, notebook: str | None = None) -> str:
        """A notebook's (or the run's) time here in words: "4.6 min", or "4.6 - 8.1 min" as a range."""
        return time_range(self.seconds(notebook), self.seconds_at_tau_1(notebook))

    def render(self) -> str:
        """The plan as the terminal shows it: the work item by item with its time here and where that
        figure comes from, then each notebook's time here (a range where decoding is priced over
        tau) and on every GPU of the hardware table, and the run's; then what is assumed, and any
        figure this call refused to cache or replaced."""
        if self.recalibrated:
            calibrated = f"recalibrated in {self.probe_seconds:.0f} s (--recalibrate)"
        elif self.probe_seconds:
            calibrated = f"calibrated now in {self.probe_seconds:.0f} s"
        else:
            calibrated = "calibration from the cache" if self.calibration else "nothing to calibrate"
        lines = [f"plan: {len(self.notebooks)} notebooks on {self.machine} ({calibrated})",
                 f"  {'work':56s} {'tokens':>7s} {'FLOPs':>7s} {'bytes':>7s} {'ctx':>5s} {'here':>13s} from"]
        for nb in self.notebooks:
            lines.append(f"  {nb}")
            for i in (i for i in self.items if i.notebook == nb):
                what = ("  " + i.what + (" (cached)" if i.cached else ""))[:56]
                lines.append(f"  {what:56s} {si(i.train_tokens):>7s} {si(i.flops):>7s} {si(i.bytes):>7s} "
                             f"{i.contexts or '':>5} {time_range(i.seconds, i.at_tau_1):>13s} {i.source}")
        devices = list(HARDWARE)
        lines.append(f"  {'notebook':28s} {'here':>15s} " + " ".join(f"{d:>9s}" for d in devices))
        for nb in [*self.notebooks, None]:
            lines.append(f"  {nb or 'the run':28s} {self.span(nb):>15s} "
                         + " ".join(f"{duration(self.gpu_seconds(d, nb)):>9s}" for d in devices))
        counts = {src: sum(1 for i in self.items if i.source == src) for src in ("run", "probe")}
        lines.append(f"  figures: {counts['run']} from a run on this machine, {counts['probe']} from probes, "
                     "the rest assumed (a notebook's fixed cost)")
        lines += [f"  assumed: {a}" for a in self.assumptions]
        lines += [f"  replaced: {r}" for r in self.replaced]
        if self.busy:
            lines.append(f"  the machine is busy: {len(self.busy)} probes stayed noisy or slow after "
                         f"{PROBE_ATTEMPTS} takes; their figures (the fastest take) are this plan's only, not "
                         "cached; plan again on an idle machine")
            lines += [f"    {b}" for b in self.busy]
        return "\n".join(lines)


def time_range(a: float, b: float) -> str:
    """Two ends of a time's range in words, the shorter first ("4.6 - 8.1 min"); one number where
    they agree within 5%."""
    if math.isnan(a) or not contradicts(a, b, 0.05):
        return duration(a)
    low, high = duration(min(a, b)), duration(max(a, b))
    same_unit = low.rsplit(" ", 1)[-1] == high.rsplit(" ", 1)[-1]
    return f"{low.rsplit(' ', 1)[0] if same_unit else low} - {high}"


def measured_taus(results: dict) -> dict[str, float] | None:
    """Each method's tau as a run's notebook 04 measured it (its mean over the context lengths), from
    that run's results.json; None where it holds none."""
    taus = tau_records(results)
    if not taus:
        return None
    return {m: float(np.mean([t.mean for t in by_l.values()])) for m, by_l in taus.items()}


def measured_spreads(results: dict) -> dict[str, float] | None:
    """Each method's per-context spread of tau (sd, its mean over the context lengths) as a run's
    notebook 04 recorded it: what prices 04's stopping rule (`work.Models.tau_contexts`)."""
    spreads = {m: [t.std for t in by_l.values() if t.std is not None] for m, by_l in tau_records(results).items()}
    return {m: float(np.mean(s)) for m, s in spreads.items() if s} or None


def measured(out_dir: Path | None, series: dict) -> tuple[dict | None, dict | None]:
    """(`measured_taus`, `measured_spreads`) of the last run into `out_dir`, where it ran the same
    `series` (its run.json says so); (None, None) otherwise."""
    if out_dir is None or not (out_dir / "run.json").is_file():
        return None, None
    if read_json(out_dir / "run.json").get("params", {}).get("series") != series:
        return None, None
    recorded = read_json(out_dir / "results.json")
    return measured_taus(recorded), measured_spreads(recorded)


def _notebook_figure(machine: str, notebook: str, parameters: dict) -> Path:
    """Where a run's measured seconds of `notebook` with `parameters` (its resolved parameters, the
    series included) on `machine` are kept (`learn`)."""
    ident = json.dumps({"format": PROBE_FORMAT, "machine": machine, "notebook": notebook, "parameters": parameters},
                       sort_keys=True, default=str)
    return cache_dir() / "plan" / f"notebook-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.json"


def _ran(items: list[Item], figure: dict) -> list[Item]:
    """A notebook's `items` with the seconds a run measured: its work besides training (which its
    models' own figures price) scaled to what the run took for it, one number, from a run."""
    planned = sum(i.seconds for i in items if not i.train_tokens)
    if not planned > 0:
        return items
    scale = figure["seconds"] / planned
    return [i if i.train_tokens else dataclasses.replace(i, seconds=i.seconds * scale, seconds_at_tau_1=None,
                                                         source="run") for i in items]


def make_plan(selected: list[str], parameters: dict[str, dict], series_values: dict,
              taus: dict[str, float] | None = None, recalibrate: bool = False,
              spreads: dict[str, float] | None = None) -> Plan:
    """The plan of a run of the notebooks `selected` (stems, in order) with `parameters` (stem ->
    the notebook's parameters: its defaults with the run's injections over them) and the series
    configuration `series_values`; probes what it has not measured before (`Probe`; everything with
    `recalibrate`). SD rounds come from `taus` (method -> tau: what an earlier run of the same series
    measured, `measured_taus`) where given, else they are priced over a range: the paper's taus (a
    method the paper has none for at its card's relative's, `work.prior_tau`, else at 1) to 1; 04's stopping rule at those taus and the `spreads` that run measured (`measured_spreads`). A notebook that a run on this machine measured with the same parameters (`learn`) costs what
    it took, its training apart."""
    from spirelib.training.series import Series

    series = Series.from_dict(series_values)
    wants_gpu = series.device.startswith("cuda") and not torch.cuda.is_available()
    device = None if wants_gpu else resolve_device(series.device)
    # fp32 on a CPU (bf16 is slow there, and the engine loads fp32); on a GPU a checkpoint keeps its bf16
    probe = Probe(device, torch.bfloat16 if device is not None and device.type == "cuda" and series.imported
                  else torch.float32, recalibrate=recalibrate)
    models = None  # the data and the models' identities, read only when a notebook computes with them
    items, keys = [], {}
    for nb in selected:
        work = [fixed(nb)]
        if nb in WORK:
            models = models or Models(series, probe, {**PAPER_TAU[PAPER_TAU_CONTEXT], **(taus or {})}, not taus,
                                      spreads)
            work += WORK[nb](models, nb, parameters[nb])
        path = _notebook_figure(probe.machine, nb, parameters[nb])
        keys[nb] = path.name
        figure = None if recalibrate or device is None else read_cached(path)
        items += work if figure is None else _ran(work, figure)
    used = {**PAPER_TAU[PAPER_TAU_CONTEXT], **(taus or {})}
    rounds = ("SD rounds at the taus this output folder's last run measured (04): "
              + ", ".join(f"{m} {t:.3g}" for m, t in used.items()) if taus else
              "SD rounds priced over a range of tau, no draft's tau being measured yet: from the paper's at "
              f"L = {PAPER_TAU_CONTEXT} (" + ", ".join(f"{m} {t:.3g}" for m, t in used.items())
              + "; a method it has no tau for at its relative's: " + ", ".join(
                  f"{c.name} as {c.priced_like}" for c in CARDS.values() if c.priced_like)
              + ", else at 1) to 1, every round yielding one token (a "
              "random or untrained draft's)")
    assumptions = [rounds + ", every batch until its slowest row is done"] if models is not None else []
    if parameters.get("04_measure_tau", {}).get("tau_half_width") and "04_measure_tau" in selected:
        assumptions.append("04 decodes each (method, L) until its tau's 95% half-width reaches "
                           f"{parameters['04_measure_tau']['tau_half_width']}: its expected contexts at those taus and "
                           + ("the last run's spreads" if spreads else "the paper's spread (at tau 1 the i.i.d. "
                                                                        "spread, none: the floor)")
                           + " (`stopping.expected_contexts`)")
    if "09_measured_vs_modeled" in selected:
        assumptions.append("09's cells priced at their second look (the runs that fit in cell_seconds, max_repeats at "
                           "most), as if some speedup were unresolved at the first: at most that")
    assumptions.append(f"GPU columns are modeled, not measured: training at {GPU_MFU:.0%} MFU ({GPU_DTYPE}), "
                       f"decoding at {GPU_ROOFLINE_FRACTION:.0%} of the roofline (at the taus above; the paper's "
                       f"where a range), {NOTEBOOK_SECONDS:.0f} s fixed per notebook")
    calibration = probe.speed.first if probe.speed is not None else None
    busy_now = calibration and probe.speed.busy(calibration)
    if busy_now and not probe.busy:
        assumptions.append(f"the machine is busy now ({busy_now}): cached figures kept, none measured")
    return Plan(items, list(selected), probe.machine, probe.seconds, assumptions, probe.busy, probe.replaced, keys,
                recalibrate, calibration)


def learn(plan: Plan, record: dict, run: str) -> list[str]:
    """Writes what the run `record` (run.json's) measured back into the calibration, for the next
    plan: each model `plan` trained, its checkpoint's steady step time (and its first step, where
    that compiled) in place of the probe's figure; each notebook that finished, its seconds less
    its models' training (their checkpoints' wall time), under the notebook's identity on this
    machine (`_notebook_figure`), its pace against the plan, which the next plan of the same
    notebook with the same parameters on this machine applies. A run's figure replaces an earlier
    one; the lines returned name those it contradicts by more than `probe.TOLERANCE` (the plan's own
    figure for a notebook). `run`: the output folder, kept with each figure."""
    lines, trained = [], {}
    for i in plan.items:
        entry = record["notebooks"].get(i.notebook, {})
        if i.learn is None or not finished_checkpoint(Path(i.learn["checkpoint"])):
            continue
        summary = read_meta(checkpoint_path(Path(i.learn["checkpoint"]) / "checkpoint"), verify=False)["summary"]
        trained[i.notebook] = trained.get(i.notebook, 0.0) + summary["tokens"] / summary["run_tokens_per_s"]
        path = cache_dir() / "plan" / i.learn["figure"]
        cached = read_cached(path)
        if cached is None or entry.get("status") != "ok":  # a busy probe was not cached: nothing to complete
            continue
        measured = {"step_s": summary["tokens"] / summary["steps"] / summary["tokens_per_s"]}
        if i.learn["first_step"]:
            measured["first_step_s"] = summary["first_step_s"]
        old = cached["result"]
        for name, value in measured.items():
            if contradicts(value, old[name]):
                lines.append(f"{i.what}: {name[:-2].replace('_', ' ')} {duration(value)} measured, "
                             f"{duration(old[name])} by the {cached['source']}: replaced")
        write_cached(path, {**cached, "result": {**old, **measured}, "source": "run", "run": run, "when": timestamp(),
                      "calibration": plan.calibration or cached["calibration"]})
    for nb in plan.notebooks:
        entry = record["notebooks"].get(nb, {})
        if entry.get("status") != "ok" or nb not in plan.notebook_keys:
            continue
        seconds = entry["seconds"] - trained.get(nb, 0.0)
        if not seconds > 0:  # its training's wall time covers it all: nothing left to learn
            continue
        planned = sum(i.seconds for i in plan.items if i.notebook == nb and not i.train_tokens)
        if contradicts(seconds, planned):
            lines.append(f"{nb}: {duration(seconds)} measured besides training, {duration(planned)} planned: "
                         "the next plan uses the run's")
        write_cached(cache_dir() / "plan" / plan.notebook_keys[nb],
               {"notebook": nb, "seconds": seconds, "source": "run", "run": run, "when": timestamp()})
    return lines
