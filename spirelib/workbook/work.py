"""A run's work, notebook by notebook (`WORK`): `Item`s of FLOPs, bytes and seconds, before any compute.

Each notebook that computes with the series' models lists its work item by item: the models it
trains (training tokens, FLOPs, bytes of a `TrainRun`), the contexts it decodes (FLOPs and bytes
of a `Decodes`' prefills and rounds, priced by a `Pricing`: `_decode_item`), the cells 09 times, and a notebook's fixed cost
(kernel start, imports, HTML export: `fixed`). A model is trained by the first selected notebook
that needs it, unless a finished checkpoint of its identity is already in the cache (then it costs
nothing: "cached"). Seconds here are the probes' figures (`spirelib.workbook.probe`) times that
work; what no probe can see is assumed and named (decoding's tau before one is measured:
`_decode_item`). Seconds on the GPUs of the hardware table (`throughput.hardware.HARDWARE`) are a
model, not a measurement (`_gpu`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from spirelib.measure.cells import timing_cells
from spirelib.measure.context_loss import sweep_length
from spirelib.measure.stopping import FLOOR, PAPER_SPREAD, SpeedupRule, expected_contexts
from spirelib.measure.tau import DecodingProtocol
from spirelib.model.config import Eagle3Config, ModelConfig, SpireConfig, ablation, vanilla_draft_config
from spirelib.model.eagle3 import Eagle3DraftModel
from spirelib.model.spire import SpireDraftModel
from spirelib.model.transformer import Transformer
from spirelib.throughput.acceptance import expected_rounds
from spirelib.throughput.hardware import GPU_DTYPE, GPU_MFU, GPU_ROOFLINE_FRACTION, HARDWARE
from spirelib.throughput.methods import card
from spirelib.throughput.perfmodel import PAPER_TAU, PAPER_TAU_CONTEXT
from spirelib.throughput.profiled import DraftShape, PricedTarget, draft_work, forward_work
from spirelib.training import pipeline
from spirelib.training.checkpoint import finished_checkpoint
from spirelib.training.config import TrainConfig
from spirelib.training.eagle3 import EAGLE3, eagle3_identity
from spirelib.training.train import full_identity, run_dir_for
from spirelib.workbook.probe import Probe

#: A notebook's fixed cost on this machine: kernel start, imports, HTML export with its static
#: figures (01, which computes nothing heavy, took 5-6 s in every run of 2026-12-02).
NOTEBOOK_SECONDS = 8.0
#: 09's calibration (`measure.calibrate`: matmul peaks and a copy bandwidth, 3.5-3.6 s on one and
#: two threads of the CI-class machine, 2026-12-07) and its profiled fit (3.6 s in a smoke run).
CALIBRATION_SECONDS = 8.0


@dataclass(frozen=True)
class Item:
    """One piece of a notebook's work: `seconds` predicted on this machine, `gpu_seconds` per
    device of the hardware table (modeled). `seconds_at_tau_1`: decoding's seconds if every round
    yields one token (tau 1), where the plan prices a range of tau (`_decode_item`), the other end
    of the range from `seconds`; None where the figure is one number. `source`: where the seconds
    come from ("probe", "run", "assumed"). `learn`: what `plan.learn` reads back after the run (a
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


def _gpu(flops: float, moved: float, *, training: bool) -> dict[str, float]:
    """Modeled seconds per device of the hardware table: FLOPs over the bf16 dense peak at `GPU_MFU`
    for training, the roofline max(FLOPs / peak, bytes / bandwidth) at `GPU_ROOFLINE_FRACTION` for
    decoding (a notebook's fixed cost is added per item, `fixed`). No GPU timing goes into them."""
    out = {}
    for name, hw in HARDWARE.items():
        peak = hw.peak_flops.get(GPU_DTYPE, max(hw.peak_flops.values()))
        t = flops / (peak * GPU_MFU) if training else max(flops / peak, moved / hw.bandwidth) / GPU_ROOFLINE_FRACTION
        out[name] = t
    return out


def fixed(notebook: str, what: str = "kernel start, imports, HTML export", seconds: float = NOTEBOOK_SECONDS) -> Item:
    return Item(notebook, what, seconds, gpu_seconds={d: seconds for d in HARDWARE}, source="assumed")


@dataclass(frozen=True)
class TrainRun:
    """A training run as the plan prices it: the model `trained` (its weights train) under
    `train_cfg`, its token budget counting `budget_params` parameters; a `draft` (SPIRe's or
    EAGLE-3's config, else None) trains against the frozen `target`, its teacher."""

    target: ModelConfig
    train_cfg: TrainConfig
    trained: ModelConfig
    draft: SpireConfig | Eagle3Config | None
    budget_params: int

    def work(self) -> tuple[int, int, float, float]:
        """(steps, tokens, FLOPs, bytes): forward and backward of the trained model (3 forwards'
        FLOPs, its unembedding included) over every training token, the frozen target's forward with
        its unembedding (the teacher of a `draft`), and the validation windows' forwards. A SPIRe
        draft's k passes each run only the positions they predict (method §3.6: a block's j-th
        position in pass j), so every position goes through its body and unembedding once;
        EAGLE-3's k unrolled steps each run every position. Bytes: every step reads and writes the
        trained weights, their gradients and both Adam moments (fp32), and reads the frozen target once."""
        train_cfg, trained = self.train_cfg, self.trained
        steps = train_cfg.total_steps(self.budget_params)
        tokens = steps * train_cfg.tokens_per_step()
        eval_tokens = _evaluations(train_cfg, steps) * train_cfg.eval_windows * train_cfg.seq_len
        T = train_cfg.seq_len
        passes = self.draft.k if isinstance(self.draft, Eagle3Config) else 1
        work = forward_work(trained.shape(), trained.vocab_size, train_cfg.batch_size, T, T // 2)
        step_flops = 3 * passes * work.flops
        eval_flops = passes * work.flops / (train_cfg.batch_size * T)
        moved = 16.0 * trained.num_params() * steps
        if self.draft is not None:
            teacher = forward_work(self.target.shape(), self.target.vocab_size, train_cfg.batch_size, T, T // 2)
            step_flops += teacher.flops
            eval_flops += teacher.flops / (train_cfg.batch_size * T)
            moved += teacher.bytes * steps
        return steps, tokens, step_flops * steps + eval_flops * eval_tokens, moved


def _evaluations(train_cfg: TrainConfig, steps: int) -> int:
    """How many times the trainer scores its validation windows: every `eval_every` steps and at the end."""
    return (steps - 1) // train_cfg.eval_every + 1 if train_cfg.eval_every else 1


def _train_item(notebook: str, what: str, probe: dict, run: TrainRun, cached: bool, warm: bool = False,
                checkpoint: Path | None = None) -> Item:
    """`run`'s work and seconds (none where `cached`): its first step (the probe's, which compiles and
    warms up; with `warm`, an ordinary step: the notebook's process has run the same graphs already),
    its other steps, evaluations and saves. `checkpoint`: where the run will leave the model, whose measured
    step times `plan.learn` writes back over the probe's figure."""
    steps, tokens, flops, moved = run.work()
    train_cfg = run.train_cfg
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


@dataclass(frozen=True)
class Decodes:
    """What a notebook decodes: `runs` batches of B = `batch` contexts of L = `context` tokens, one
    shared prefill each, then every one of `methods`' rounds (and AD's steps with `ad`). `loss`: the
    target's loss on the continuation is read from each batch's prefill (04). `contexts`: the
    contexts the item counts (default `runs` x B). `method_runs`: the batches each method decodes
    where a stopping rule ends it early (04, `stopping.expected_contexts`); the prefill and the loss
    run for `runs`."""

    methods: tuple[str, ...]
    batch: int
    context: int
    runs: int
    ad: bool = False
    loss: bool = False
    contexts: int | None = None
    method_runs: dict[str, float] | None = None


@dataclass(frozen=True)
class Pricing:
    """How decoding is priced: on the `target`, each method's passes as its card lists them
    (`profiled.draft_work` of its `shapes[method]`: a draft model's or the target's forwards over the
    context or the method's KV budget; none for prompt lookup), G = `decoding.new_tokens` tokens a row
    at k = `decoding.k`, each method's rounds at its tau in `taus`, else at its `prior_tau` (the
    paper's at L = 512, method §5, or its card's relative's), else at tau 1 (its slowest). `ranged`:
    no tau is measured (no draft exists, or none was measured here), so the seconds are a range, from
    those taus to `seconds_at_tau_1` at tau 1 (every round yields one token: G rounds)."""

    target: ModelConfig
    shapes: dict[str, DraftShape]
    decoding: DecodingProtocol
    taus: dict[str, float] | None = None
    ranged: bool = False


def prior_tau(method: str) -> float | None:
    """The tau a plan prices `method` at before a run has measured it: the paper's at L = 512 (method
    §5), else that of the paper method its card is `priced_like`; None where neither (tau 1)."""
    paper = PAPER_TAU[PAPER_TAU_CONTEXT]
    return paper.get(method, paper.get(card(method).priced_like))


def _decode_item(notebook: str, what: str, probe: dict, job: Decodes, pricing: Pricing) -> Item:
    """`job`'s work and seconds, as `pricing` prices it: each batch's prefill (and with `job.loss` the
    target's loss on the continuation, `new_tokens` positions over its cache, priced at the prefill's
    measured seconds per FLOP), every method's begin (the probe's: its copy of the prefill and its
    draft's own prefill; seconds only), its rounds and their verification, AD's steps. Rounds per
    batch are `acceptance.expected_rounds` (a batch runs until its slowest row is done)."""
    cfg, methods, runs, batch, context = pricing.target, job.methods, job.runs, job.batch, job.context
    k, new_tokens, ranged = pricing.decoding.k, pricing.decoding.new_tokens, pricing.ranged
    taus = pricing.taus or {}
    share = {m: (job.method_runs or {}).get(m, runs) / runs for m in methods}  # of the batches, each method's
    pre = forward_work(cfg.shape(), cfg.vocab_size, batch, context, context // 2, logits=False)
    seconds, flops, moved = probe["prefill_s"], pre.flops, pre.bytes
    if job.loss:
        read = forward_work(cfg.shape(), cfg.vocab_size, batch, new_tokens, context + new_tokens // 2)
        seconds += probe["prefill_s"] * read.flops / pre.flops
        flops, moved = flops + read.flops, moved + read.bytes
    high = seconds
    keys = context + new_tokens // 2
    verify = forward_work(cfg.shape(), cfg.vocab_size, batch, k + 1, keys)
    slowest = expected_rounds(1.0, k, new_tokens, batch)  # tau 1: the range's other end
    for m in methods:
        rounds = expected_rounds(taus.get(m, prior_tau(m) or 1.0), k, new_tokens, batch)
        seconds += share[m] * (probe["begin_s"][m] + rounds * probe["round_s"][m])
        high += share[m] * (probe["begin_s"][m] + slowest * probe["round_s"][m])
        passes = draft_work(pricing.shapes[m], PricedTarget(cfg.shape(), cfg.vocab_size), batch, k, keys)
        flops += share[m] * rounds * (verify.flops + sum(w.flops for w in passes))
        moved += share[m] * rounds * (verify.bytes + sum(w.bytes for w in passes))
    if job.ad:
        seconds += new_tokens * probe["ad_step_s"]
        high += new_tokens * probe["ad_step_s"]
        step = forward_work(cfg.shape(), cfg.vocab_size, batch, 1, keys)
        flops, moved = flops + new_tokens * step.flops, moved + new_tokens * step.bytes
    return Item(notebook, what, runs * seconds, runs * flops, runs * moved,
                contexts=runs * batch if job.contexts is None else job.contexts,
                gpu_seconds=_gpu(runs * flops, runs * moved, training=False),
                seconds_at_tau_1=runs * high if ranged else None, source=probe.get("source", ""))


class Models:
    """The series' models as the plan sees them: each one's identity and whether the cache holds
    it finished, trained by the first selected notebook that needs it."""

    def __init__(self, series, probe: Probe, taus: dict[str, float], ranged: bool,
                 spreads: dict[str, float] | None = None):
        self.series, self.probe, self.done, self.taus, self.ranged = series, probe, set(), taus, ranged
        self.spreads = spreads or {}  # method -> per-context sd of tau a last run measured (04's stopping rule)
        self.started: set = set()  # (notebook, what a SPIRe run compiles): run once in that notebook's process
        self.target_cfg = series.target
        self.target_hash, self.target_dir, self.vanilla_dir, self.spire_dir = pipeline.planned_run_dirs(
            series.target, series.target_training, series.data(), series.imported)

    def decode(self, notebook: str, what: str, job: Decodes) -> Item:
        """`job` as the series decodes it, timed by a probe of the series' decoding at its (B, L) cell."""
        s, methods = self.series, list(job.methods)
        probe = self.probe.decoding(self.target_cfg, {"spire": s.spire, "eagle3": s.eagle3},
                                    {m: s.draft_options(m) for m in methods}, methods, job.context,
                                    s.protocol(job.batch))
        return _decode_item(notebook, what, probe, job,
                            Pricing(self.target_cfg, s.draft_shapes(), s.decoding(), self.taus, self.ranged))

    def tau_contexts(self, method: str, p: dict) -> float:
        """The contexts 04's stopping rule is expected to draw for `method` at each L
        (`stopping.expected_contexts`), at the tau and per-context spread a last run measured, else
        at `prior_tau` and the paper's spread, else at tau 1 and the i.i.d. spread there (none: the floor)."""
        prior = prior_tau(method)
        sd = self.spreads.get(method, None if prior is None else PAPER_SPREAD)
        return expected_contexts(self.taus.get(method, prior or 1.0), sd, p.get("tau_half_width", 0.0),
                                 p.get("tau_floor", FLOOR), p["n_contexts"], p["decode_batch_size"],
                                 k=self.series.k, new_tokens=self.series.new_tokens)

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
        run = TrainRun(s.target, s.target_training, s.target, None, s.target.num_params())
        return [_train_item(notebook, f"train the target ({s.target.num_layers} x {s.target.d_model})", probe, run,
                            cached, checkpoint=self.target_dir)]

    def vanilla(self, notebook: str) -> list[Item]:
        s = self.series
        if not self.needs("vanilla"):
            return []
        cfg = vanilla_draft_config(self.target_cfg)
        cached = finished_checkpoint(self.vanilla_dir(s.vanilla_training))
        probe = {} if cached else self.probe.training("lm", cfg, s.vanilla_training)
        run = TrainRun(cfg, s.vanilla_training, cfg, None, cfg.num_params())
        return [_train_item(notebook, f"train the vanilla draft ({cfg.num_layers} x {cfg.d_model})", probe, run,
                            cached, checkpoint=self.vanilla_dir(s.vanilla_training))]

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
        run = TrainRun(self.target_cfg, train_cfg, trained, cfg, budget)
        return [_train_item(notebook, label or f"train the SPIRe draft ({cfg.num_layers} blocks, k = {cfg.k})", probe,
                            run, cached, warm, checkpoint=self.spire_dir(cfg, train_cfg))]


    def eagle3(self, notebook: str) -> list[Item]:
        s = self.series
        if not self.needs("eagle3"):
            return []
        trained = dataclasses.replace(self.target_cfg, num_layers=1, d_ff=s.eagle3.d_ff or self.target_cfg.d_ff)
        run_dir = self.eagle3_dir(s.eagle3, s.eagle3_training)
        cached = finished_checkpoint(run_dir)
        probe = {} if cached else self.probe.training("eagle3", self.target_cfg, s.eagle3_training, s.eagle3)
        with torch.device("meta"):  # the trainer's budget counts the draft's trainable parameters
            budget = Eagle3DraftModel(self.target_cfg, s.eagle3).trainable_parameters()
        run = TrainRun(self.target_cfg, s.eagle3_training, trained, s.eagle3, budget)
        return [_train_item(notebook, f"train the EAGLE-3 draft (1 layer, k = {s.eagle3.k})", probe, run, cached,
                            checkpoint=run_dir)]

    def eagle3_dir(self, cfg: Eagle3Config, train_cfg: TrainConfig) -> Path:
        """Where `training.eagle3.trained_eagle3_draft` keeps this draft's checkpoint."""
        identity = eagle3_identity(cfg, self.series.data(), self.target_hash)
        return run_dir_for(EAGLE3, full_identity(train_cfg, identity))


def _target_notebook(models: Models, nb: str, p: dict) -> list[Item]:
    return models.target(nb)


def _drafts_notebook(models: Models, nb: str, p: dict) -> list[Item]:
    return models.target(nb) + models.vanilla(nb) + models.spire(nb) + models.eagle3(nb)


def _tau_notebook(models: Models, nb: str, p: dict) -> list[Item]:
    items = models.target(nb) + models.vanilla(nb) + models.spire(nb)
    B, methods = p["decode_batch_size"], p["methods"]
    items += models.eagle3(nb) if "eagle3" in methods else []
    runs = -(-p["n_contexts"] // B)  # batches per L
    drawn = {m: models.tau_contexts(m, p) for m in methods}  # each method's contexts under the stopping rule
    used = -(-max(drawn.values()) // B)  # the prefills: the batches of the method that runs longest
    trained_on, G = models.series.target_training.seq_len, models.series.new_tokens
    items += [models.decode(nb, f"tau of {', '.join(methods)} and the target's loss at L = {L}"
                            + (f" (past the {trained_on}-token training windows)" if L + G > trained_on else ""),
                            Decodes(tuple(methods), B, L, used, loss=True, contexts=round(max(drawn.values())),
                                    method_runs={m: n / B for m, n in drawn.items()}))
              for L in p["context_lengths"]]
    budgets = p.get("kv_budgets") or []
    if budgets:  # MagicDec and the guided draft at each budget, priced at the series' own budget
        L = sweep_length(p["context_lengths"], G, trained_on, p.get("kv_budget_context") or 0)
        sweep = models.decode(nb, f"KV-budget sweep: MagicDec and guided at {len(budgets)} budgets, L = {L}",
                              Decodes(("magicdec", "guided"), B, L, runs, contexts=p["n_contexts"]))
        items.append(sweep.times(len(budgets)))
    return items


def _ablation_notebook(models: Models, nb: str, p: dict) -> list[Item]:
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
    B, L, cap = p["decode_batch_size"], p["ablation_context_length"], p["n_contexts"]
    first = p.get("delta_first_look", 0)
    drawn = min(first, cap) if first else cap  # two looks: priced at the first (`ablations.DeltaRule`)
    batches, drafts = -(-drawn // B), len(p["ablation_seeds"]) * len(p["ablations"])
    at = f"{drawn} contexts, the first look (to the cap: {cap})" if drawn < cap else f"{cap} contexts"
    items.append(models.decode(nb, f"tau of {len(p['ablations'])} variants x {len(p['ablation_seeds'])} seeds at "
                               f"L = {L}, {at}", Decodes(("spire",), B, L, batches, contexts=drawn,
                                                         method_runs={"spire": drafts * batches})))
    return items


def _timing_notebook(models: Models, nb: str, p: dict) -> list[Item]:
    """09's work: its models, the calibration and the profiled fit, and every cell's runs. A cell is
    priced at its second look (`stopping.SpeedupRule.second_look`, the runs that fit in
    `cell_seconds`), as if some speedup were unresolved at its first: an upper bound, since one
    method whose speedup straddles 1 keeps a cell running, and the wide CIs at B >= 16 make that the
    common case."""
    items = models.target(nb) + models.vanilla(nb) + models.spire(nb)
    items.append(fixed(nb, "calibration and the profiled fit", CALIBRATION_SECONDS))
    methods = p["timing_methods"]
    rule = SpeedupRule.from_repeats(p["repeats"], p["max_repeats"], p["ci"])  # time_cells' own rule

    def runs(one: float) -> int:  # the warm-up and the runs to the second look (measure.wallclock.time_cells)
        return 1 + (rule.cap if math.isnan(one) else rule.second_look(one, p["cell_seconds"] - one))

    for batch, context in timing_cells(p["timing_batches"], p["timing_contexts"], p["held_out"]):
        one = models.decode(nb, "", Decodes(tuple(methods), batch, context, 1, ad=True))  # every method and AD, once
        n, n_high = runs(one.seconds), runs(one.at_tau_1)  # slower runs at tau 1: fewer fit in cell_seconds
        item = models.decode(nb, f"time AD and {len(methods)} methods at B = {batch}, L = {context}, "
                             f"{n}{'' if n == n_high else f' ({n_high} at tau 1)'} runs",
                             Decodes(tuple(methods), batch, context, n, ad=True))
        items.append(item if item.seconds_at_tau_1 is None
                     else dataclasses.replace(item, seconds_at_tau_1=n_high * one.at_tau_1))
    return items


#: The work of each notebook that computes with the series' models, from its resolved parameters
#: (its injections over its defaults); the others are numpy and cost their fixed seconds.
WORK = {"02_train_target": _target_notebook, "03_train_drafts": _drafts_notebook, "04_measure_tau": _tau_notebook,
        "05_ablations": _ablation_notebook, "09_measured_vs_modeled": _timing_notebook}
