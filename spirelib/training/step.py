"""One training step and what it works on: a `TrainState` stepped (`train_step`), evaluated, saved and resumed.

`train_step` is `forward_backward` over a rank's batch in micro-batches, then `optimizer_step`
(the gradients clipped over shards, the loss averaged over ranks, AdamW's step), nothing in it
waiting for the device; `evaluate` is the validation loss, sharded over ranks; `save_state` and
`resume` checkpoint a whole or a sharded state. The trainer (`train.train`, which builds the state:
`train.build_train_state`) and the memory simulation (`simulate`) both step through these, so what
is simulated is what trains.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from spirelib.training import fsdp
from spirelib.training.checkpoint import Rows, load_checkpoint, load_rng_state, save_checkpoint
from spirelib.training.config import TrainConfig
from spirelib.training.objectives import Objective


@dataclass
class TrainState:
    """A session's model ready to step (`train.build_train_state`): what `train_step`, `evaluate` and
    `save_state` work on, in `train.train` and in the memory simulation alike."""

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


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
