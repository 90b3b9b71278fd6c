"""What a run will cost, before it starts: `spire run --plan`, and the plan every `spire run` prints.

For each notebook of a params file the plan lists its work, item by item (`Item`): the models it
trains (training tokens, FLOPs, bytes), the contexts it decodes (FLOPs and bytes of the prefills
and rounds), the cells 09 times, and a notebook's fixed cost (kernel start, imports, HTML export).
A model is trained by the first selected notebook that needs it, unless a finished checkpoint of
its identity is already in the cache (then it costs nothing: "cached").

Seconds on this machine come from a quick calibration of the real code at the run's own shapes
(`Probe`), every figure checked before it is kept and cached per shape and machine; every run then
writes what it measured back (`learn`). What no probe can see is assumed and named (decoding's tau
before one is measured: `_decode_item`). Seconds on the GPUs of the hardware table
(`modeling.hardware.HARDWARE`) are a model, not a measurement (`_gpu`).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from spirelib.decoding.drafts import draft_factory, vanilla_draft_config
from spirelib.decoding.speculative import (
    autoregressive_rounds,
    prefill,
    prefill_needs,
    speculative_capacity,
    speculative_rounds,
)
from spirelib.measure import calibrate
from spirelib.measure.cells import timing_cells
from spirelib.model.spire import SpireConfig, SpireDraftModel, ablation
from spirelib.model.transformer import ModelConfig, Transformer
from spirelib.modeling.acceptance import expected_rounds
from spirelib.modeling.hardware import HARDWARE
from spirelib.modeling.perfmodel import PAPER_TAU, PAPER_TAU_CONTEXT
from spirelib.measure.context_loss import sweep_length
from spirelib.modeling.profiled import forward_work
from spirelib.paths import cache_dir
from spirelib.training import pipeline
from spirelib.training.checkpoint import checkpoint_path, finished_checkpoint, read_meta
from spirelib.training.config import TrainConfig
from spirelib.training.data import FlatDocs
from spirelib.training.objectives import SpireObjective, lm_objective
from spirelib.training.train import evaluate, resolve_device, train

#: A notebook's fixed cost on this machine: kernel start, imports, HTML export with its static
#: figures (01, which computes nothing heavy, took 5-6 s in every run of 2026-12-02).
NOTEBOOK_SECONDS = 8.0
#: 09's calibration (`measure.calibrate`: matmul peaks and a copy bandwidth) and its fit.
CALIBRATION_SECONDS = 15.0
#: GPU figures are modeled: training at this MFU (torchtitan's Llama runs on H100 report 35-45%),
#: decoding at this fraction of the roofline. Assumptions, stated with every GPU figure.
GPU_MFU = 0.4
GPU_ROOFLINE_FRACTION = 0.5
GPU_DTYPE = "bf16"
PROBE_STEPS = 4  # trainer steps per training probe: the first (compiling) one and three timed
PROBE_ROUNDS = 3  # decoding rounds timed per method after one warm-up round
PROBE_WINDOWS = 2  # validation windows timed per objective
PROBE_FORMAT = 2  # bumped when what a probe measures changes: older cached probes are not read
#: How far two measurements of one thing may disagree before one is called wrong: a probe's median
#: sample against its fastest, a calibration against the machine's best, a cached figure against a
#: later measurement (a ratio above 1 + TOLERANCE either way).
TOLERANCE = 0.3
#: The calibration figure that says whether the machine is busy, and whether a cached figure was
#: made on a slower machine than now. Only the matmul rate judges: work that competes for these
#: cores slows it first, while the copy bandwidth also drops for a while after a large model's probe
#: on an idle machine (at SmolLM2-135M shapes it read 44-77% of its best), which is no reason to
#: refuse a figure. The bandwidth is kept beside it, for the reader.
BUSY_SIGNAL = "peak_flops"
PROBE_ATTEMPTS = 3  # takes of a noisy or busy probe before the plan gives up caching it


@dataclass(frozen=True)
class Item:
    """One piece of a notebook's work: `seconds` predicted on this machine, `gpu_seconds` per
    device of the hardware table (modeled). `seconds_at_tau_1`: decoding's seconds if every round
    yields one token (tau 1), where the plan prices a range of tau (`_decode_item`), the other end
    of the range from `seconds`; None where the figure is one number. `source`: where the seconds
    come from ("probe", "run", "assumed"). `learn`: what `learn` reads back after the run (a
    trained model: its probe's figure file, its checkpoint, whether its first step compiles)."""

    notebook: str
    what: str
    seconds: float
    flops: float = 0.0
    bytes: float = 0.0
    train_tokens: int = 0
    contexts: int = 0
    cached: bool = False
    gpu_seconds: dict[str, float] = field(default_factory=dict)
    seconds_at_tau_1: float | None = None
    source: str = ""
    learn: dict | None = None

    @property
    def at_tau_1(self) -> float:
        return self.seconds if self.seconds_at_tau_1 is None else self.seconds_at_tau_1

    def times(self, n: int) -> Item:
        """The same work done `n` times over (04's KV-budget sweep: one decoding per budget)."""
        high = None if self.seconds_at_tau_1 is None else n * self.seconds_at_tau_1
        gpu = {name: n * t for name, t in self.gpu_seconds.items()}
        return dataclasses.replace(self, seconds=n * self.seconds, flops=n * self.flops, bytes=n * self.bytes,
                                   contexts=n * self.contexts, gpu_seconds=gpu, seconds_at_tau_1=high)


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
                lines.append(f"  {what:56s} {_si(i.train_tokens):>7s} {_si(i.flops):>7s} {_si(i.bytes):>7s} "
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
    if math.isnan(a) or not _contradicts(a, b, 0.05):
        return duration(a)
    low, high = duration(min(a, b)), duration(max(a, b))
    same_unit = low.rsplit(" ", 1)[-1] == high.rsplit(" ", 1)[-1]
    return f"{low.rsplit(' ', 1)[0] if same_unit else low} - {high}"


def _si(x: float) -> str:
    if not x:
        return ""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def duration(seconds: float) -> str:
    """Seconds as the plan and the run's summary show them: "8.0 s", "42 s", "3.5 min", "1.2 h".
    Not tqdm's `format_interval`: its clock form ("03:30", "1:12:00") is not the units these sentences read in."""
    if math.isnan(seconds):
        return "-"
    if seconds < 0.05:
        return "0 s"
    if seconds < 90:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


# ---------------------------------------------------------------------------- the probes


def machine_name(device: torch.device) -> str:
    """What the probes' cache key says of the machine: device, its name, threads, torch."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
    return f"{device.type}: {name}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def _contradicts(a: float, b: float, tolerance: float = TOLERANCE) -> bool:
    """Whether `a` and `b` differ by more than `tolerance` (a ratio above 1 + tolerance either way);
    never for a NaN or a zero, which no measurement contradicts."""
    if not (a > 0 and b > 0):
        return False
    return max(a, b) / min(a, b) > 1 + tolerance


def _noisy(samples: list[float]) -> bool:
    """Whether a probe's timed samples (its steps or rounds) disagree: the median more than
    `TOLERANCE` slower than the fastest, which a one-off hiccup (one slow sample of three) is not."""
    return len(samples) > 1 and _contradicts(statistics.median(samples), min(samples))


def _fastest(a: dict, b: dict) -> dict:
    """Two takes of a probe merged figure by figure, the faster kept (what other work on the machine
    slowed is the slower); a first step keeps its first take, later takes reusing its compilation."""
    return {k: (a[k] if k == "first_step_s" else _fastest(a[k], b[k]) if isinstance(a[k], dict)
                else min(a[k], b[k])) for k in a}


def _write(path: Path, entry: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(entry, f, indent=1)
    os.replace(tmp, path)


def _read(path: Path) -> dict | None:
    """A cached figure, or None where there is none or it is unreadable (a partial write of an older
    version: measured again)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


class Speed:
    """The machine's speed now and the best it has shown: `calibrate.quick` (a matmul rate and a
    copy bandwidth) measured in this call, against the best quick calibration of this machine kept
    in the cache (cache_dir()/plan/machine-*.json, raised whenever a calibration beats it; reset by
    `--recalibrate`). A matmul rate (`BUSY_SIGNAL`) more than `TOLERANCE` below its best says the
    machine is busy."""

    def __init__(self, device: torch.device, dtype: torch.dtype, machine: str, reset: bool = False):
        self.device, self.dtype = device, dtype
        ident = hashlib.sha256(json.dumps([PROBE_FORMAT, machine, str(dtype)]).encode()).hexdigest()[:16]
        self.path = cache_dir() / "plan" / f"machine-{ident}.json"
        self.reset = reset
        self.first: dict | None = None  # this call's first calibration, against which cached figures are read

    def measure(self) -> dict:
        """A calibration now ({"peak_flops", "bandwidth"}), the machine's best raised by it."""
        now = calibrate.quick(str(self.device), self.dtype)
        best = None if self.reset else _read(self.path)
        self.reset = False
        if best is None or any(now[k] > best[k] for k in now):
            _write(self.path, {k: max(now[k], (best or now)[k]) for k in now})
        self.first = self.first or now
        return now

    def now(self) -> dict:
        """This call's calibration (`measure`d once, at first need)."""
        return self.first or self.measure()

    def best(self) -> dict:
        return _read(self.path) or self.now()

    def busy(self, calibration: dict) -> str | None:
        """Why `calibration` says the machine is busy, or None."""
        now, best = calibration[BUSY_SIGNAL], self.best()[BUSY_SIGNAL]
        return f"matmul rate {now / best:.0%} of its best" if now < best and _contradicts(now, best) else None


class Probe:
    """Times the real code at a run's shapes, each measurement checked (`Speed`, `_noisy`) and
    cached under cache_dir()/plan by what it timed and on which machine. `seconds` is what this
    probe spent measuring (cached measurements cost nothing); `busy` the probes this call could not
    cache, `replaced` the cached figures it retook.

    What it times: a few steps of the real trainer for every training recipe (target, vanilla
    draft, SPIRe draft; compiled where the recipe compiles, so the first step carries the
    compilation), validation windows of each objective, a checkpoint save, and a few rounds of
    every method's real decoding loop at every (B, L) the run decodes, after a real prefill.
    Models are random (a model's speed does not depend on its weights); an imported target is
    built from its config.json, no weight is read.

    A timing made while other work shares the machine is wrong, and a cached one stays wrong, so
    every figure is checked before it is kept: against its own repeats (the timed steps or rounds
    of one probe; a probe whose median sample is more than `TOLERANCE` slower than its fastest is
    noisy) and against the machine's own calibration made in the same call, seconds after (`Speed`:
    busy). A noisy or busy probe is retaken (`PROBE_ATTEMPTS` in all); if it stays so, the plan uses
    its fastest take, says the machine is busy, and caches nothing. A cached figure made while the
    machine ran more than `TOLERANCE` slower than it runs now is contradicted, and retaken. A second
    plan of the same shapes costs a calibration only; `spire run --recalibrate` measures everything
    again."""

    def __init__(self, device: torch.device | None, dtype: torch.dtype = torch.float32, recalibrate: bool = False):
        """`device` None: the run's device is not on this machine (a GPU run planned on a laptop);
        every time here is then unknown (NaN), and only the modeled GPU columns are filled.
        `recalibrate`: every figure is measured again, and the machine's best calibration too."""
        self.device, self.dtype, self.recalibrate = device, dtype, recalibrate
        self.machine = "this machine, which lacks the run's device" if device is None else machine_name(device)
        self.speed = None if device is None else Speed(device, dtype, self.machine, reset=recalibrate)
        self.seconds = 0.0
        self.busy: list[str] = []
        self.replaced: list[str] = []

    def path(self, kind: str, key: dict) -> Path:
        """Where the figure of probe `kind` at `key` on this machine is cached."""
        ident = json.dumps({"format": PROBE_FORMAT, "kind": kind, "machine": self.machine,
                            "dtype": str(self.dtype), **key}, sort_keys=True, default=str)
        return cache_dir() / "plan" / f"{kind}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.json"

    def _cached(self, kind: str, key: dict, measure, what: str) -> dict | None:
        """The figure of `kind` at `key` with its "source" ("run" or "probe") and "figure" (its
        cache file): the cached one unless `recalibrate` or this call's calibration contradicts it
        (the machine runs more than `TOLERANCE` faster than when it was measured), else measured
        (`_measure`: checked, retaken) and cached unless the machine stayed busy."""
        if self.device is None:
            return None
        path = self.path(kind, key)
        entry = None if self.recalibrate else _read(path)
        if entry is not None:
            then, now = entry["calibration"][BUSY_SIGNAL], self.speed.now()[BUSY_SIGNAL]
            if not (now > then and _contradicts(now, then)):
                return {**entry["result"], "source": entry["source"], "figure": path.name}
            self.replaced.append(f"{what}: measured by a {entry['source']} while the machine ran at "
                                 f"{then / now:.0%} of its speed now; measured again")
        result, calibration = self._measure(measure, what)
        if calibration is not None:
            _write(path, {"key": kind, "result": result, "source": "probe", "calibration": calibration,
                          "when": _now()})
        return {**result, "source": "probe", "figure": path.name}

    def _measure(self, measure, what: str) -> tuple[dict, dict | None]:
        """`measure()` -> (figures, sample lists) taken until a take is neither noisy (its samples
        disagree) nor made on a busy machine (a calibration right after it is slow): (the figures,
        that calibration), or after `PROBE_ATTEMPTS` takes (their fastest, None), `what` named in
        `busy`."""
        best, why = None, ""
        for _ in range(PROBE_ATTEMPTS):
            start = time.perf_counter()
            figures, samples = measure()
            calibration = self.speed.measure()
            busy = self.speed.busy(calibration)
            self.seconds += time.perf_counter() - start
            best = figures if best is None else _fastest(best, figures)
            noisy = [f"{statistics.median(x) / min(x):.2f}x its fastest" for x in samples if _noisy(x)]
            if not busy and not noisy:
                return best, calibration
            why = "; ".join(([f"samples at {noisy[0]}"] if noisy else []) + ([busy] if busy else []))
        self.busy.append(f"{what}: {why}")
        return best, None

    def _target(self, cfg: ModelConfig) -> Transformer:
        torch.manual_seed(0)
        return Transformer(cfg).to(device=self.device, dtype=self.dtype).eval()

    def training(self, kind: str, cfg: ModelConfig, train_cfg: TrainConfig, spire: SpireConfig | None = None) -> dict:
        """{"first_step_s", "step_s", "eval_window_s", "save_s"} of a recipe: `kind` "lm" trains a
        Transformer `cfg`, "spire" a SPIRe draft `spire` of a target `cfg` (k-pass, MixedLoss); its
        timed steps are the samples `_measure` checks."""
        probe_cfg = dataclasses.replace(train_cfg, steps=PROBE_STEPS, tokens_per_param=0.0, eval_every=0,
                                        eval_windows=PROBE_WINDOWS, checkpoint_every=10**9, log_every=1)
        key = {"model": cfg.to_dict(), "spire": None if spire is None else spire.to_dict(),
               "train": {f: getattr(train_cfg, f) for f in ("batch_size", "seq_len", "compile", "micro_batch_size")}}

        def measure():
            if kind == "spire":
                target = self._target(cfg)
                model, objective = SpireDraftModel.from_target(target, spire), SpireObjective(target)
            else:
                torch.manual_seed(0)
                model, objective = Transformer(cfg), lm_objective
            tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, 4 * train_cfg.batch_size
                                                       * (train_cfg.seq_len + 1) + 1)
            docs = FlatDocs(tokens, np.array([0]), np.array([len(tokens)]))
            with tempfile.TemporaryDirectory() as tmp:
                start = time.perf_counter()
                result = train(model, objective, docs, probe_cfg, run_dir=Path(tmp), identity={"plan-probe": kind},
                               device=str(self.device), progress=False)
                wall = time.perf_counter() - start
            summary = result.summary
            step_s = train_cfg.tokens_per_step() / summary["tokens_per_s"]
            windows = torch.from_numpy(docs.sample_windows(np.random.default_rng(1), PROBE_WINDOWS,
                                                           train_cfg.seq_len + 1))
            model = result.model
            start = time.perf_counter()
            with torch.no_grad():
                evaluate(model, objective, windows, train_cfg.batch_size, self.device)
            eval_window_s = (time.perf_counter() - start) / PROBE_WINDOWS
            save_s = max(0.0, wall - summary["first_step_s"] - (PROBE_STEPS - 1) * step_s)
            steps = [train_cfg.tokens_per_step() / m["tokens_per_s"] for m in result.metrics
                     if m.get("kind") == "train" and m["step"] > 1]
            return {"first_step_s": summary["first_step_s"], "step_s": step_s, "eval_window_s": eval_window_s,
                    "save_s": save_s}, [steps]

        model = f"SPIRe draft training ({spire.num_layers} blocks" if kind == "spire" else \
            f"LM training ({cfg.num_layers} x {cfg.d_model}"
        what = f"{model}, B {train_cfg.batch_size}, T {train_cfg.seq_len})"
        return self._cached(f"train-{kind}", key, measure, what) or dict.fromkeys(
            ("first_step_s", "step_s", "eval_window_s", "save_s"), math.nan)

    def evaluation(self, cfg: ModelConfig, seq_len: int, batch_size: int) -> dict:
        """{"eval_window_s"}: the target's loss over validation windows of `seq_len` + 1 tokens."""
        def measure():
            model = self._target(cfg)
            windows = torch.randint(0, cfg.vocab_size, (PROBE_WINDOWS, seq_len + 1))
            evaluate(model, lm_objective, windows, batch_size, self.device)  # warm-up
            start = time.perf_counter()
            with torch.no_grad():
                evaluate(model, lm_objective, windows, batch_size, self.device)
            return {"eval_window_s": (time.perf_counter() - start) / PROBE_WINDOWS}, []

        return (self._cached("eval", {"model": cfg.to_dict(), "seq_len": seq_len, "batch": batch_size}, measure,
                             f"evaluation ({cfg.num_layers} x {cfg.d_model}, T {seq_len})")
                or {"eval_window_s": math.nan})

    def decoding(self, cfg: ModelConfig, spire: SpireConfig, magicdec: dict, guided: dict, methods: list[str],
                 batch: int, context: int, new_tokens: int, k: int, temperature: float) -> dict:
        """{"prefill_s", "ad_step_s", "round_s": {method: s}} at (B, L) = (`batch`, `context`): one
        real prefill, then `PROBE_ROUNDS` rounds of each method's real loop after a warm-up round
        (MagicDec and the guided draft with the series' options, `magicdec` and `guided`)."""
        key = {"model": cfg.to_dict(), "spire": spire.to_dict(), "magicdec": magicdec, "guided": guided,
               "methods": sorted(methods),
               "batch": batch, "context": context, "new_tokens": new_tokens, "k": k, "temperature": temperature}

        # enough tokens that no row can finish before the timed rounds (a round emits at most k + 1)
        G = max(new_tokens, (PROBE_ROUNDS + 1) * (k + 1))

        def measure():
            target = self._target(cfg)
            models = {"vanilla": Transformer(vanilla_draft_config(cfg)) if "vanilla" in methods else None,
                      "spire": SpireDraftModel.from_target(target, spire) if "spire" in methods else None}
            options = {"magicdec": magicdec, "guided": guided}
            factories = {m: draft_factory(m, target, None if models.get(m) is None else models[m].to(self.device),
                                          temperature=temperature, **options.get(m, {})) for m in methods}
            contexts = torch.randint(0, cfg.vocab_size, (batch, context), device=self.device)
            drafts = {m: f() for m, f in factories.items()}
            needs = prefill_needs(drafts.values(), k)
            start = time.perf_counter()
            shared = prefill(target, contexts, capacity=speculative_capacity(context, G, k), **needs)
            prefill_s = time.perf_counter() - start
            rounds = {m: speculative_rounds(target, d, contexts, G, k=k, temperature=temperature,
                                            generator=torch.Generator(self.device).manual_seed(0),
                                            prefilled=shared.copy()) for m, d in drafts.items()}
            rounds["ad"] = autoregressive_rounds(target, contexts, G, temperature=temperature,
                                                 generator=torch.Generator(self.device).manual_seed(0),
                                                 prefilled=shared.copy())
            seconds, samples = {}, []
            for m, loop in rounds.items():
                next(loop)  # the prefill's reuse, the draft's begin and one round: warm-up
                times = []
                for _ in range(PROBE_ROUNDS):
                    start = time.perf_counter()
                    next(loop)
                    times.append(time.perf_counter() - start)
                seconds[m] = statistics.median(times)
                samples.append(times)
            return {"prefill_s": prefill_s, "ad_step_s": seconds.pop("ad"), "round_s": seconds}, samples

        return self._cached("decode", key, measure, f"decoding at B {batch}, L {context}") or {"prefill_s": math.nan, "ad_step_s": math.nan,
                                                        "round_s": dict.fromkeys(methods, math.nan)}


# ---------------------------------------------------------------------------- work


def _gpu(flops: float, moved: float, *, training: bool) -> dict[str, float]:
    """Modeled seconds per device of the hardware table: FLOPs over the bf16 dense peak at `GPU_MFU`
    for training, the roofline max(FLOPs / peak, bytes / bandwidth) at `GPU_ROOFLINE_FRACTION` for
    decoding (a notebook's fixed cost is added per item, `_fixed`). No GPU timing goes into them."""
    out = {}
    for name, hw in HARDWARE.items():
        peak = hw.peak_flops.get(GPU_DTYPE, max(hw.peak_flops.values()))
        t = flops / (peak * GPU_MFU) if training else max(flops / peak, moved / hw.bandwidth) / GPU_ROOFLINE_FRACTION
        out[name] = t
    return out


def _fixed(notebook: str, what: str = "kernel start, imports, HTML export", seconds: float = NOTEBOOK_SECONDS) -> Item:
    return Item(notebook, what, seconds, gpu_seconds={d: seconds for d in HARDWARE}, source="assumed")


def training_work(cfg: ModelConfig, train_cfg: TrainConfig, trained: ModelConfig, spire: SpireConfig | None,
                  budget_params: int) -> tuple[int, int, float, float]:
    """(steps, tokens, FLOPs, bytes) of a training run: forward and backward of the trained model
    (3 forwards' FLOPs, its unembedding included) over every training token, the frozen target's
    forward with its unembedding (a SPIRe draft's teacher), and the validation windows' forwards.
    A SPIRe draft's k passes each run only the positions they predict (method §3.6: a block's j-th
    position in pass j), so every position goes through its body and unembedding once. Bytes:
    every step reads and writes the trained weights, their gradients and both Adam moments (fp32),
    and reads the frozen target once."""
    steps = train_cfg.total_steps(budget_params)
    tokens = steps * train_cfg.tokens_per_step()
    eval_tokens = _evaluations(train_cfg, steps) * train_cfg.eval_windows * train_cfg.seq_len
    T = train_cfg.seq_len
    draft = forward_work(trained.shape(), trained.vocab_size, train_cfg.batch_size, T, T // 2)
    step_flops = 3 * draft.flops
    eval_flops = draft.flops / (train_cfg.batch_size * T)
    moved = 16.0 * trained.num_params() * steps
    if spire is not None:
        teacher = forward_work(cfg.shape(), cfg.vocab_size, train_cfg.batch_size, T, T // 2)
        step_flops += teacher.flops
        eval_flops += teacher.flops / (train_cfg.batch_size * T)
        moved += teacher.bytes * steps
    return steps, tokens, step_flops * steps + eval_flops * eval_tokens, moved


def _evaluations(train_cfg: TrainConfig, steps: int) -> int:
    """How many times the trainer scores its validation windows: every `eval_every` steps and at the end."""
    return (steps - 1) // train_cfg.eval_every + 1 if train_cfg.eval_every else 1


def _train_item(notebook: str, what: str, probe: dict, cfg: ModelConfig, train_cfg: TrainConfig,
                trained: ModelConfig, spire: SpireConfig | None, budget_params: int, cached: bool,
                warm: bool = False, checkpoint: Path | None = None) -> Item:
    """A training run's work and seconds: its first step (the probe's, which compiles and warms up; with
    `warm`, an ordinary step: the notebook's process has run the same graphs already), its other
    steps, evaluations and saves. `checkpoint`: where the run will leave the model, whose measured
    step times `learn` writes back over the probe's figure."""
    steps, tokens, flops, moved = training_work(cfg, train_cfg, trained, spire, budget_params)
    if cached:
        return Item(notebook, what, 0.0, flops, moved, tokens, cached=True, gpu_seconds={d: 0.0 for d in HARDWARE})
    saves = (steps - 1) // train_cfg.checkpoint_every + 1  # every checkpoint_every steps and at the end
    seconds = (probe["step_s" if warm else "first_step_s"] + (steps - 1) * probe["step_s"]
               + _evaluations(train_cfg, steps) * train_cfg.eval_windows * probe["eval_window_s"]
               + saves * probe["save_s"])
    learn = ({"figure": probe["figure"], "checkpoint": str(checkpoint), "first_step": not warm}
             if checkpoint is not None and probe.get("figure") else None)
    return Item(notebook, what, seconds, flops, moved, tokens, gpu_seconds=_gpu(flops, moved, training=True),
                source=probe.get("source", ""), learn=learn)


def _decode_item(notebook: str, what: str, probe: dict, cfg: ModelConfig, spire: SpireConfig, methods: list[str],
                 runs: int, batch: int, context: int, new_tokens: int, k: int, *, ad: bool = False,
                 contexts: int | None = None, magicdec_keys: int = 65, taus: dict[str, float] | None = None,
                 ranged: bool = False, loss: bool = False) -> Item:
    """`runs` batches of B = `batch` contexts of L = `context` tokens: one shared prefill each, then
    with `loss` the target's loss on the continuation read from it (04: `new_tokens` positions over
    its cache, priced at the prefill's measured seconds per FLOP), then
    every method's rounds (and AD's steps with `ad`); MagicDec drafts over `magicdec_keys` (sink +
    window) of the target's cache, the guided draft over as many; each method's rounds at its tau in
    `taus` (default the paper's; tau 1 for a method neither has, its slowest).
    `ranged`: no tau is measured (no draft exists, or none was measured here), so the seconds are a
    range, from the paper's taus at L = 512 (method §5) to `seconds_at_tau_1` at tau 1 (every round
    yields one token: G rounds); rounds per batch are `acceptance.expected_rounds` (a batch runs
    until its slowest row is done)."""
    taus = taus or PAPER_TAU[PAPER_TAU_CONTEXT]
    pre = forward_work(cfg.shape(), cfg.vocab_size, batch, context, context // 2, logits=False)
    seconds, flops, moved = probe["prefill_s"], pre.flops, pre.bytes
    if loss:
        read = forward_work(cfg.shape(), cfg.vocab_size, batch, new_tokens, context + new_tokens // 2)
        seconds += probe["prefill_s"] * read.flops / pre.flops
        flops, moved = flops + read.flops, moved + read.bytes
    high = seconds
    keys = context + new_tokens // 2
    verify = forward_work(cfg.shape(), cfg.vocab_size, batch, k + 1, keys)
    for m in methods:
        rounds = expected_rounds(taus.get(m, 1.0), k, new_tokens, batch)  # a method no tau is known for: tau 1
        seconds += rounds * probe["round_s"][m]
        high += expected_rounds(1.0, k, new_tokens, batch) * probe["round_s"][m]
        if m == "vanilla":
            step = forward_work(vanilla_draft_config(cfg).shape(), cfg.vocab_size, batch, 1, keys)
        elif m == "spire":
            step = forward_work(dataclasses.replace(cfg, num_layers=spire.num_layers).shape(), cfg.vocab_size, batch,
                                1, spire.sink + spire.window)
        elif m == "lookup":  # no model drafts: the round is its verification
            step = dataclasses.replace(verify, flops=0.0, bytes=0.0)
        else:  # MagicDec and the guided draft: the target over their sink + window (+ chosen) entries
            step = forward_work(cfg.shape(), cfg.vocab_size, batch, 1, min(keys, magicdec_keys))
        flops += rounds * (verify.flops + k * step.flops)
        moved += rounds * (verify.bytes + k * step.bytes)
    if ad:
        seconds += new_tokens * probe["ad_step_s"]
        high += new_tokens * probe["ad_step_s"]
        step = forward_work(cfg.shape(), cfg.vocab_size, batch, 1, keys)
        flops, moved = flops + new_tokens * step.flops, moved + new_tokens * step.bytes
    return Item(notebook, what, runs * seconds, runs * flops, runs * moved,
                contexts=runs * batch if contexts is None else contexts,
                gpu_seconds=_gpu(runs * flops, runs * moved, training=False),
                seconds_at_tau_1=runs * high if ranged else None, source=probe.get("source", ""))


class _Models:
    """The series' models as the plan sees them: each one's identity and whether the cache holds
    it finished, trained by the first selected notebook that needs it."""

    def __init__(self, series, probe: Probe, taus: dict[str, float], ranged: bool):
        self.series, self.probe, self.done, self.taus, self.ranged = series, probe, set(), taus, ranged
        self.started: set = set()  # (notebook, what a SPIRe run compiles): run once in that notebook's process
        self.target_cfg = series.target
        self.target_hash, self.target_dir, self.vanilla_dir, self.spire_dir = pipeline.planned_run_dirs(
            series.target, series.target_training, series.data(), series.imported)

    def decode(self, notebook: str, what: str, methods, batch: int, context: int, runs: int, *, ad: bool = False,
               contexts: int | None = None, loss: bool = False) -> Item:
        """`runs` batches decoded at (B, L) = (`batch`, `context`) with `methods` (and AD with `ad`),
        timed by a probe of the series' decoding at that cell; with `loss`, the target's loss on the
        continuation read from each batch's prefill (04)."""
        s = self.series
        probe = self.probe.decoding(self.target_cfg, s.spire, dataclasses.asdict(s.magicdec), s.guided_options(),
                                    list(methods), batch, context, s.new_tokens, s.k, s.temperature)
        return _decode_item(notebook, what, probe, self.target_cfg, s.spire, list(methods), runs, batch, context,
                            s.new_tokens, s.k, ad=ad, contexts=contexts, loss=loss,
                            magicdec_keys=s.magicdec.sink + s.magicdec.window, taus=self.taus, ranged=self.ranged)

    def needs(self, name: str) -> bool:
        """True once per model: the first notebook that needs `name` carries its training."""
        if name in self.done:
            return False
        self.done.add(name)
        return True

    def target(self, notebook: str) -> list[Item]:
        s = self.series
        if not self.needs("target"):
            return []
        if s.imported:
            t = s.target_training
            probe = self.probe.evaluation(self.target_cfg, t.seq_len, t.batch_size)
            work = forward_work(self.target_cfg.shape(), self.target_cfg.vocab_size, 1, t.seq_len, t.seq_len // 2)
            flops = work.flops * t.eval_windows
            return [Item(notebook, f"evaluate the imported target on {t.eval_windows} windows of {t.seq_len}",
                         t.eval_windows * probe["eval_window_s"], flops, work.bytes * t.eval_windows,
                         contexts=t.eval_windows, gpu_seconds=_gpu(flops, 0.0, training=True),
                         source=probe.get("source", ""))]
        cached = finished_checkpoint(self.target_dir)
        probe = {} if cached else self.probe.training("lm", s.target, s.target_training)
        return [_train_item(notebook, f"train the target ({s.target.num_layers} x {s.target.d_model})", probe,
                            s.target, s.target_training, s.target, None, s.target.num_params(), cached,
                            checkpoint=self.target_dir)]

    def vanilla(self, notebook: str) -> list[Item]:
        s = self.series
        if not self.needs("vanilla"):
            return []
        cfg = vanilla_draft_config(self.target_cfg)
        cached = finished_checkpoint(self.vanilla_dir(s.vanilla_training))
        probe = {} if cached else self.probe.training("lm", cfg, s.vanilla_training)
        return [_train_item(notebook, f"train the vanilla draft ({cfg.num_layers} x {cfg.d_model})", probe, cfg,
                            s.vanilla_training, cfg, None, cfg.num_params(), cached,
                            checkpoint=self.vanilla_dir(s.vanilla_training))]

    def spire(self, notebook: str, variant: str = "spire", train_cfg: TrainConfig | None = None,
              label: str | None = None) -> list[Item]:
        s = self.series
        cfg, train_cfg = ablation(variant, s.spire), train_cfg or s.spire_training
        if not self.needs(("spire", cfg, train_cfg)):
            return []
        trained = dataclasses.replace(self.target_cfg, num_layers=cfg.num_layers)
        cached = finished_checkpoint(self.spire_dir(cfg, train_cfg))
        # every variant trains at the cost of the series' SPIRe draft of its depth
        probe = {} if cached else self.probe.training("spire", self.target_cfg, train_cfg,
                                                      dataclasses.replace(s.spire, num_layers=cfg.num_layers))
        with torch.device("meta"):  # the trainer's budget counts the draft's trainable parameters
            draft = SpireDraftModel.from_target(Transformer(self.target_cfg), cfg, device="meta")
        budget = sum(p.numel() for p in draft.parameters() if p.requires_grad)
        # A variant's graphs (compiled, `SpireObjective.compiled`) are those of an earlier run in the same
        # notebook where the shapes, the target layers read and the loss agree: its first step is then warm.
        graphs = (notebook, train_cfg.batch_size, train_cfg.seq_len, train_cfg.micro_batch_size, train_cfg.compile,
                  cfg.num_layers, cfg.target_activations, cfg.loss, cfg.mix_weight)
        warm = not cached and graphs in self.started
        if not cached:
            self.started.add(graphs)
        return [_train_item(notebook, label or f"train the SPIRe draft ({cfg.num_layers} blocks, k = {cfg.k})", probe,
                            self.target_cfg, train_cfg, trained, cfg, budget, cached, warm,
                            checkpoint=self.spire_dir(cfg, train_cfg))]


def _target_notebook(models: _Models, nb: str, p: dict) -> list[Item]:
    return models.target(nb)


def _drafts_notebook(models: _Models, nb: str, p: dict) -> list[Item]:
    return models.target(nb) + models.vanilla(nb) + models.spire(nb)


def _tau_notebook(models: _Models, nb: str, p: dict) -> list[Item]:
    items = models.target(nb) + models.vanilla(nb) + models.spire(nb)
    B, methods = p["decode_batch_size"], p["methods"]
    runs = -(-p["n_contexts"] // B)  # batches per L
    trained_on, G = models.series.target_training.seq_len, models.series.new_tokens
    items += [models.decode(nb, f"tau of {', '.join(methods)} and the target's loss at L = {L}"
                            + (f" (past the {trained_on}-token training windows)" if L + G > trained_on else ""),
                            methods, B, L, runs, contexts=p["n_contexts"], loss=True)
              for L in p["context_lengths"]]
    budgets = p.get("kv_budgets") or []
    if budgets:  # MagicDec and the guided draft at each budget, priced at the series' own budget
        L = sweep_length(p["context_lengths"], G, trained_on, p.get("kv_budget_context") or 0)
        sweep = models.decode(nb, f"KV-budget sweep: MagicDec and guided at {len(budgets)} budgets, L = {L}",
                              ["magicdec", "guided"], B, L, runs, contexts=p["n_contexts"])
        items.append(sweep.times(len(budgets)))
    return items


def _ablation_notebook(models: _Models, nb: str, p: dict) -> list[Item]:
    s = models.series
    items = models.target(nb)
    for seed in p["ablation_seeds"]:
        budget = s.training(p["ablation_training"], "ablation_training", seed=seed)
        for variant in p["ablations"]:
            items += models.spire(nb, variant, budget, f"train the {variant} variant, seed {seed}")
    budget = s.training(p["ablation_training"], "ablation_training", seed=p["ablation_seeds"][0])
    probe = models.probe.training("spire", models.target_cfg, budget, s.spire)
    evals = len(p["ablations"]) * budget.eval_windows  # each window: the teacher's and the draft's forward
    T = budget.seq_len
    draft_cfg = dataclasses.replace(models.target_cfg, num_layers=s.spire.num_layers)
    flops = evals * sum(forward_work(c.shape(), c.vocab_size, 1, T, T // 2).flops
                        for c in (models.target_cfg, draft_cfg))
    items.append(Item(nb, f"score {len(p['ablations'])} variants at step 0 ({budget.eval_windows} windows each)",
                      evals * probe["eval_window_s"], flops, contexts=evals,
                      gpu_seconds=_gpu(flops, 0.0, training=True), source=probe.get("source", "")))
    B, L = p["decode_batch_size"], p["ablation_context_length"]
    runs = len(p["ablation_seeds"]) * len(p["ablations"]) * -(-p["n_contexts"] // B)
    items.append(models.decode(nb, f"tau of {len(p['ablations'])} variants x {len(p['ablation_seeds'])} seeds at "
                               f"L = {L}", ["spire"], B, L, runs))
    return items


def _timing_notebook(models: _Models, nb: str, p: dict) -> list[Item]:
    """09's work: its models, the calibration and the profiled fit, and every cell's runs; a cell is
    assumed to run until its time is up (`cell_seconds`), as its wide CIs at B >= 16 make it."""
    items = models.target(nb) + models.vanilla(nb) + models.spire(nb)
    items.append(_fixed(nb, "calibration and the profiled fit", CALIBRATION_SECONDS))
    methods = p["timing_methods"]
    limit = max(p["repeats"], p["max_repeats"])
    def runs(one: float) -> int:  # measure.wallclock.time_cells' rule, its CIs never narrow enough to stop early
        fit = limit + 1 if math.isnan(one) else math.floor(p["cell_seconds"] / max(one, 1e-9)) + 1
        return max(p["repeats"] + 1, min(limit + 1, fit))

    for batch, context in timing_cells(p["timing_batches"], p["timing_contexts"], p["held_out"]):
        one = models.decode(nb, "", methods, batch, context, 1, ad=True)  # a run of every method and AD
        n, n_high = runs(one.seconds), runs(one.at_tau_1)  # slower runs at tau 1: fewer fit in cell_seconds
        item = models.decode(nb, f"time AD and {len(methods)} methods at B = {batch}, L = {context}, "
                             f"{n}{'' if n == n_high else f' ({n_high} at tau 1)'} runs", methods, batch, context,
                             n, ad=True)
        items.append(item if item.seconds_at_tau_1 is None
                     else dataclasses.replace(item, seconds_at_tau_1=n_high * one.at_tau_1))
    return items


#: The work of each notebook that computes with the series' models, from its resolved parameters
#: (its injections over its defaults); the others are numpy and cost their fixed seconds.
WORK = {"02_train_target": _target_notebook, "03_train_drafts": _drafts_notebook, "04_measure_tau": _tau_notebook,
        "05_ablations": _ablation_notebook, "09_measured_vs_modeled": _timing_notebook}


def measured_taus(results: dict) -> dict[str, float] | None:
    """Each method's tau as a run's notebook 04 measured it (its mean over the context lengths), from
    that run's results.json; None where it holds none."""
    taus = results.get("04_measure_tau", {}).get("tau")
    if not taus:
        return None
    return {m: float(np.mean([v["mean"] for v in by_l.values()])) for m, by_l in taus.items()}


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
              taus: dict[str, float] | None = None, recalibrate: bool = False) -> Plan:
    """The plan of a run of the notebooks `selected` (stems, in order) with `parameters` (stem ->
    the notebook's parameters: its defaults with the run's injections over them) and the series
    configuration `series_values`; probes what it has not measured before (`Probe`; everything with
    `recalibrate`). SD rounds come from `taus` (method -> tau: what an earlier run of the same series
    measured, `measured_taus`) where given, else they are priced over a range: the paper's taus to
    1. A notebook that a run on this machine measured with the same parameters (`learn`) costs what
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
        work = [_fixed(nb)]
        if nb in WORK:
            models = models or _Models(series, probe, {**PAPER_TAU[PAPER_TAU_CONTEXT], **(taus or {})}, not taus)
            work += WORK[nb](models, nb, parameters[nb])
        path = _notebook_figure(probe.machine, nb, parameters[nb])
        keys[nb] = path.name
        figure = None if recalibrate or device is None else _read(path)
        items += work if figure is None else _ran(work, figure)
    used = {**PAPER_TAU[PAPER_TAU_CONTEXT], **(taus or {})}
    rounds = ("SD rounds at the taus this output folder's last run measured (04): "
              + ", ".join(f"{m} {t:.3g}" for m, t in used.items()) if taus else
              "SD rounds priced over a range of tau, no draft's tau being measured yet: from the paper's at "
              f"L = {PAPER_TAU_CONTEXT} (" + ", ".join(f"{m} {t:.3g}" for m, t in used.items())
              + ") to 1, every round yielding one token (a random or untrained draft's)")
    assumptions = [rounds + ", every batch until its slowest row is done"] if models is not None else []
    if "09_measured_vs_modeled" in selected:
        assumptions.append("09's cells run until cell_seconds (or max_repeats), their CIs never narrow enough to "
                           "stop early")
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
    one; the lines returned name those it contradicts by more than `TOLERANCE` (the plan's own
    figure for a notebook). `run`: the output folder, kept with each figure."""
    lines, trained = [], {}
    for i in plan.items:
        entry = record["notebooks"].get(i.notebook, {})
        if i.learn is None or not finished_checkpoint(Path(i.learn["checkpoint"])):
            continue
        summary = read_meta(checkpoint_path(Path(i.learn["checkpoint"]) / "checkpoint"), verify=False)["summary"]
        trained[i.notebook] = trained.get(i.notebook, 0.0) + summary["tokens"] / summary["run_tokens_per_s"]
        path = cache_dir() / "plan" / i.learn["figure"]
        cached = _read(path)
        if cached is None or entry.get("status") != "ok":  # a busy probe was not cached: nothing to complete
            continue
        measured = {"step_s": summary["tokens"] / summary["steps"] / summary["tokens_per_s"]}
        if i.learn["first_step"]:
            measured["first_step_s"] = summary["first_step_s"]
        old = cached["result"]
        for name, value in measured.items():
            if _contradicts(value, old[name]):
                lines.append(f"{i.what}: {name[:-2].replace('_', ' ')} {duration(value)} measured, "
                             f"{duration(old[name])} by the {cached['source']}: replaced")
        _write(path, {**cached, "result": {**old, **measured}, "source": "run", "run": run, "when": _now(),
                      "calibration": plan.calibration or cached["calibration"]})
    for nb in plan.notebooks:
        entry = record["notebooks"].get(nb, {})
        if entry.get("status") != "ok" or nb not in plan.notebook_keys:
            continue
        seconds = entry["seconds"] - trained.get(nb, 0.0)
        if not seconds > 0:  # its training's wall time covers it all: nothing left to learn
            continue
        planned = sum(i.seconds for i in plan.items if i.notebook == nb and not i.train_tokens)
        if _contradicts(seconds, planned):
            lines.append(f"{nb}: {duration(seconds)} measured besides training, {duration(planned)} planned: "
                         "the next plan uses the run's")
        _write(cache_dir() / "plan" / plan.notebook_keys[nb],
               {"notebook": nb, "seconds": seconds, "source": "run", "run": run, "when": _now()})
    return lines
