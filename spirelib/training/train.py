"""The trainer (method §6: AdamW, warmup + cosine): any `nn.Module` against any objective
(`objectives.Objective`), resumable exactly, in one process or several (DDP, or FSDP2: `fsdp`).

`train` orchestrates public pieces that the memory simulation (`simulate`) runs too, so that what it
traces is the trainer's own code: `build_train_state` (the model placed or sharded, AdamW, the
weights resumed or initialized, the objective wrapped for the step: a `step.TrainState`), then
`step.train_step` (one optimizer step on a rank's batch), `step.evaluate` (the validation loss) and
`step.save_state` (a checkpoint); the device comes from `devices`, the seconds and the log from
`metrics`. What `train` is given travels as values: the run (`TrainingRun`: its identity and
folder), what it is evaluated on (`Validation`) and how this session of it executes (`Session`);
`build_train_state` places the model as a `devices.Placement` says. The target, the vanilla draft
(`objectives.lm_objective`) and the SPIRe draft (`objectives.SpireObjective`) all train through
`train`; `pipeline` builds their identities and run folders for the workbook.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from spirelib.frontend import progress_bar
from spirelib.paths import cache_dir
from spirelib.throughput.sharding import PARALLEL
from spirelib.training import fsdp
from spirelib.training.allocator import keep_freed_memory
from spirelib.training.checkpoint import (
    check_identity,
    checkpoint_group,
    checkpoint_path,
    config_hash,
    load_checkpoint,
    read_meta,
)
from spirelib.training.config import TrainConfig
from spirelib.training.devices import Placement, deterministic_on_cpu, init_distributed, resolve_device
from spirelib.training.metrics import MetricsLog, StepClock, host_means, read_metrics
from spirelib.training.objectives import Objective, ObjectiveModule
from spirelib.training.step import TrainState, evaluate, resume, save_state, train_step
from spirelib.training.windows import WindowSampler, validation_windows

if TYPE_CHECKING:
    from spirelib.training.corpus import FlatDocs, ZarrDocs


class TrainingDiverged(RuntimeError):
    """The loss or gradient became NaN/inf; the last good checkpoint is kept."""


@dataclass(frozen=True)
class TrainingRun:
    """A training run as `train` finds, resumes or reuses it: what is trained (`identity`, to which
    `train` adds ``"train": cfg.identity()``; its checkpoint is keyed by both) and the folder that keeps
    it (conventionally ``run_dir_for(name, full_identity(cfg, identity))``). One run may take several
    sessions (`Session`)."""

    folder: str | Path  # holds checkpoint/ and metrics.jsonl
    identity: dict  # model config, dataset checksum, objective, and anything else that should force retraining


@dataclass(frozen=True)
class Validation:
    """What `train` evaluates a run on: `cfg.eval_windows` validation windows of `docs`, every
    `cfg.eval_every` steps and at the end, scored by `objective` (called as the trained objective is,
    under ``torch.no_grad()`` with the plain module in eval mode)."""

    docs: FlatDocs | ZarrDocs  # the validation split
    objective: Objective | None = None  # default: the trained objective


@dataclass(frozen=True)
class Session:
    """How one session of a training run executes; none of it is in the run's identity, so a run may
    resume on another device or over other ranks. Refuses a `parallel` it does not know."""

    device: str = "auto"  # "auto": cuda when available (each rank its LOCAL_RANK), else cpu; or "cpu", "cuda:N"
    parallel: str = "ddp"  # how torchrun's ranks share the model: "ddp" or "fsdp" (ignored in one process)
    progress: bool = True  # a progress bar on rank 0
    stop_at: int | None = None  # end the session after this step with a checkpoint, as an interruption would

    def __post_init__(self):
        if self.parallel not in PARALLEL:
            raise ValueError(f"parallel must be one of {PARALLEL}, got {self.parallel!r}")


@dataclass
class TrainResult:
    model: nn.Module  # the trained module (unwrapped), in eval mode
    path: Path  # its checkpoint folder
    meta: dict  # the checkpoint metadata; meta["summary"] holds the headline numbers
    metrics: list[dict]  # the metrics log
    reused: bool  # True when a finished checkpoint was loaded instead of training

    @property
    def summary(self) -> dict:
        return self.meta["summary"]


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (dim >= 2), none on gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # Fused: one kernel per step, and its step counters never leave the device (the for-each
    # implementation reads each one back to the host: a sync per parameter).
    fused = params[0].device.type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=fused)


def run_dir_for(name: str, identity: dict) -> Path:
    return cache_dir() / "models" / f"{name}-{config_hash(identity)[:16]}"


def full_identity(cfg: TrainConfig, identity: dict) -> dict:
    if "train" in identity:
        raise ValueError("identity key 'train' is reserved for the TrainConfig")
    return {**identity, "train": cfg.identity()}


def build_train_state(model: nn.Module, objective: Objective, cfg: TrainConfig, placement: Placement, *,
                      compile_whole: bool = False, resume_from: tuple[Path, dict, dict] | None = None,
                      initialize: Callable[[nn.Module], None] | None = None) -> TrainState:
    """`model` ready to be trained by `objective` where `placement` says (on its device, one of its
    world of ranks):

    - placed: sharded, FSDP2 shards it block by block (`fsdp.shard_units`, the objective's
      `ObjectiveModule` the root; on the placement's mesh, default `fsdp.device_mesh`; computing in its
      `compute`, default `fsdp.mixed_precision`'s) and a model built on the meta device gets storage for
      this rank's shards only (the whole model is never on the device); otherwise it moves to the device
      whole (materialized there if built on the meta device);
    - AdamW (`make_optimizer`);
    - its weights: resumed from `resume_from` = (checkpoint folder, its verified meta.json, the run's
      identity) (`step.resume`), or `initialize(model)` run (when given) and the generator seeded with
      `cfg.seed`;
    - the objective as a step calls it: under several ranks and not sharded, inside DDP (after the
      weights, which DDP broadcasts from rank 0); with `compile_whole`, `torch.compile`d whole.
    """
    device, world, sharded, mesh = placement.device, placement.world, placement.sharded, placement.mesh
    micro, _ = cfg.micro_batches(world)  # a batch that does not split over the ranks: refused here
    skeleton = wrapper = None
    on_meta = any(p.is_meta for p in model.parameters())
    if sharded:
        skeleton = fsdp.meta_copy(model)  # the plain module returned at the end
        wrapper = fsdp.shard_units(ObjectiveModule(model, objective), fsdp.block_units(model),
                                   mesh if mesh is not None else fsdp.device_mesh(device, world), device,
                                   compute=placement.compute)
        if on_meta:  # this rank's shards get storage (FSDP2: materialized after sharding)
            model.to_empty(device=device)
    elif on_meta:
        fsdp.materialize(model, device)
    else:
        model.to(device)
    state = TrainState(model, make_optimizer(model, cfg), cfg, world, micro,
                       partial(objective, model), wrapper, skeleton)
    if resume_from is not None:
        state.start = resume(state, *resume_from)
    else:
        if initialize is not None:
            initialize(model)
        torch.manual_seed(cfg.seed)
    if sharded:
        state.step_objective = wrapper
    elif world > 1:
        # find_unused_parameters: a variant may leave parameters out of its graph (the SPIRe
        # draft's feedback mixture without feedback); the check is one graph traversal a step
        # (DDP warns once where none is unused). static_graph would skip it, but fails with
        # no_sync's micro-batches (torch 2.x: reducer assertion).
        state.step_objective = state.wrapper = nn.parallel.DistributedDataParallel(
            ObjectiveModule(model, objective), device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=True)
    if compile_whole:
        # Inductor leaves RoPE's complex multiply to eager and warns; measured, the compiled
        # step is as fast as with real-valued RoPE, and eager is faster (spirelib.model.rope).
        warnings.filterwarnings("ignore", message="Torchinductor does not support code generation for complex")
        state.step_objective = torch.compile(state.step_objective)
    state.params = [p for p in model.parameters() if p.requires_grad]
    return state


def _reused(model: nn.Module, path: Path, meta: dict, device: torch.device, sharded: bool) -> nn.Module:
    """A finished checkpoint's weights in `model`, in eval mode: on `device`, or for a sharded run on
    the host (a whole 70B draft fits no GPU)."""
    if any(p.is_meta for p in model.parameters()):
        fsdp.materialize(model, torch.device("cpu") if sharded else device)
    elif not sharded:
        model.to(device)
    load_checkpoint(path, model, meta=meta)
    return (model if sharded else model.to(device)).eval()


def train(
    model: nn.Module,
    objective: Objective,
    train_docs: FlatDocs | ZarrDocs,
    cfg: TrainConfig,
    *,
    run: TrainingRun,
    validation: Validation | None = None,
    session: Session = Session(),
    initialize: Callable[[nn.Module], None] | None = None,
) -> TrainResult:
    """Train `model` on windows of `train_docs` against `objective` (`objectives.Objective`), evaluated
    as `validation` says (none: no validation loss), in one `session` of `run`.

    Batches are `windows.WindowSampler` windows: a pure function of (cfg.seed, step), each rank taking
    its slice, so resuming and scaling out change nothing. Checkpoints go to ``<run.folder>/checkpoint``
    every `cfg.checkpoint_every` steps and at the end; the metrics log to ``<run.folder>/metrics.jsonl``
    (one JSON object per line: ``{"kind": "train", "step", "tokens", "loss", "lr", "grad_norm",
    "tokens_per_s", "elapsed_s", ...objective metrics}`` every `log_every` steps, ``{"kind": "val",
    "step", "tokens", "val_loss", ...}`` every `eval_every` steps and at the end). `run.identity` says
    what is trained (e.g. a draft's frozen target's config hash too). A finished checkpoint with the
    same identity is reused (no training), an unfinished one is resumed exactly, a different or
    corrupt one is refused (`checkpoint.CheckpointError`, naming the differing fields). A non-finite
    loss or gradient stops the run with `TrainingDiverged` (the step, a hint) and keeps the last good
    checkpoint. `session.stop_at=s` ends the session after step s with a checkpoint (resumable), as an
    interruption would. The token budget's N (`cfg.tokens_per_param`) counts all trainable
    parameters, embeddings included.

    Distributed: launched under ``torchrun`` (WORLD_SIZE > 1) the trainer initializes the process
    group itself (gloo on CPU, nccl on GPU), wraps the model in DDP (`session.parallel` "ddp") or
    shards it with FSDP2 ("fsdp": parameters, gradients and AdamW state split over the ranks;
    checkpoints gathered whole, in the same format). Rank 0 writes checkpoints and logs; every rank
    ends with identical (whole) weights. On GPU, bf16 autocast and TF32 matmuls; on CPU, plain fp32.
    `initialize(model)` fills the model's parameters when training starts fresh,
    once they have storage on the device (sharded: this rank's shards); a model built on the meta
    device needs one (a sharded SPIRe draft, filled from its target's shards: `fsdp.init_spire_draft`).

    ``run_dir_for(name, full_identity(cfg, identity))`` is the conventional cache folder
    ``cache_dir()/models/<name>-<hash>``. A draft trained against a frozen target, for example::

        target = Series.from_dict(params).trained_target()  # cached; target.model on the device
        frozen = target.model.eval().requires_grad_(False)

        def objective(draft, batch):                           # batch (B, T+1)
            with torch.no_grad():
                p = torch.softmax(frozen(batch[:, :-1]), -1)   # the target's next-token distributions
            q = torch.log_softmax(draft(batch[:, :-1]), -1)
            return -(p * q).sum(-1).mean(), {}                 # distillation cross-entropy

        identity = {"kind": "distilled-draft", "draft": draft_cfg.to_dict(), "target": target.config_hash,
                    "data": target.data.dataset.checksum}
        run = TrainingRun(run_dir_for("distilled", full_identity(cfg, identity)), identity)
        result = train(draft, objective, target.data.dataset.train, cfg, run=run,
                       validation=Validation(target.data.dataset.val), session=Session(device))

    (`pipeline.trained_spire_draft` is this with SPIRe's k-pass objective, `objectives.SpireObjective`.)
    """
    dev = resolve_device(session.device)
    if dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise RuntimeError(f"{dev} has no bf16: training computes under bf16 autocast (fp32 weights, so no loss "
                           "scaling is needed even for an fp16 target); use an Ampere or newer GPU, or device: cpu")
    rank, world = init_distributed(dev)
    keep_freed_memory()  # each step reuses the host memory the last one freed (no page faults anew)
    ckpt_group = checkpoint_group()  # a checkpoint's collectives, with a timeout for rank 0's long writes
    ident = full_identity(cfg, run.identity)
    run_dir = Path(run.folder)
    ckpt_dir = run_dir / "checkpoint"
    sharded = session.parallel == "fsdp" and world > 1
    if initialize is None and any(p.is_meta for p in model.parameters()):
        raise ValueError("a model built on the meta device has no weights: pass train(initialize=...) to fill them")
    budget_params = sum(p.numel() for p in model.parameters() if p.requires_grad)  # N of cfg.tokens_per_param
    total = cfg.total_steps(budget_params)

    found = checkpoint_path(ckpt_dir)
    meta = None
    if found is not None:
        meta = read_meta(found, ckpt_group)  # each rank hashes its share of the files
        check_identity(found, meta, ident)
        if meta["finished"]:
            return TrainResult(_reused(model, found, meta, dev, sharded), found, meta,
                               read_metrics(run_dir / "metrics.jsonl"), reused=True)

    with deterministic_on_cpu(dev):  # bit-reproducible on a CPU, compiled or not (`deterministic_on_cpu`)
        # An objective that knows which of its parts compiling speeds up compiles those itself
        # (`compiled()`, e.g. objectives.SpireObjective's); any other is compiled whole.
        compiles_itself = cfg.compile and not sharded and hasattr(objective, "compiled")
        if compiles_itself:
            objective = objective.compiled()
        eval_objective = objective if validation is None else validation.objective or objective
        state = build_train_state(model, objective, cfg, Placement(dev, world, sharded),
                                  compile_whole=cfg.compile and not compiles_itself, initialize=initialize,
                                  resume_from=None if meta is None else (found, meta, ident))
        start = state.start
        log = MetricsLog(run_dir / "metrics.jsonl", start, enabled=rank == 0)
        sampler = WindowSampler(train_docs, cfg.batch_size, cfg.seq_len + 1, cfg.seed)
        val = (validation_windows(validation.docs, cfg.eval_windows, cfg.seq_len + 1, cfg.seed)
               if validation is not None else None)

        # The first step whose loss or gradient norm was not finite (-1: none), kept on the device and
        # looked at only where the host waits anyway (a log line, an evaluation, a checkpoint), so a
        # step makes no host sync; weights after such a step are never saved.
        nonfinite = torch.full((), -1, dtype=torch.long, device=dev)

        def check_finite(lr: float) -> None:
            bad = int(nonfinite)
            if bad < 0:
                return
            bar.close()
            kept = checkpoint_path(ckpt_dir)
            raise TrainingDiverged(
                f"non-finite loss or gradient norm at step {bad}; "
                + (f"the last good checkpoint (step {read_meta(kept, verify=False)['step']}) is kept at {kept}. "
                   if kept else "no checkpoint was written yet. ")
                + f"Hint: lower lr (now peak {cfg.lr}, {lr:.3g} at this step), lengthen warmup_fraction "
                "or tighten grad_clip; the run is deterministic, so a changed config trains anew."
            )

        def save(step: int, finished: bool, summary: dict | None = None) -> None:
            save_state(state, ckpt_dir, ident, step=step, finished=finished, summary=summary, group=ckpt_group)

        def run_eval(step: int) -> dict:
            if sharded:
                result = evaluate(state.wrapper, lambda step_module, b: step_module(b, eval_objective), val, state.micro,
                                  dev, rank, world, lockstep=True)
            else:
                result = evaluate(model, eval_objective, val, state.micro, dev, rank, world)
            log.add({"kind": "val", "step": step, "tokens": step * cfg.tokens_per_step(), **result})
            return result

        model.train()
        bar = progress_bar(total=total, initial=start, enabled=session.progress and rank == 0, unit="step",
                           desc=f"train {run_dir.name.rsplit('-', 1)[0]}")
        t_start = time.perf_counter()
        clock = StepClock(dev)
        interval: dict[str, torch.Tensor | float] = {}
        interval_steps = 0
        last_val: dict = {}
        last_loss = torch.full((), float("nan"))
        batches = sampler.batches(range(start, total), rank, world, pin=dev.type == "cuda")  # read one step ahead
        for step, batch in zip(range(start, total), batches):
            clock.start()
            lr = cfg.lr_at(step, total)
            loss_value, grad_norm, metrics = train_step(state, batch.to(dev, non_blocking=True), lr)  # (B/world, T+1)
            finite = torch.isfinite(loss_value) & torch.isfinite(grad_norm)
            nonfinite = torch.where(~finite & (nonfinite < 0), step, nonfinite)
            clock.stepped()
            last_loss = loss_value
            for k, v in {"loss": loss_value, "grad_norm": grad_norm, **metrics}.items():
                interval[k] = interval.get(k, 0.0) + v
            interval_steps += 1
            done = step + 1
            if done % cfg.log_every == 0 or done == total:  # the host waits for the device here, and only here
                tokens_per_s = cfg.tokens_per_step() * interval_steps / clock.take_interval()
                check_finite(lr)
                means = host_means(interval, interval_steps)
                log.add({"kind": "train", "step": done, "tokens": done * cfg.tokens_per_step(), "lr": lr,
                         "tokens_per_s": tokens_per_s, "elapsed_s": time.perf_counter() - t_start, **means})
                bar.set_postfix(loss=f"{means['loss']:.3f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
                interval, interval_steps = {}, 0
            bar.update(1)
            if val is not None and cfg.eval_every and done % cfg.eval_every == 0 and done != total:
                clock.pause()
                check_finite(lr)
                last_val = run_eval(done)
            if done == session.stop_at and done != total:
                clock.pause()
                check_finite(lr)
                save(done, finished=False)
                bar.close()
                return TrainResult(state.plain_model().eval(), ckpt_dir, read_meta(ckpt_dir, verify=False),
                                   log.entries, reused=False)
            if done % cfg.checkpoint_every == 0 and done != total:
                clock.pause()
                check_finite(lr)
                save(done, finished=False)
        if total > start:
            check_finite(cfg.lr_at(total - 1, total))
        bar.close()
        if val is not None:
            last_val = run_eval(total)
        clock.pause()
        tokens_per_s = (cfg.tokens_per_step() * clock.timed_steps / clock.timed_s if clock.timed_steps
                        else float("nan"))
        run_s = time.perf_counter() - t_start  # this session's wall clock: compilation, evaluation, checkpoints included
        summary = {"steps": total, "tokens": total * cfg.tokens_per_step(), "train_loss": float(last_loss),
                   "tokens_per_s": tokens_per_s, "run_tokens_per_s": (total - start) * cfg.tokens_per_step() / run_s,
                   "first_step_s": clock.first_step_s, "budget_params": budget_params,
                   "world_size": world, "device": str(dev), **last_val}
        save(total, finished=True, summary=summary)
        return TrainResult(state.plain_model().eval(), ckpt_dir, read_meta(ckpt_dir, verify=False), log.entries,
                           reused=False)
