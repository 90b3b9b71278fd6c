"""What a run will cost, before it starts: `spire run --plan`, and the plan every `spire run` prints.

For each notebook of a params file the plan lists its work, item by item (`Item`): the models it
trains (training tokens, FLOPs, bytes), the contexts it decodes (FLOPs and bytes of the prefills
and rounds), the cells 09 times, and a notebook's fixed cost (kernel start, imports, HTML export).
A model is trained by the first selected notebook that needs it, unless a finished checkpoint of
its identity is already in the cache (then it costs nothing: "cached").

Seconds on this machine come from a quick calibration of the real code at the run's own shapes
(`Probe`): a few steps of the real trainer for every training recipe (target, vanilla draft, SPIRe
draft; compiled where the recipe compiles, so the first step carries the compilation), validation
windows of each objective, a checkpoint save, and a few rounds of every method's real decoding loop
at every (B, L) the run decodes, after a real prefill. Models are random (a model's speed does not
depend on its weights); an imported target is built from its config.json, no weight is read. Probes
are cached per shape and machine (cache_dir()/plan), so a second plan costs nothing. What a probe
cannot see is assumed and named: the decoding rounds use the paper's taus (method §5) at L = 512
(`acceptance.expected_rounds`: a batch runs until its slowest row is done), and 09's cells run until
their time is up (`cell_seconds`), as its wide CIs at B >= 16 make them.

Seconds on the GPUs of the hardware table (`modeling.hardware.HARDWARE`) are a model, not a
measurement: FLOPs over the bf16 dense peak at `GPU_MFU` for training, the roofline max(FLOPs /
peak, bytes / bandwidth) at `GPU_ROOFLINE_FRACTION` for decoding, plus the fixed cost of each
notebook. No GPU timing goes into them.
"""

from __future__ import annotations

import dataclasses
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

from spirelib.engine.drafts import draft_factory, vanilla_draft_config
from spirelib.engine.speculative import (
    autoregressive_rounds,
    prefill,
    speculative_capacity,
    speculative_rounds,
    stream_entries,
)
from spirelib.engine.spire import SpireConfig, SpireDraftModel, SpireObjective, ablation
from spirelib.engine.transformer import ModelConfig, Transformer
from spirelib.modeling.acceptance import expected_rounds
from spirelib.modeling.hardware import HARDWARE
from spirelib.modeling.perfmodel import PAPER_TAU, PAPER_TAU_CONTEXT
from spirelib.modeling.profiled import forward_work
from spirelib.paths import cache_dir
from spirelib.training import pipeline
from spirelib.training.checkpoint import finished_checkpoint
from spirelib.training.data import FlatDocs
from spirelib.training.train import TrainConfig, evaluate, lm_objective, resolve_device, train
from spirelib.workbook.tables.measured import timing_cells

#: A notebook's fixed cost on this machine: kernel start, imports, HTML export with its static
#: figures (01, which computes nothing heavy, took 5-6 s in every run of 2026-12-02).
NOTEBOOK_SECONDS = 8.0
#: 09's calibration (`engine.calibrate`: matmul peaks and a copy bandwidth) and its fit.
CALIBRATION_SECONDS = 15.0
#: GPU figures are modeled: training at this MFU (torchtitan's Llama runs on H100 report 35-45%),
#: decoding at this fraction of the roofline. Assumptions, stated with every GPU figure.
GPU_MFU = 0.4
GPU_ROOFLINE_FRACTION = 0.5
GPU_DTYPE = "bf16"
PROBE_STEPS = 3  # trainer steps per training probe: the first (compiling) one and two timed
PROBE_ROUNDS = 3  # decoding rounds timed per method after one warm-up round
PROBE_WINDOWS = 2  # validation windows timed per objective
PROBE_FORMAT = 1  # bumped when what a probe measures changes: older cached probes are not read


@dataclass(frozen=True)
class Item:
    """One piece of a notebook's work: `seconds` predicted on this machine, `gpu_seconds` per
    device of the hardware table (modeled)."""

    notebook: str
    what: str
    seconds: float
    flops: float = 0.0
    bytes: float = 0.0
    train_tokens: int = 0
    contexts: int = 0
    cached: bool = False
    gpu_seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class Plan:
    """A run's work by notebook (`items`), the machine it was calibrated on and what the
    calibration itself cost (`probe_seconds`; 0 when every probe came from the cache)."""

    items: list[Item]
    notebooks: list[str]
    machine: str
    probe_seconds: float
    assumptions: list[str]

    def seconds(self, notebook: str | None = None) -> float:
        return sum(i.seconds for i in self.items if notebook is None or i.notebook == notebook)

    def gpu_seconds(self, device: str, notebook: str | None = None) -> float:
        return sum(i.gpu_seconds[device] for i in self.items if notebook is None or i.notebook == notebook)

    def by_notebook(self) -> dict[str, float]:
        return {nb: self.seconds(nb) for nb in self.notebooks}

    def to_dict(self) -> dict:
        return {"machine": self.machine, "probe_seconds": self.probe_seconds, "assumptions": self.assumptions,
                "notebooks": {nb: {"seconds": self.seconds(nb),
                                   "gpu_seconds": {d: self.gpu_seconds(d, nb) for d in HARDWARE}}
                              for nb in self.notebooks},
                "seconds": self.seconds(), "gpu_seconds": {d: self.gpu_seconds(d) for d in HARDWARE},
                "items": [dataclasses.asdict(i) for i in self.items]}

    def render(self) -> str:
        """The plan as the terminal shows it: the work item by item with its time here, then each
        notebook's time here and on every GPU of the hardware table, and the run's."""
        calibrated = (f"calibrated now in {self.probe_seconds:.0f} s, cached for later runs" if self.probe_seconds
                      else "calibration from the cache")
        lines = [f"plan: {len(self.notebooks)} notebooks on {self.machine} ({calibrated})",
                 f"  {'work':60s} {'tokens':>7s} {'FLOPs':>7s} {'bytes':>7s} {'ctx':>5s} {'here':>8s}"]
        for nb in self.notebooks:
            lines.append(f"  {nb}")
            for i in (i for i in self.items if i.notebook == nb):
                what = ("  " + i.what + (" (cached)" if i.cached else ""))[:60]
                lines.append(f"  {what:60s} {_si(i.train_tokens):>7s} {_si(i.flops):>7s} {_si(i.bytes):>7s} "
                             f"{i.contexts or '':>5} {duration(i.seconds):>8s}")
        devices = list(HARDWARE)
        lines.append(f"  {'notebook':28s} {'here':>8s} " + " ".join(f"{d:>9s}" for d in devices))
        for nb in [*self.notebooks, None]:
            lines.append(f"  {nb or 'the run':28s} {duration(self.seconds(nb)):>8s} "
                         + " ".join(f"{duration(self.gpu_seconds(d, nb)):>9s}" for d in devices))
        lines += [f"  assumed: {a}" for a in self.assumptions]
        return "\n".join(lines)


def _si(x: float) -> str:
    if not x:
        return ""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def duration(seconds: float) -> str:
    """Seconds as the plan and the run's summary show them: "8.0 s", "42 s", "3.5 min", "1.2 h"."""
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


class Probe:
    """Times the real code at a run's shapes (module docstring), each measurement cached under
    cache_dir()/plan by what it timed and on which machine. `seconds` is what this probe spent
    measuring (cached measurements cost nothing)."""

    def __init__(self, device: torch.device | None, dtype: torch.dtype = torch.float32):
        """`device` None: the run's device is not on this machine (a GPU run planned on a laptop);
        every time here is then unknown (NaN), and only the modeled GPU columns are filled."""
        self.device, self.dtype = device, dtype
        self.machine = "this machine, which lacks the run's device" if device is None else machine_name(device)
        self.seconds = 0.0

    def _cached(self, kind: str, key: dict, measure) -> dict:
        if self.device is None:
            return None
        ident = json.dumps({"format": PROBE_FORMAT, "kind": kind, "machine": self.machine,
                            "dtype": str(self.dtype), **key}, sort_keys=True, default=str)
        path = cache_dir() / "plan" / f"{kind}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.json"
        if path.is_file():
            return json.loads(path.read_text())["result"]
        start = time.perf_counter()
        result = measure()
        self.seconds += time.perf_counter() - start
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"key": json.loads(ident), "result": result}, f, indent=1)
        os.replace(tmp, path)
        return result

    def _target(self, cfg: ModelConfig) -> Transformer:
        torch.manual_seed(0)
        return Transformer(cfg).to(device=self.device, dtype=self.dtype).eval()

    def training(self, kind: str, cfg: ModelConfig, train_cfg: TrainConfig, spire: SpireConfig | None = None) -> dict:
        """{"first_step_s", "step_s", "eval_window_s", "save_s"} of a recipe: `kind` "lm" trains a
        Transformer `cfg`, "spire" a SPIRe draft `spire` of a target `cfg` (k-pass, MixedLoss)."""
        probe_cfg = dataclasses.replace(train_cfg, steps=PROBE_STEPS, tokens_per_param=0.0, eval_every=0,
                                        eval_windows=PROBE_WINDOWS, checkpoint_every=10**9, log_every=10**9)
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
            return {"first_step_s": summary["first_step_s"], "step_s": step_s, "eval_window_s": eval_window_s,
                    "save_s": save_s}

        return self._cached(f"train-{kind}", key, measure) or dict.fromkeys(
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
            return {"eval_window_s": (time.perf_counter() - start) / PROBE_WINDOWS}

        return (self._cached("eval", {"model": cfg.to_dict(), "seq_len": seq_len, "batch": batch_size}, measure)
                or {"eval_window_s": math.nan})

    def decoding(self, cfg: ModelConfig, spire: SpireConfig, magicdec: dict, methods: list[str], batch: int,
                 context: int, new_tokens: int, k: int, temperature: float) -> dict:
        """{"prefill_s", "ad_step_s", "round_s": {method: s}} at (B, L) = (`batch`, `context`): one
        real prefill, then `PROBE_ROUNDS` rounds of each method's real loop after a warm-up round."""
        key = {"model": cfg.to_dict(), "spire": spire.to_dict(), "magicdec": magicdec, "methods": sorted(methods),
               "batch": batch, "context": context, "new_tokens": new_tokens, "k": k, "temperature": temperature}

        # enough tokens that no row can finish before the timed rounds (a round emits at most k + 1)
        G = max(new_tokens, (PROBE_ROUNDS + 1) * (k + 1))

        def measure():
            target = self._target(cfg)
            models = {"vanilla": Transformer(vanilla_draft_config(cfg)) if "vanilla" in methods else None,
                      "spire": SpireDraftModel.from_target(target, spire) if "spire" in methods else None}
            options = {"magicdec": magicdec}
            factories = {m: draft_factory(m, target, None if models.get(m) is None else models[m].to(self.device),
                                          temperature=temperature, **options.get(m, {})) for m in methods}
            contexts = torch.randint(0, cfg.vocab_size, (batch, context), device=self.device)
            drafts = {m: f(torch.Generator(self.device).manual_seed(0)) for m, f in factories.items()}
            layers = stream_entries(drafts.values())
            start = time.perf_counter()
            shared = prefill(target, contexts, capacity=speculative_capacity(context, G, k), layers=layers)
            prefill_s = time.perf_counter() - start
            rounds = {m: speculative_rounds(target, d, contexts, G, k=k, temperature=temperature,
                                            generator=torch.Generator(self.device).manual_seed(0),
                                            prefilled=shared.copy()) for m, d in drafts.items()}
            rounds["ad"] = autoregressive_rounds(target, contexts, G, temperature=temperature,
                                                 generator=torch.Generator(self.device).manual_seed(0),
                                                 prefilled=shared.copy())
            seconds = {}
            for m, loop in rounds.items():
                next(loop)  # the prefill's reuse, the draft's begin and one round: warm-up
                times = []
                for _ in range(PROBE_ROUNDS):
                    start = time.perf_counter()
                    next(loop)
                    times.append(time.perf_counter() - start)
                seconds[m] = statistics.median(times)
            return {"prefill_s": prefill_s, "ad_step_s": seconds.pop("ad"), "round_s": seconds}

        return self._cached("decode", key, measure) or {"prefill_s": math.nan, "ad_step_s": math.nan,
                                                        "round_s": dict.fromkeys(methods, math.nan)}


# ---------------------------------------------------------------------------- work


def _gpu(flops: float, moved: float, *, training: bool) -> dict[str, float]:
    """Modeled seconds per device of the hardware table (module docstring)."""
    out = {}
    for name, hw in HARDWARE.items():
        peak = hw.peak_flops.get(GPU_DTYPE, max(hw.peak_flops.values()))
        t = flops / (peak * GPU_MFU) if training else max(flops / peak, moved / hw.bandwidth) / GPU_ROOFLINE_FRACTION
        out[name] = t
    return out


def _fixed(notebook: str, what: str = "kernel start, imports, HTML export", seconds: float = NOTEBOOK_SECONDS) -> Item:
    return Item(notebook, what, seconds, gpu_seconds={d: seconds for d in HARDWARE})


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
                warm: bool = False) -> Item:
    """A training run's work and seconds: its first step (the probe's, which compiles and warms up; with
    `warm`, an ordinary step: the notebook's process has run the same graphs already), its other
    steps, evaluations and saves."""
    steps, tokens, flops, moved = training_work(cfg, train_cfg, trained, spire, budget_params)
    if cached:
        return Item(notebook, what, 0.0, flops, moved, tokens, cached=True, gpu_seconds={d: 0.0 for d in HARDWARE})
    saves = (steps - 1) // train_cfg.checkpoint_every + 1  # every checkpoint_every steps and at the end
    seconds = (probe["step_s" if warm else "first_step_s"] + (steps - 1) * probe["step_s"]
               + _evaluations(train_cfg, steps) * train_cfg.eval_windows * probe["eval_window_s"]
               + saves * probe["save_s"])
    return Item(notebook, what, seconds, flops, moved, tokens, gpu_seconds=_gpu(flops, moved, training=True))


def _decode_item(notebook: str, what: str, probe: dict, cfg: ModelConfig, spire: SpireConfig, methods: list[str],
                 runs: int, batch: int, context: int, new_tokens: int, k: int, *, ad: bool = False,
                 contexts: int | None = None, magicdec_keys: int = 65, taus: dict[str, float] | None = None) -> Item:
    """`runs` batches of B = `batch` contexts of L = `context` tokens: one shared prefill each, then
    every method's rounds (and AD's steps with `ad`); MagicDec drafts over `magicdec_keys` (sink +
    window) of the target's cache; each method's rounds at its tau in `taus` (default the paper's)."""
    taus = taus or PAPER_TAU[PAPER_TAU_CONTEXT]
    seconds = probe["prefill_s"]
    pre = forward_work(cfg.shape(), cfg.vocab_size, batch, context, context // 2, logits=False)
    flops, moved = pre.flops, pre.bytes
    keys = context + new_tokens // 2
    verify = forward_work(cfg.shape(), cfg.vocab_size, batch, k + 1, keys)
    for m in methods:
        rounds = expected_rounds(taus[m], k, new_tokens, batch)
        seconds += rounds * probe["round_s"][m]
        if m == "vanilla":
            step = forward_work(vanilla_draft_config(cfg).shape(), cfg.vocab_size, batch, 1, keys)
        elif m == "spire":
            step = forward_work(dataclasses.replace(cfg, num_layers=spire.num_layers).shape(), cfg.vocab_size, batch,
                                1, spire.sink + spire.window)
        else:
            step = forward_work(cfg.shape(), cfg.vocab_size, batch, 1, min(keys, magicdec_keys))
        flops += rounds * (verify.flops + k * step.flops)
        moved += rounds * (verify.bytes + k * step.bytes)
    if ad:
        seconds += new_tokens * probe["ad_step_s"]
        step = forward_work(cfg.shape(), cfg.vocab_size, batch, 1, keys)
        flops, moved = flops + new_tokens * step.flops, moved + new_tokens * step.bytes
    return Item(notebook, what, runs * seconds, runs * flops, runs * moved,
                contexts=runs * batch if contexts is None else contexts,
                gpu_seconds=_gpu(runs * flops, runs * moved, training=False))


class _Models:
    """The series' models as the plan sees them: each one's identity and whether the cache holds
    it finished, trained by the first selected notebook that needs it."""

    def __init__(self, series, probe: Probe, taus: dict[str, float]):
        self.series, self.probe, self.done, self.taus = series, probe, set(), taus
        self.started: set = set()  # (notebook, what a SPIRe run compiles): run once in that notebook's process
        self.target_cfg = series.target
        self.target_hash, self.target_dir, self.vanilla_dir, self.spire_dir = pipeline.planned_run_dirs(
            series.target, series.target_training, series.data(), series.imported)

    def decode(self, notebook: str, what: str, methods, batch: int, context: int, runs: int, *, ad: bool = False,
               contexts: int | None = None) -> Item:
        """`runs` batches decoded at (B, L) = (`batch`, `context`) with `methods` (and AD with `ad`),
        timed by a probe of the series' decoding at that cell."""
        s = self.series
        probe = self.probe.decoding(self.target_cfg, s.spire, dataclasses.asdict(s.magicdec), list(methods), batch,
                                    context, s.new_tokens, s.k, s.temperature)
        return _decode_item(notebook, what, probe, self.target_cfg, s.spire, list(methods), runs, batch, context,
                            s.new_tokens, s.k, ad=ad, contexts=contexts,
                            magicdec_keys=s.magicdec.sink + s.magicdec.window, taus=self.taus)

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
                         contexts=t.eval_windows, gpu_seconds=_gpu(flops, 0.0, training=True))]
        cached = finished_checkpoint(self.target_dir)
        probe = {} if cached else self.probe.training("lm", s.target, s.target_training)
        return [_train_item(notebook, f"train the target ({s.target.num_layers} x {s.target.d_model})", probe,
                            s.target, s.target_training, s.target, None, s.target.num_params(), cached)]

    def vanilla(self, notebook: str) -> list[Item]:
        s = self.series
        if not self.needs("vanilla"):
            return []
        cfg = vanilla_draft_config(self.target_cfg)
        cached = finished_checkpoint(self.vanilla_dir(s.vanilla_training))
        probe = {} if cached else self.probe.training("lm", cfg, s.vanilla_training)
        return [_train_item(notebook, f"train the vanilla draft ({cfg.num_layers} x {cfg.d_model})", probe, cfg,
                            s.vanilla_training, cfg, None, cfg.num_params(), cached)]

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
                            self.target_cfg, train_cfg, trained, cfg, budget, cached, warm)]


def _target_notebook(models: _Models, nb: str, p: dict) -> list[Item]:
    return models.target(nb)


def _drafts_notebook(models: _Models, nb: str, p: dict) -> list[Item]:
    return models.target(nb) + models.vanilla(nb) + models.spire(nb)


def _tau_notebook(models: _Models, nb: str, p: dict) -> list[Item]:
    items = models.target(nb) + models.vanilla(nb) + models.spire(nb)
    B, methods = p["decode_batch_size"], p["methods"]
    runs = -(-p["n_contexts"] // B)  # batches per L
    return items + [models.decode(nb, f"tau of {', '.join(methods)} at L = {L}", methods, B, L, runs,
                                  contexts=p["n_contexts"]) for L in p["context_lengths"]]


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
                      gpu_seconds=_gpu(flops, 0.0, training=True)))
    B, L = p["decode_batch_size"], p["ablation_context_length"]
    runs = len(p["ablation_seeds"]) * len(p["ablations"]) * -(-p["n_contexts"] // B)
    items.append(models.decode(nb, f"tau of {len(p['ablations'])} variants x {len(p['ablation_seeds'])} seeds at "
                               f"L = {L}", ["spire"], B, L, runs))
    return items


def _timing_notebook(models: _Models, nb: str, p: dict) -> list[Item]:
    items = models.target(nb) + models.vanilla(nb) + models.spire(nb)
    items.append(_fixed(nb, "calibration and the profiled fit", CALIBRATION_SECONDS))
    methods = p["timing_methods"]
    limit = max(p["repeats"], p["max_repeats"])
    for batch, context in timing_cells(p["timing_batches"], p["timing_contexts"], p["held_out"]):
        one = models.decode(nb, "", methods, batch, context, 1, ad=True).seconds  # a run of every method and AD
        # engine.wallclock.time_cells' rule, its CIs never narrow enough to stop a cell early
        fit = limit + 1 if math.isnan(one) else math.floor(p["cell_seconds"] / max(one, 1e-9)) + 1
        runs = max(p["repeats"] + 1, min(limit + 1, fit))
        items.append(models.decode(nb, f"time AD and {len(methods)} methods at B = {batch}, L = {context}, "
                                   f"{runs} runs", methods, batch, context, runs, ad=True))
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


def make_plan(selected: list[str], parameters: dict[str, dict], series_values: dict,
              taus: dict[str, float] | None = None) -> Plan:
    """The plan of a run of the notebooks `selected` (stems, in order) with `parameters` (stem ->
    the notebook's parameters: its defaults with the run's injections over them) and the series
    configuration `series_values`; probes what it has not measured before (`Probe`). SD rounds
    come from `taus` (method -> tau: what an earlier run of the same series measured,
    `measured_taus`) where given, else from the paper's taus."""
    from spirelib.training.series import Series

    series = Series.from_dict(series_values)
    wants_gpu = series.device.startswith("cuda") and not torch.cuda.is_available()
    device = None if wants_gpu else resolve_device(series.device)
    # fp32 on a CPU (bf16 is slow there, and the engine loads fp32); on a GPU a checkpoint keeps its bf16
    probe = Probe(device, torch.bfloat16 if device is not None and device.type == "cuda" and series.imported
                  else torch.float32)
    models = None  # the data and the models' identities, read only when a notebook computes with them
    items = []
    for nb in selected:
        items.append(_fixed(nb))
        if nb in WORK:
            models = models or _Models(series, probe, {**PAPER_TAU[PAPER_TAU_CONTEXT], **(taus or {})})
            items += WORK[nb](models, nb, parameters[nb])
    source = ("the taus this output folder's last run measured (04)" if taus
              else f"the paper's taus (L = {PAPER_TAU_CONTEXT}; a run's own can be far lower, a random model's near 1)")
    used = {**PAPER_TAU[PAPER_TAU_CONTEXT], **(taus or {})}
    assumptions = [f"SD rounds at {source}: " + ", ".join(f"{m} {t:.3g}" for m, t in used.items())
                   + ", every batch until its slowest row is done",
                   "09's cells run until cell_seconds (or max_repeats), their CIs never narrow enough to stop early",
                   (f"GPU columns are modeled, not measured: training at {GPU_MFU:.0%} MFU ({GPU_DTYPE}), decoding at "
                    f"{GPU_ROOFLINE_FRACTION:.0%} of the roofline, {NOTEBOOK_SECONDS:.0f} s fixed per notebook")]
    return Plan(items, list(selected), probe.machine, probe.seconds, assumptions)
