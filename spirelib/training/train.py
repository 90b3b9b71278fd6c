"""The trainer (method §6: AdamW, warmup + cosine): any `nn.Module` against any objective
(`objectives.Objective`), resumable exactly, in one process or several (DDP, or FSDP2: `fsdp`).

`train` orchestrates public pieces that the memory simulation (`simulate`) runs too, so that what it
traces is the trainer's own code:

- `build_train_state`: the model placed or sharded, AdamW, the weights resumed (`resume`) or
  initialized, the objective wrapped for the step: a `TrainState`;
- `train_step`: one optimizer step on a rank's batch (`forward_backward` in micro-batches, then
  `optimizer_step`); `evaluate`: the validation loss; `save_state`: a checkpoint.

The target, the vanilla draft (`objectives.lm_objective`) and the SPIRe draft (`objectives.SpireObjective`)
all train through `train`; `pipeline` builds their identities and run folders for the workbook.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from spirelib.frontend import progress_bar
from spirelib.paths import cache_dir
from spirelib.training import fsdp
from spirelib.training.allocator import keep_freed_memory
from spirelib.training.checkpoint import (
    Rows,
    check_identity,
    checkpoint_group,
    checkpoint_path,
    config_hash,
    load_checkpoint,
    load_rng_state,
    read_meta,
    save_checkpoint,
)
from spirelib.training.config import TrainConfig
from spirelib.training.data import WindowSampler, validation_windows
from spirelib.training.objectives import Objective, ObjectiveModule


class TrainingDiverged(RuntimeError):
    """The loss or gradient became NaN/inf; the last good checkpoint is kept."""


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


@dataclass
class TrainState:
    """A session's model ready to step (`build_train_state`): what `train_step`, `evaluate` and
    `save_state` work on, in `train` and in the memory simulation alike."""

    model: nn.Module  # the plain module trained (under FSDP sharded in place: its parameters are DTensors)
    optimizer: torch.optim.Optimizer
    cfg: TrainConfig
    world: int  # ranks sharing each step
    micro: int  # windows per micro-batch on this rank (`TrainConfig.micro_batches`)
    # A micro-batch (b, T+1) -> (loss, metrics), as a step calls it: the objective bound to the model,
    # or `wrapper`; compiled whole under `TrainConfig.compile` (unless the objective compiles itself).
    step_objective: Callable[[torch.Tensor], tuple[torch.Tensor, dict]]
    wrapper: nn.Module | None = None  # the DDP or FSDP2 module around an `ObjectiveModule`; None in one process
    skeleton: nn.Module | None = None  # sharded: the model's unsharded copy on the meta device (`fsdp.meta_copy`)
    start: int = 0  # the step this session starts at: a resumed checkpoint's, else 0
    params: list[nn.Parameter] = field(default_factory=list)  # the trained ones (requires_grad)

    @property
    def sharded(self) -> bool:
        return self.skeleton is not None

    def plain_model(self) -> nn.Module:
        """The trained model as a plain module on every rank: a sharded one gathered whole on the host
        (`fsdp.gather_plain`, collective), or the model itself."""
        return self.model if self.skeleton is None else fsdp.gather_plain(self.model, self.skeleton)


def resolve_device(device: str) -> torch.device:
    """"auto" -> cuda (this rank's LOCAL_RANK) if available, else cpu; otherwise as given. Under
    torchrun every rank has its own GPU, cuda:LOCAL_RANK: an index naming another is refused."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r} requested but CUDA is not available; use device: cpu or auto")
        local = int(os.environ.get("LOCAL_RANK", 0))
        if dev.index is None:
            dev = torch.device("cuda", local)
        elif int(os.environ.get("WORLD_SIZE", 1)) > 1 and dev.index != local:
            raise ValueError(f"device {device!r} under torchrun: each rank uses its own GPU, cuda:LOCAL_RANK "
                             f"(here cuda:{local}); set device: cuda or auto")
    return dev


def init_distributed(device: torch.device) -> tuple[int, int]:
    """(rank, world size). Under torchrun (WORLD_SIZE > 1) this initializes the process group
    once: nccl bound to this rank's GPU (`torch.cuda.set_device`, `device_id`), or gloo on the CPU."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group(backend="nccl", device_id=device)
        else:
            dist.init_process_group(backend="gloo")
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


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


class _MetricsLog:
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


def _mean_metrics(sums: dict[str, float], count: int) -> dict[str, float]:
    return {k: v / count for k, v in sums.items()}


@torch.no_grad()
def evaluate(model: nn.Module, objective: Objective, windows: torch.Tensor, batch_size: int,
             device: torch.device, rank: int = 0, world: int = 1, lockstep: bool = False) -> dict[str, float]:
    """Mean loss (as "val_loss") and metrics over `windows` (n, T+1), sharded over ranks. With
    `lockstep` (a sharded model: every forward is a collective) every rank runs as many batches
    as the rank with the most windows; a rank out of windows runs one it then ignores."""
    was_training = model.training
    model.eval()
    sums: dict[str, float] = {}
    mine = windows[rank::world]
    rows = -(-len(windows) // world) if lockstep else len(mine)
    for i in range(0, rows, batch_size):
        batch = mine[i : i + batch_size].to(device)
        weight = len(batch)  # 0: lockstep, this rank's windows ran out; it runs one and counts none
        with _autocast(device):
            loss, metrics = objective(model, batch if weight else windows[:1].to(device))
        for k, v in {"val_loss": loss, **metrics}.items():
            sums[k] = sums.get(k, 0.0) + float(v) * weight
    model.train(was_training)
    if world > 1:
        keys = sorted(sums)
        t = torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        sums = dict(zip(keys, t.tolist()))
    return _mean_metrics(sums, len(windows))


def build_train_state(model: nn.Module, objective: Objective, cfg: TrainConfig, device: torch.device,
                      world: int, *, sharded: bool = False, compile_whole: bool = False,
                      resume_from: tuple[Path, dict, dict] | None = None,
                      initialize: Callable[[nn.Module], None] | None = None,
                      mesh=None, compute: torch.dtype | None = None) -> TrainState:
    """`model` ready to be trained by `objective` on `device`, one of `world` ranks:

    - placed: with `sharded`, FSDP2 shards it block by block (`fsdp.shard_units`, the objective's
      `ObjectiveModule` the root; on `mesh`, default `fsdp.device_mesh`; computing in `compute`,
      default `fsdp.mixed_precision`'s) and a model built on the meta device gets storage for this
      rank's shards only (the whole model is never on the device); otherwise it moves to `device`
      whole (materialized there if built on the meta device);
    - AdamW (`make_optimizer`);
    - its weights: resumed from `resume_from` = (checkpoint folder, its verified meta.json, the run's
      identity) (`resume`), or `initialize(model)` run (when given) and the generator seeded with
      `cfg.seed`;
    - the objective as a step calls it: under several ranks and not sharded, inside DDP (after the
      weights, which DDP broadcasts from rank 0); with `compile_whole`, `torch.compile`d whole.
    """
    micro, _ = cfg.micro_batches(world)  # a batch that does not split over the ranks: refused here
    skeleton = wrapper = None
    on_meta = any(p.is_meta for p in model.parameters())
    if sharded:
        skeleton = fsdp.meta_copy(model)  # the plain module returned at the end
        wrapper = fsdp.shard_units(ObjectiveModule(model, objective), fsdp.block_units(model),
                                   mesh if mesh is not None else fsdp.device_mesh(device, world), device,
                                   compute=compute)
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


def resume(state: TrainState, path: Path, meta: dict, identity: dict) -> int:
    """Load checkpoint `path` (`meta`: its verified meta.json) into `state`: the weights, AdamW's
    state and the generators', exactly; each rank of a sharded run reads its rows of every tensor
    (`fsdp.load_local_state`), no rank the whole state. Returns the step to continue from."""
    if state.sharded:
        fsdp.load_local_state(state.model, state.optimizer, Rows(path), meta)
        load_rng_state(path)
    else:
        load_checkpoint(path, state.model, identity, optimizer=state.optimizer, restore_rng=True, meta=meta)
    return meta["step"]


def _untraced(name: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def train_step(state: TrainState, batch: torch.Tensor, lr: float,
               phase: Callable[[str], contextlib.AbstractContextManager] = _untraced,
               ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor | float]]:
    """One optimizer step on this rank's batch (b, T+1) at learning rate `lr`: the gradients reset,
    `forward_backward` in micro-batches of `state.micro` windows, then `optimizer_step`. Returns
    (loss, grad norm, metrics), left on the device: nothing here waits for it. `phase(name)` is entered
    around each part, "forward+backward" and "optimizer" (the memory simulation traces each apart)."""
    for group in state.optimizer.param_groups:
        group["lr"] = lr
    state.optimizer.zero_grad(set_to_none=True)
    with phase("forward+backward"):
        loss, metrics = forward_backward(state, batch)
    with phase("optimizer"):
        loss, grad_norm = optimizer_step(state, loss)
    return loss, grad_norm, metrics


def forward_backward(state: TrainState, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
    """Forward and backward of one rank's batch (b, T+1) in micro-batches of `state.micro` windows;
    the gradients add up to those of the mean loss over the whole batch (each micro-batch's mean loss
    is scaled by 1 / their number). Under DDP only the last backward all-reduces. Under FSDP every
    backward reduce-scatters, so the gradients accumulate sharded (as torchtitan does): with gradient
    sync off FSDP2 would keep every parameter's whole gradient on every rank until the last
    micro-batch, the model's full size in fp32 reduce dtype (77 GB a rank for a 70B target's
    19B-parameter draft). Returns the batch's mean loss (detached) and metrics (means over
    micro-batches), left on the device: nothing here waits for it."""
    micro = state.micro
    n_micro = len(batch) // micro
    ddp = state.wrapper if isinstance(state.wrapper, nn.parallel.DistributedDataParallel) else None
    step_objective, device = state.step_objective, batch.device
    total = None
    sums: dict[str, torch.Tensor | float] = {}
    for m in range(n_micro):
        sync = ddp is None or m == n_micro - 1
        with contextlib.nullcontext() if sync else ddp.no_sync():
            with _autocast(device):
                loss, metrics = step_objective(batch[m * micro : (m + 1) * micro])
            (loss / n_micro if n_micro > 1 else loss).backward()
        total = loss.detach() if total is None else total + loss.detach()
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + (v.detach() if isinstance(v, torch.Tensor) else v)
    if n_micro == 1:
        return total, sums
    return total / n_micro, _mean_metrics(sums, n_micro)


def optimizer_step(state: TrainState, loss_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The optimizer's part of a step, after `forward_backward`: clip the gradients (their global norm,
    gathered over shards), average the loss over ranks, AdamW's step. Returns (loss, grad norm), on
    the device."""
    grad_clip = state.cfg.grad_clip
    grad_norm = fsdp.clip_grad_norm(state.params, grad_clip if grad_clip > 0 else math.inf)
    if state.world > 1:
        dist.all_reduce(loss_value)
        loss_value = loss_value / state.world
    state.optimizer.step()
    return loss_value, grad_norm


def save_state(state: TrainState, path: Path, identity: dict, *, step: int, finished: bool,
               summary: dict | None = None, group=None) -> None:
    """Checkpoint `state` at `path` (`checkpoint.save_checkpoint`; every rank calls it): a sharded model
    and its AdamW state gathered whole on rank 0's host (`fsdp.full_state`), written in the
    single-process format."""
    model_state = optimizer_state = None
    if state.sharded:
        model_state, optimizer_state = fsdp.full_state(state.model, state.optimizer)
    save_checkpoint(path, state.model, identity, step=step, finished=finished, optimizer=state.optimizer,
                    summary=summary, state=model_state, optimizer_state=optimizer_state, group=group)


def _reused(model: nn.Module, path: Path, meta: dict, device: torch.device, sharded: bool) -> nn.Module:
    """A finished checkpoint's weights in `model`, in eval mode: on `device`, or for a sharded run on
    the host (a whole 70B draft fits no GPU)."""
    if any(p.is_meta for p in model.parameters()):
        fsdp.materialize(model, torch.device("cpu") if sharded else device)
    elif not sharded:
        model.to(device)
    load_checkpoint(path, model, meta=meta)
    return (model if sharded else model.to(device)).eval()


def _drain(device: torch.device) -> None:
    """Wait until `device` has finished the work queued on it (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _StepClock:
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


def _host_means(sums: dict[str, torch.Tensor | float], count: int) -> dict[str, float]:
    """Means of a logging interval's sums (device tensors or floats), brought to the host at once:
    one sync for them all."""
    on = next((v.device for v in sums.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
    values = torch.stack([torch.as_tensor(v, device=on).double().reshape(()) for v in sums.values()]).tolist()
    return {k: v / count for k, v in zip(sums, values)}


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(
    model: nn.Module,
    objective: Objective,
    train_docs,
    cfg: TrainConfig,
    *,
    run_dir: Path,
    identity: dict,
    val_docs=None,
    eval_objective: Objective | None = None,
    device: str = "auto",
    progress: bool = True,
    budget_params: int | None = None,
    stop_at: int | None = None,
    parallel: str = "ddp",
    initialize: Callable[[nn.Module], None] | None = None,
) -> TrainResult:
    """Train `model` on windows of `train_docs` against `objective` (`objectives.Objective`);
    ``eval_objective`` (default: `objective`) is called the same way on validation windows of
    `val_docs`, under ``torch.no_grad()`` with the plain module in eval mode.

    Batches are `data.WindowSampler` windows: a pure function of (cfg.seed, step), each rank taking
    its slice, so resuming and scaling out change nothing. Checkpoints go to ``run_dir/checkpoint``
    every `cfg.checkpoint_every` steps and at the end; the metrics log to ``run_dir/metrics.jsonl``
    (one JSON object per line: ``{"kind": "train", "step", "tokens", "loss", "lr", "grad_norm",
    "tokens_per_s", "elapsed_s", ...objective metrics}`` every `log_every` steps, ``{"kind": "val",
    "step", "tokens", "val_loss", ...}`` every `eval_every` steps and at the end). `identity` says
    what is trained (model config, dataset checksum, objective, and anything else that should force
    retraining when it changes, e.g. the frozen target's config hash); the trainer adds ``"train":
    cfg.identity()``. A finished checkpoint with the same identity is reused (no training), an
    unfinished one is resumed exactly, a different or corrupt one is refused
    (`checkpoint.CheckpointError`, naming the differing fields). A non-finite loss or gradient stops
    the run with `TrainingDiverged` (the step, a hint) and keeps the last good checkpoint.
    `stop_at=s` ends the session after step s with a checkpoint (resumable), as an interruption
    would. `budget_params` is N for `tokens_per_param` (default: all trainable parameters,
    embeddings included).

    Distributed: launched under ``torchrun`` (WORLD_SIZE > 1) the trainer initializes the process
    group itself (gloo on CPU, nccl on GPU), wraps the model in DDP (``parallel="ddp"``) or shards it
    with FSDP2 (``parallel="fsdp"``: parameters, gradients and AdamW state split over the ranks;
    checkpoints gathered whole, in the same format); `parallel` is ignored in one process. Rank 0
    writes checkpoints and logs; every rank ends with identical (whole) weights. Device "auto" is
    cuda when available (each rank its LOCAL_RANK) else cpu; on GPU, bf16 autocast and TF32 matmuls;
    on CPU, plain fp32. `initialize(model)` fills the model's parameters when training starts fresh,
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
        result = train(draft, objective, target.data.dataset.train, cfg, identity=identity,
                       run_dir=run_dir_for("distilled", full_identity(cfg, identity)),
                       val_docs=target.data.dataset.val, device=device)

    (`pipeline.trained_spire_draft` is this with SPIRe's k-pass objective, `objectives.SpireObjective`.)
    """
    if parallel not in fsdp.PARALLEL:
        raise ValueError(f"parallel must be one of {fsdp.PARALLEL}, got {parallel!r}")
    dev = resolve_device(device)
    if dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise RuntimeError(f"{dev} has no bf16: training computes under bf16 autocast (fp32 weights, so no loss "
                           "scaling is needed even for an fp16 target); use an Ampere or newer GPU, or device: cpu")
    rank, world = init_distributed(dev)
    keep_freed_memory()  # each step reuses the host memory the last one freed (no page faults anew)
    ckpt_group = checkpoint_group()  # a checkpoint's collectives, with a timeout for rank 0's long writes
    ident = full_identity(cfg, identity)
    run_dir = Path(run_dir)
    ckpt_dir = run_dir / "checkpoint"
    sharded = parallel == "fsdp" and world > 1
    if initialize is None and any(p.is_meta for p in model.parameters()):
        raise ValueError("a model built on the meta device has no weights: pass train(initialize=...) to fill them")
    if budget_params is None:
        budget_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = cfg.total_steps(budget_params)

    found = checkpoint_path(ckpt_dir)
    meta = None
    if found is not None:
        meta = read_meta(found, ckpt_group)  # each rank hashes its share of the files
        check_identity(found, meta, ident)
        if meta["finished"]:
            return TrainResult(_reused(model, found, meta, dev, sharded), found, meta,
                               read_metrics(run_dir / "metrics.jsonl"), reused=True)

    # An objective that knows which of its parts compiling speeds up compiles those itself
    # (`compiled()`, e.g. objectives.SpireObjective's); any other is compiled whole.
    compiles_itself = cfg.compile and not sharded and hasattr(objective, "compiled")
    if compiles_itself:
        objective = objective.compiled()
    eval_objective = eval_objective or objective
    state = build_train_state(model, objective, cfg, dev, world, sharded=sharded,
                              compile_whole=cfg.compile and not compiles_itself, initialize=initialize,
                              resume_from=None if meta is None else (found, meta, ident))
    start = state.start
    log = _MetricsLog(run_dir / "metrics.jsonl", start, enabled=rank == 0)
    sampler = WindowSampler(train_docs, cfg.batch_size, cfg.seq_len + 1, cfg.seed)
    val = validation_windows(val_docs, cfg.eval_windows, cfg.seq_len + 1, cfg.seed) if val_docs is not None else None

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
            + (f"the last good checkpoint (step {read_meta(kept, verify=False)['step']}) is kept at {kept}. " if kept else
               "no checkpoint was written yet. ")
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
    bar = progress_bar(total=total, initial=start, enabled=progress and rank == 0, unit="step",
                       desc=f"train {run_dir.name.rsplit('-', 1)[0]}")
    t_start = time.perf_counter()
    clock = _StepClock(dev)
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
            means = _host_means(interval, interval_steps)
            log.add({"kind": "train", "step": done, "tokens": done * cfg.tokens_per_step(), "lr": lr,
                     "tokens_per_s": tokens_per_s, "elapsed_s": time.perf_counter() - t_start, **means})
            bar.set_postfix(loss=f"{means['loss']:.3f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
            interval, interval_steps = {}, 0
        bar.update(1)
        if val is not None and cfg.eval_every and done % cfg.eval_every == 0 and done != total:
            clock.pause()
            check_finite(lr)
            last_val = run_eval(done)
        if done == stop_at and done != total:
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
