"""Where training runs: the device a rank uses (`resolve_device`), torchrun's process group
(`init_distributed`), where a trained model lives over the ranks (`Placement`), and torch's
deterministic algorithms while a CPU trains (`deterministic_on_cpu`).

Under torchrun every rank binds its own GPU, cuda:LOCAL_RANK, and the process group (nccl on GPUs,
gloo on the CPU) is initialized once, by whichever caller needs it first: the trainer, `spire`'s
command line, the recipes. Apart from the trainer, so that what only asks which device to use (the
workbook's plan and runner, a notebook) does not depend on it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


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


@dataclass(frozen=True)
class Placement:
    """Where a trained model lives (`train.build_train_state` places it): on this rank's `device`, one
    of `world` ranks, either whole on each (under DDP when there are several) or `sharded` by FSDP2
    over them (`fsdp.shard_units`)."""

    device: torch.device  # this rank's
    world: int  # ranks training together (1: one process)
    sharded: bool = False  # FSDP2: each rank holds its shards of the parameters, gradients and AdamW state
    mesh: DeviceMesh | None = None  # sharded: the mesh (default: `fsdp.device_mesh` over all ranks)
    compute: torch.dtype | None = None  # sharded: the compute dtype (default: `fsdp.mixed_precision`'s)


@contextlib.contextmanager
def deterministic_on_cpu(device: torch.device):
    """torch's deterministic algorithms on while `device` is a CPU (as they were afterwards). Without
    them a compiled training step on the CPU is not bit-reproducible: two 20-step runs of the default
    target from one seed end with different weights, and its 600-step run's validation loss varied
    from 4.648 to 4.680 over three runs; eager steps, and compiled ones under these, are
    reproducible, and no slower here (medians of three 60-step runs each, side by side: 9.8k
    tokens/s under them, 9.1k without). On a GPU they would need cuBLAS's workspace setting and
    refuse some kernels, so a GPU trains as before."""
    before = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(before or device.type == "cpu", warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)
