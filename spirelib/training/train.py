"""A generic, resumable, distributed-ready training loop (method §6: AdamW, warmup + cosine).

The trainer optimizes any `nn.Module` against any objective; the target, the vanilla draft
(next-token cross-entropy, `lm_objective`) and the SPIRe draft (k-pass forward with a
frozen target, MixedLoss) all train through `train`.

API
---
``objective(model, batch) -> (loss, metrics)``
    `batch` is a LongTensor (B, T+1) of token windows on the training device (B is this
    rank's share of `TrainConfig.batch_size`, or `micro_batch_size` windows of it when set,
    T = `seq_len`). Return a scalar loss tensor to minimize, the mean over the batch's
    windows (micro-batches of a step are equal in size, so the mean of their losses and
    the sum of their gradients / their count are those of the whole batch), and a dict of
    extra scalars to log (floats or 0-dim tensors, means over the batch likewise; averaged
    over a step's micro-batches, each logging interval and the validation set). `model` is always the plain module
    (call any of its methods): under DDP the trainer wraps the objective call itself, so
    gradients are all-reduced whatever the objective computes. Frozen helpers (a target) are
    captured by the objective (a closure or a callable object), and must live on the same
    device; bf16 autocast (GPU only) is active around the call.
    ``eval_objective`` (default: `objective`) is called the same way on validation windows,
    under ``torch.no_grad()`` with the plain module in eval mode.

``train(model, objective, train_docs, cfg, run_dir=..., identity=..., val_docs=...) -> TrainResult``
    Batches are `data.WindowSampler` windows: a pure function of (cfg.seed, step), each rank
    taking its slice, so resuming and scaling out change nothing. Checkpoints go to
    ``run_dir/checkpoint`` every `cfg.checkpoint_every` steps and at the end; the metrics log
    to ``run_dir/metrics.jsonl`` (one JSON object per line: ``{"kind": "train", "step",
    "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s", ...objective metrics}``
    every `log_every` steps, ``{"kind": "val", "step", "tokens", "val_loss", ...}`` every
    `eval_every` steps and at the end). `identity` says what is trained (model config,
    dataset checksum, objective, and anything else that should force retraining when it
    changes, e.g. the frozen target's config hash); the trainer adds ``"train":
    cfg.identity()``. A finished checkpoint with the same identity is reused (no training),
    an unfinished one is resumed exactly, a different or corrupt one is refused
    (`checkpoint.CheckpointError`, naming the differing fields). A non-finite loss or
    gradient stops the run with `TrainingDiverged` (the step, a hint) and keeps the last
    good checkpoint. `stop_at=s` ends the session after step s with a checkpoint
    (resumable), as an interruption would.

``run_dir_for(name, full_identity(cfg, identity))`` is the conventional cache folder
``cache_dir()/models/<name>-<hash>``; `spirelib.training.pipeline` builds identities and run folders
for the workbook. A draft trained against a frozen target, for example::

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

(`pipeline.trained_spire_draft` is this with SPIRe's k-pass objective, `spire.SpireObjective`.)

Distributed: launched under ``torchrun`` (WORLD_SIZE > 1) the trainer initializes the
process group itself (gloo on CPU, nccl on GPU), wraps the model in DDP (``parallel="ddp"``)
or shards it with FSDP2 (``parallel="fsdp"``, `spirelib.training.fsdp`: parameters, gradients
and AdamW state split over the ranks; checkpoints gathered whole, in the same format), and
rank 0 writes checkpoints and logs; every rank ends with identical (whole) weights. Device "auto" is cuda when
available (each rank its LOCAL_RANK) else cpu; on GPU, bf16 autocast and TF32 matmuls; on
CPU, plain fp32.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from spirelib.frontend import progress_bar
from spirelib.paths import cache_dir
from spirelib.training import fsdp as fsdp_
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
from spirelib.training.data import WindowSampler, validation_windows

Objective = Callable[[nn.Module, torch.Tensor], "tuple[torch.Tensor, dict[str, float]]"]


def from_dict_checked(cls, d: dict, what: str):
    """Build dataclass `cls` from `d`, refusing unknown keys and wrongly typed values with a
    message that names the field and the allowed ones (before any compute)."""
    if not isinstance(d, dict):
        raise TypeError(f"{what} must be a mapping of {cls.__name__} fields, got {type(d).__name__}")
    allowed = {f.name: f for f in fields(cls)}
    unknown = sorted(set(d) - set(allowed))
    if unknown:
        raise ValueError(f"unknown {what} field(s) {unknown}; allowed: {sorted(allowed)}")
    for name, value in d.items():
        kind = allowed[name].type if isinstance(allowed[name].type, str) else allowed[name].type.__name__
        ok = {"int": isinstance(value, int) and not isinstance(value, bool),
              "float": isinstance(value, (int, float)) and not isinstance(value, bool),
              "bool": isinstance(value, bool), "str": isinstance(value, str)}.get(kind, True)
        if not ok:
            raise TypeError(f"{what}.{name} must be {kind}, got {value!r}")
    return cls(**{k: float(v) if allowed[k].type in ("float", float) else v for k, v in d.items()})


@dataclass(frozen=True)
class TrainConfig:
    """Optimizer, schedule and budget. Budget: exactly one of `steps` and `tokens_per_param`
    (method §6 trains every model on 20 x N tokens, N counting embeddings)."""

    batch_size: int = 8  # windows per optimizer step, over all ranks
    seq_len: int = 128  # tokens per window (windows hold seq_len + 1 for the shifted targets)
    steps: int = 0
    tokens_per_param: float = 0.0
    lr: float = 3e-3  # peak
    min_lr_ratio: float = 0.1  # cosine decays to min_lr_ratio * lr
    warmup_fraction: float = 0.05  # of all steps, linear from lr / warmup
    weight_decay: float = 0.1  # on matrices (embeddings included), not on norm gains
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 = no clipping
    eval_every: int = 0  # steps between validation losses; 0 = only at the end
    eval_windows: int = 32  # validation windows of seq_len + 1 tokens
    checkpoint_every: int = 100  # steps between checkpoints (and at the end)
    log_every: int = 10
    compile: bool = False  # torch.compile the objective (model and loss together; or its `compiled()` parts)
    seed: int = 0
    # Windows per forward/backward: each rank's share of the batch runs in micro-batches whose
    # gradients accumulate before the one optimizer step; 0 = the rank's whole share at once.
    micro_batch_size: int = 0

    # Fields that change how a run is executed or observed, not what it computes. The
    # micro-batch size is one: the step's loss and gradient are the mean over the same
    # batch whatever it is (only float summation order differs, as with the world size,
    # which no identity holds either), so a run may resume, or a finished model be reused,
    # on a machine that needs a different one.
    OPERATIONAL = ("checkpoint_every", "log_every", "compile", "micro_batch_size")

    def __post_init__(self):
        if (self.steps > 0) == (self.tokens_per_param > 0):
            raise ValueError(f"set exactly one budget: steps > 0 or tokens_per_param > 0 "
                             f"(got steps={self.steps}, tokens_per_param={self.tokens_per_param})")
        for name in ("batch_size", "seq_len", "eval_windows", "checkpoint_every", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or not 0 <= self.min_lr_ratio <= 1 or not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"need lr > 0, 0 <= min_lr_ratio <= 1, 0 <= warmup_fraction < 1: {self}")
        if self.micro_batch_size < 0 or (self.micro_batch_size and self.batch_size % self.micro_batch_size):
            raise ValueError(f"TrainConfig.micro_batch_size must be 0 (the whole batch) or divide batch_size "
                             f"({self.batch_size}), got {self.micro_batch_size}")

    def micro_batches(self, world: int = 1) -> tuple[int, int]:
        """(windows per micro-batch, micro-batches per step) on each of `world` ranks."""
        if self.batch_size % world:
            raise ValueError(f"TrainConfig.batch_size {self.batch_size} does not split over {world} ranks")
        per_rank = self.batch_size // world
        micro = self.micro_batch_size or per_rank
        if per_rank % micro:
            raise ValueError(f"TrainConfig.micro_batch_size {micro} must divide the per-rank batch "
                             f"{per_rank} (batch_size {self.batch_size} over {world} ranks)")
        return micro, per_rank // micro

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        return from_dict_checked(cls, d, "TrainConfig")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def identity(self) -> dict:
        """What determines the trained weights (the operational fields left out; every field
        added since, `micro_batch_size`, is operational, so config hashes stay what they were)."""
        return {k: v for k, v in self.to_dict().items() if k not in self.OPERATIONAL}

    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def total_steps(self, num_params: int) -> int:
        if self.steps:
            return self.steps
        return max(1, math.ceil(self.tokens_per_param * num_params / self.tokens_per_step()))

    def lr_at(self, step: int, total: int) -> float:
        """Linear warmup over the first warmup_fraction of steps, then cosine to min_lr_ratio."""
        warmup = round(self.warmup_fraction * total)
        if step < warmup:
            return self.lr * (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - 1 - warmup))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def lm_objective(model: nn.Module, batch: torch.Tensor):
    """Next-token cross-entropy (HardTargetLoss, method §3.7) of a `Transformer` on windows (B, T+1),
    fused with the unembedding (`Transformer.loss`)."""
    return model.loss(batch[:, :-1], batch[:, 1:]), {}


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


class _ObjectiveStep(nn.Module):
    """`objective(model, batch)` as a module's forward, so that DDP, which all-reduces the
    gradients of what runs inside its forward, wraps the whole objective: objectives call any
    method of the plain model."""

    def __init__(self, model: nn.Module, objective: Objective):
        super().__init__()
        self.model, self.objective = model, objective

    def forward(self, batch: torch.Tensor, objective: Objective | None = None):
        return (objective or self.objective)(self.model, batch)


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


def _accumulate(step_objective, ddp, batch: torch.Tensor, micro: int, n_micro: int,
                device: torch.device) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
    """Forward and backward of one rank's batch (b, T+1) in `n_micro` micro-batches of `micro`
    windows; the gradients add up to those of the mean loss over the whole batch (each
    micro-batch's mean loss is scaled by 1 / n_micro). Under DDP only the last backward
    all-reduces. Under FSDP every backward reduce-scatters, so the gradients accumulate sharded
    (as torchtitan does): with gradient sync off FSDP2 would keep every parameter's whole
    gradient on every rank until the last micro-batch, the model's full size in fp32 reduce dtype
    (77 GB a rank for a 70B target's 19B-parameter draft). Returns the batch's mean loss
    (detached) and metrics (means over micro-batches), left on the device: nothing here waits for it."""
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


def _update(opt: torch.optim.Optimizer, params: list, loss_value: torch.Tensor, cfg: TrainConfig,
            world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The optimizer's part of a step, after `_accumulate`: clip the gradients (their global norm,
    gathered over shards), average the loss over ranks, AdamW's step. Returns (loss, grad norm),
    on the device."""
    grad_norm = fsdp_.clip_grad_norm(params, cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
    if world > 1:
        dist.all_reduce(loss_value)
        loss_value = loss_value / world
    opt.step()
    return loss_value, grad_norm


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
    """Train `model` on windows of `train_docs` (see the module docstring). `budget_params`
    is N for `tokens_per_param` (default: all trainable parameters, embeddings included).
    `parallel` ("ddp" or "fsdp") says how several ranks share the work; one process ignores it.
    `initialize(model)` fills the model's parameters when training starts fresh, once they have
    storage on the device (sharded: this rank's shards); a model built on the meta device needs one
    (a sharded SPIRe draft, filled from its target's shards: `fsdp.init_spire_draft`)."""
    if parallel not in fsdp_.PARALLEL:
        raise ValueError(f"parallel must be one of {fsdp_.PARALLEL}, got {parallel!r}")
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
    on_meta = any(p.is_meta for p in model.parameters())
    if on_meta and initialize is None:
        raise ValueError("a model built on the meta device has no weights: pass train(initialize=...) to fill them")
    if not sharded and on_meta:
        _materialize(model, dev)
    elif not sharded:
        model.to(dev)
    # else: fully_shard moves one block at a time to the device (the whole model never is there)
    # An objective that knows which of its parts compiling speeds up compiles those itself
    # (`compiled()`, e.g. spire.SpireObjective's); any other is compiled whole, below.
    compiles_itself = cfg.compile and not sharded and hasattr(objective, "compiled")
    if compiles_itself:
        objective = objective.compiled()
    eval_objective = eval_objective or objective
    units = fsdp_units(model)
    if budget_params is None:
        budget_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = cfg.total_steps(budget_params)

    found = checkpoint_path(ckpt_dir)
    meta = None
    if found is not None:
        meta = read_meta(found, ckpt_group)  # each rank hashes its share of the files
        check_identity(found, meta, ident)
        if meta["finished"]:
            if sharded and on_meta:
                _materialize(model, torch.device("cpu"))
            load_checkpoint(found, model, meta=meta)  # sharded: it stays on the host (a whole 70B draft fits no GPU)
            return TrainResult((model if sharded else model.to(dev)).eval(), found, meta,
                               read_metrics(run_dir / "metrics.jsonl"), reused=True)

    start = 0
    fsdp = skeleton = None
    if sharded:
        skeleton = _meta_copy(model)  # the plain module returned at the end
        fsdp = fsdp_.shard_units(_ObjectiveStep(model, objective), units, fsdp_.device_mesh(dev, world), dev)
        if on_meta:  # this rank's shards get storage (FSDP2: materialized after sharding)
            model.to_empty(device=dev)
    opt = make_optimizer(model, cfg)
    if meta is not None:
        start = meta["step"]
    if meta is not None and sharded:  # each rank reads its rows of the weights and moments
        fsdp_.load_local_state(model, opt, Rows(found), meta)
        load_rng_state(found)
    elif meta is not None:
        load_checkpoint(found, model, ident, optimizer=opt, restore_rng=True, meta=meta)
    if meta is None:
        if initialize is not None:
            initialize(model)
        torch.manual_seed(cfg.seed)
    log = _MetricsLog(run_dir / "metrics.jsonl", start, enabled=rank == 0)

    step_objective = partial(objective, model)
    ddp = None
    if sharded:
        step_objective = fsdp
    elif world > 1:
        # find_unused_parameters: a variant may leave parameters out of its graph (the SPIRe
        # draft's feedback mixture without feedback); the check is one graph traversal a step
        # (DDP warns once where none is unused). static_graph would skip it, but fails with
        # no_sync's micro-batches (torch 2.x: reducer assertion).
        step_objective = ddp = nn.parallel.DistributedDataParallel(
            _ObjectiveStep(model, objective), device_ids=[dev.index] if dev.type == "cuda" else None,
            find_unused_parameters=True)
    if cfg.compile and not compiles_itself:
        # Inductor leaves RoPE's complex multiply to eager and warns; measured, the compiled
        # step is as fast as with real-valued RoPE, and eager is faster (spirelib.model.rope).
        warnings.filterwarnings("ignore", message="Torchinductor does not support code generation for complex")
        step_objective = torch.compile(step_objective)
    sampler = WindowSampler(train_docs, cfg.batch_size, cfg.seq_len + 1, cfg.seed)
    val = validation_windows(val_docs, cfg.eval_windows, cfg.seq_len + 1, cfg.seed) if val_docs is not None else None
    micro, n_micro = cfg.micro_batches(world)
    per_rank = micro * n_micro
    params = [p for p in model.parameters() if p.requires_grad]

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
        state = optimizer_state = None
        if sharded:  # every rank gathers; rank 0 writes the whole model in the single-process format
            state, optimizer_state = fsdp_.full_state(model, opt)
        save_checkpoint(ckpt_dir, model, ident, step=step, finished=finished, optimizer=opt, summary=summary,
                        state=state, optimizer_state=optimizer_state, group=ckpt_group)

    def run_eval(step: int) -> dict:
        if sharded:
            result = evaluate(fsdp, lambda step_module, b: step_module(b, eval_objective), val, micro, dev, rank, world,
                              lockstep=True)
        else:
            result = evaluate(model, eval_objective, val, micro, dev, rank, world)
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
        for group in opt.param_groups:
            group["lr"] = lr
        batch = batch.to(dev, non_blocking=True)  # (B/world, T+1)
        opt.zero_grad(set_to_none=True)
        loss_value, metrics = _accumulate(step_objective, ddp, batch, micro, n_micro, dev)
        loss_value, grad_norm = _update(opt, params, loss_value, cfg, world)
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
            return TrainResult(_plain(model, skeleton).eval(), ckpt_dir, read_meta(ckpt_dir, verify=False),
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
    tokens_per_s = (per_rank * world * cfg.seq_len * clock.timed_steps / clock.timed_s if clock.timed_steps
                    else float("nan"))
    run_s = time.perf_counter() - t_start  # this session's wall clock: compilation, evaluation, checkpoints included
    summary = {"steps": total, "tokens": total * cfg.tokens_per_step(), "train_loss": float(last_loss),
               "tokens_per_s": tokens_per_s, "run_tokens_per_s": (total - start) * cfg.tokens_per_step() / run_s,
               "first_step_s": clock.first_step_s, "budget_params": budget_params,
               "world_size": world, "device": str(dev), **last_val}
    save(total, finished=True, summary=summary)
    return TrainResult(_plain(model, skeleton).eval(), ckpt_dir, read_meta(ckpt_dir, verify=False), log.entries,
                       reused=False)


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP shards one by one inside the root (`fsdp.shard_units`): the model's blocks
    (a `Transformer`'s, a `spire.SpireDraftModel`'s), none for a model without `blocks`."""
    return list(model.blocks) if isinstance(getattr(model, "blocks", None), nn.ModuleList) else []


def _meta_copy(model: nn.Module) -> nn.Module:
    """`model` copied with every parameter on the meta device (no weight is copied; ties kept)."""
    memo = {id(p): nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
            for p in model.parameters()}
    return copy.deepcopy(model, memo)


def _plain(model: nn.Module, skeleton: nn.Module | None) -> nn.Module:
    """The trained model as a plain module on every rank: a sharded one gathered into `skeleton`
    (its unsharded copy on the meta device; collective) on the host, one tensor at a time, so no
    device ever holds the whole model (a 70B target's SPIRe draft is 77 GB in fp32); or `model` itself."""
    if skeleton is None:
        return model
    names = {name for name, _ in skeleton.named_parameters()}
    for name, p in model.named_parameters():
        owner, _, leaf = name.rpartition(".")
        whole = fsdp_.full_tensor(p.detach()).cpu()
        skeleton.get_submodule(owner)._parameters[leaf] = nn.Parameter(whole, requires_grad=p.requires_grad)
        names.discard(name)
    if names:
        raise ValueError(f"parameters of the plain model missing from the sharded one: {sorted(names)[:5]}")
    _tie(skeleton)  # a tied Parameter was replaced once, by its first name
    return skeleton


def _tie(model: nn.Module) -> None:
    """Tie again what `model`'s modules tie (`Transformer.tie`), after their Parameters were replaced."""
    for module in model.modules():
        if hasattr(module, "tie"):
            module.tie()


def _materialize(model: nn.Module, device: torch.device) -> None:
    """Give a model built on the meta device storage on `device` (values undefined until filled)."""
    model.to_empty(device=device)
    _tie(model)
