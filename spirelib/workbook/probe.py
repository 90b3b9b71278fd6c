"""The plan's calibration: the real code timed at a run's shapes (`Probe`), each figure checked and cached.

A timing made while other work shares the machine is wrong, and a cached one stays wrong, so every
figure is checked before it is kept: against its own repeats (`_noisy`) and against the machine's
speed now (`Speed`: a quick matmul rate against the best this machine has shown, `BUSY_SIGNAL`).
Figures are JSON files under cache_dir()/plan, keyed by what they timed and on which machine
(`machine_name`), written whole or not at all (`write_cached`); a run writes what it measured back
over them (`spirelib.workbook.plan.learn`). Apart from the plan, so that what is measured and how
it is trusted read in one place, and the work's arithmetic (`spirelib.workbook.work`) holds no timer.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from spirelib.decoding.builders import draft_factory
from spirelib.decoding.prefill import prefill, prefill_needs, speculative_capacity
from spirelib.decoding.sections import SectionTimer
from spirelib.decoding.speculative import Options, autoregressive_rounds, speculative_rounds
from spirelib.measure import calibrate
from spirelib.measure.tau import TauProtocol
from spirelib.model.config import Eagle3Config, ModelConfig, SpireConfig, vanilla_draft_config
from spirelib.model.eagle3 import Eagle3DraftModel
from spirelib.model.spire import SpireDraftModel
from spirelib.model.transformer import Transformer
from spirelib.paths import cache_dir, write_atomically
from spirelib.training.config import TrainConfig
from spirelib.training.corpus import FlatDocs
from spirelib.training.eagle3 import Eagle3Objective
from spirelib.training.objectives import SpireObjective, lm_objective
from spirelib.training.step import evaluate
from spirelib.training.train import Session, TrainingRun, train

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


def contradicts(a: float, b: float, tolerance: float = TOLERANCE) -> bool:
    """Whether `a` and `b` differ by more than `tolerance` (a ratio above 1 + tolerance either way);
    never for a NaN or a zero, which no measurement contradicts."""
    if not (a > 0 and b > 0):
        return False
    return max(a, b) / min(a, b) > 1 + tolerance


def _noisy(samples: list[float]) -> bool:
    """Whether a probe's timed samples (its steps or rounds) disagree: the median more than
    `TOLERANCE` slower than the fastest, which a one-off hiccup (one slow sample of three) is not."""
    return len(samples) > 1 and contradicts(statistics.median(samples), min(samples))


def _fastest(a: dict, b: dict) -> dict:
    """Two takes of a probe merged figure by figure, the faster kept (what other work on the machine
    slowed is the slower); a first step keeps its first take, later takes reusing its compilation."""
    return {k: (a[k] if k == "first_step_s" else _fastest(a[k], b[k]) if isinstance(a[k], dict)
                else min(a[k], b[k])) for k in a}


def write_cached(path: Path, entry: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(entry, indent=1)))


def read_cached(path: Path) -> dict | None:
    """A cached figure, or None where there is none or it is unreadable (a partial write of an older
    version: measured again)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def timestamp() -> str:
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
        best = None if self.reset else read_cached(self.path)
        self.reset = False
        if best is None or any(now[k] > best[k] for k in now):
            write_cached(self.path, {k: max(now[k], (best or now)[k]) for k in now})
        self.first = self.first or now
        return now

    def now(self) -> dict:
        """This call's calibration (`measure`d once, at first need)."""
        return self.first or self.measure()

    def best(self) -> dict:
        return read_cached(self.path) or self.now()

    def busy(self, calibration: dict) -> str | None:
        """Why `calibration` says the machine is busy, or None."""
        now, best = calibration[BUSY_SIGNAL], self.best()[BUSY_SIGNAL]
        return f"matmul rate {now / best:.0%} of its best" if now < best and contradicts(now, best) else None


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
        entry = None if self.recalibrate else read_cached(path)
        if entry is not None:
            then, now = entry["calibration"][BUSY_SIGNAL], self.speed.now()[BUSY_SIGNAL]
            if not (now > then and contradicts(now, then)):
                return {**entry["result"], "source": entry["source"], "figure": path.name}
            self.replaced.append(f"{what}: measured by a {entry['source']} while the machine ran at "
                                 f"{then / now:.0%} of its speed now; measured again")
        result, calibration = self._measure(measure, what)
        if calibration is not None:
            write_cached(path, {"key": kind, "result": result, "source": "probe", "calibration": calibration,
                          "when": timestamp()})
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

    def training(self, kind: str, cfg: ModelConfig, train_cfg: TrainConfig,
                 draft: SpireConfig | Eagle3Config | None = None) -> dict:
        """{"first_step_s", "step_s", "eval_window_s", "save_s"} of a recipe: `kind` "lm" trains a
        Transformer `cfg`, "spire" a SPIRe draft `draft` of a target `cfg` (k-pass, MixedLoss),
        "eagle3" an EAGLE-3 draft (k unrolled steps, distillation); its timed steps are the samples
        `_measure` checks."""
        probe_cfg = dataclasses.replace(train_cfg, steps=PROBE_STEPS, tokens_per_param=0.0, eval_every=0,
                                        eval_windows=PROBE_WINDOWS, checkpoint_every=10**9, log_every=1)
        key = {"model": cfg.to_dict(), kind if kind == "eagle3" else "spire": None if draft is None else draft.to_dict(),
               "train": {f: getattr(train_cfg, f) for f in ("batch_size", "seq_len", "compile", "micro_batch_size")}}

        def measure():
            if kind == "spire":
                target = self._target(cfg)
                model, objective = SpireDraftModel.from_target(target, draft), SpireObjective(target)
            elif kind == "eagle3":
                target = self._target(cfg)
                model, objective = Eagle3DraftModel.from_target(target, draft), Eagle3Objective(target)
            else:
                torch.manual_seed(0)
                model, objective = Transformer(cfg), lm_objective
            tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, 4 * train_cfg.batch_size
                                                       * (train_cfg.seq_len + 1) + 1)
            docs = FlatDocs(tokens, np.array([0]), np.array([len(tokens)]))
            with tempfile.TemporaryDirectory() as tmp:
                start = time.perf_counter()
                result = train(model, objective, docs, probe_cfg, run=TrainingRun(Path(tmp), {"plan-probe": kind}),
                               session=Session(str(self.device), progress=False))
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

        model = {"spire": f"SPIRe draft training ({getattr(draft, 'num_layers', 0)} blocks",
                 "eagle3": f"EAGLE-3 draft training (k = {getattr(draft, 'k', 0)}"}.get(
            kind, f"LM training ({cfg.num_layers} x {cfg.d_model}")
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

    def decoding(self, cfg: ModelConfig, configs: dict, options: dict[str, dict], methods: list[str], context: int,
                 protocol: TauProtocol) -> dict:
        """{"prefill_s", "ad_step_s", "round_s": {method: s}, "begin_s": {method: s}} at (B, L) = (the
        `protocol`'s batch size, `context`), decoding with its k, G and temperature: one real shared
        prefill; each method's begin (its copy of that prefill and its draft's own prefill over the
        context: the engine's "prefill" section, which a notebook pays once a batch and method);
        then `PROBE_ROUNDS` rounds of each method's real loop after a warm-up round,
        each draft built with its `options` (`Series.draft_options`: the self-drafts' KV budgets),
        the trained ones from their `configs` ("spire": SpireConfig, "eagle3": Eagle3Config), random."""
        key = {"model": cfg.to_dict(), "methods": sorted(methods),
               **{m: c.to_dict() for m, c in configs.items() if m in methods},
               "options": {m: {name: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
                               for name, v in o.items()} for m, o in options.items() if m in methods},
               "batch": protocol.batch_size, "context": context, "new_tokens": protocol.new_tokens, "k": protocol.k,
               "temperature": protocol.temperature, "begin": True}  # begin: older figures lack begin_s
        batch, k, temperature = protocol.batch_size, protocol.k, protocol.temperature

        # enough tokens that no row can finish before the timed rounds (a round emits at most k + 1)
        G = max(protocol.new_tokens, (PROBE_ROUNDS + 1) * (k + 1))

        def measure():
            target = self._target(cfg)
            build = {"vanilla": lambda: Transformer(vanilla_draft_config(cfg)),
                     "spire": lambda: SpireDraftModel.from_target(target, configs["spire"]),
                     "eagle3": lambda: Eagle3DraftModel.from_target(target, configs["eagle3"])}
            models = {m: build[m]() for m in methods if m in build}
            factories = {m: draft_factory(m, target, None if models.get(m) is None else models[m].to(self.device),
                                          temperature=temperature, **options.get(m, {})) for m in methods}
            contexts = torch.randint(0, cfg.vocab_size, (batch, context), device=self.device)
            drafts = {m: f() for m, f in factories.items()}
            needs = prefill_needs(drafts.values(), k)
            start = time.perf_counter()
            shared = prefill(target, contexts, capacity=speculative_capacity(context, G, k), **needs)
            prefill_s = time.perf_counter() - start
            timers = {m: SectionTimer(self.device) for m in drafts}
            rounds = {m: speculative_rounds(target, d, contexts, G, k,
                                            Options(temperature, generator=torch.Generator(self.device).manual_seed(0),
                                                    prefilled=shared.copy(), timer=timers[m]))
                      for m, d in drafts.items()}
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
            begin = {m: t.seconds.get("prefill", 0.0) for m, t in timers.items()}  # in the warm-up's next()
            return {"prefill_s": prefill_s, "ad_step_s": seconds.pop("ad"), "round_s": seconds,
                    "begin_s": begin}, samples

        return (self._cached("decode", key, measure, f"decoding at B {batch}, L {context}")
                or {"prefill_s": math.nan, "ad_step_s": math.nan, "round_s": dict.fromkeys(methods, math.nan),
                    "begin_s": dict.fromkeys(methods, math.nan)})
