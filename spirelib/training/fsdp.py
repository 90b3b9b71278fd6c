"""FSDP2 (`torch.distributed.fsdp.fully_shard`) for the frozen target and the trained model, and the
meta-device copies a model too large for one device is built and gathered through.

Under ``parallel: fsdp`` and torchrun no rank holds a whole target, a whole trained model or a whole
optimizer state: the frozen target and the trained model are sharded block by block on one 1-D mesh
(`shard_frozen_target`, `shard_units`), built on the meta device and filled with each rank's rows
(`load_sharded`, `init_spire_draft`); the loss's teacher head is a replicated copy (`teacher_head`).
Checkpoints keep the single-process format: gathered whole on rank 0's host (`full_state`), read back
by rows (`load_local_state`); the trained model is gathered on the host at the end (`gather_plain`).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

#: The `Block` methods other than `forward` that run a sharded block: `run`, SPIRe's k-pass, a
#: layer's share of a pass in one call (its `queries`, `memory_kv` and `finish_heads` inside).
BLOCK_METHODS = ("run",)


def device_mesh(device: torch.device, world: int):
    """The 1-D mesh over all ranks on `device`'s type (an explicit mesh: a gloo default group on
    a GPU box segfaulted under FSDP2, pytorch#132471)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (world,))


def mixed_precision(device: torch.device, compute: torch.dtype | None = None):
    """FSDP2's policy for a trained model: compute in `compute` (default: bf16 on a GPU, the
    parameters' dtype elsewhere) with fp32 gradient reduction; parameters stay fp32 (master weights)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if compute is None and device.type == "cuda":
        compute = torch.bfloat16
    if compute is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)


def shard_units(root: nn.Module, units, mesh, device: torch.device, frozen: bool = False,
                compute: torch.dtype | None = None) -> nn.Module:
    """`fully_shard` each of `units` (modules inside `root`), then `root`. A frozen module keeps its
    dtype (no mixed precision); a trained one computes in `compute` (`mixed_precision`; the simulation
    asks for the GPU's bf16 on the CPU), its master weights fp32.

    The trained model's root is the trainer's objective wrapper (`objectives.ObjectiveModule`), so the
    objective runs inside the root's forward, whatever methods of the model it calls. SPIRe's k-pass
    (method §3.6) calls the draft's blocks through `BLOCK_METHODS` rather than `forward`, once per block
    per pass (k times a forward): each is registered as a forward method, so every call gathers that
    block alone (a 70B target's quarter-depth draft is 19B parameters: it cannot be gathered whole).
    Every sharded module forces sum reductions (`set_force_sum_reduction_for_comms`; FSDP2 divides by
    the world size itself): gloo's ReduceOp.AVG under FSDP2 sums (pytorch#162338)."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    policy = None if frozen else mixed_precision(device, compute)
    kwargs = {"mesh": mesh} if policy is None else {"mesh": mesh, "mp_policy": policy}
    for unit in units:
        fully_shard(unit, **kwargs)
        unit.set_force_sum_reduction_for_comms(True)
        for method in BLOCK_METHODS:
            if hasattr(unit, method):
                register_fsdp_forward_method(unit, method)
    fully_shard(root, **kwargs)
    root.set_force_sum_reduction_for_comms(True)
    return root


def shard_frozen_target(target: nn.Module, mesh, device: torch.device) -> nn.Module:
    """Shard a frozen `Transformer` block by block, then the root, with `residual_stream` (what
    SPIRe reads, method §3.3) registered as a forward method; frozen (eval, no gradients)."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    target.eval().requires_grad_(False)
    shard_units(target, list(target.blocks), mesh, device, frozen=True)
    register_fsdp_forward_method(target, "residual_stream")
    register_fsdp_forward_method(target, "loss")  # an imported target's validation loss
    return target


def local_parameter(model: nn.Module, name: str) -> torch.Tensor:
    """This rank's shard of parameter `name` (a plain tensor where it is not sharded)."""
    return _local(model.get_parameter(name))


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def place(p: torch.Tensor, full: torch.Tensor) -> None:
    """Copy the full tensor `full` into parameter `p` of a sharded model: `distribute_tensor`
    with no source rank (every rank holds `full` and keeps its own rows, no communication)."""
    from torch.distributed.tensor import distribute_tensor

    with torch.no_grad():
        if hasattr(p, "to_local"):
            full = full.to(device=p.to_local().device, dtype=p.dtype)
            p.to_local().copy_(distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local())
        else:
            p.copy_(full)


def load_sharded(model: nn.Module, tensors, device: torch.device) -> nn.Module:
    """Materialize a model sharded on the meta device (`to_empty`) and fill it from `tensors`,
    an iterable of (name, full tensor) read one at a time (e.g. memory-mapped from
    safetensors): no rank holds more than one full tensor at once."""
    model.to_empty(device=device)
    seen = set()
    for name, full in tensors:
        place(model.get_parameter(name), full)
        seen.add(name)
    names = {n for n, _ in model.named_parameters()}
    if names - seen:
        raise ValueError(f"parameters missing from the checkpoint: {sorted(names - seen)[:5]}")
    if any(True for _ in model.buffers()):  # to_empty left them undefined (our models have none: RoPE is computed)
        raise ValueError("load_sharded fills parameters only; this model has buffers")
    return model


def init_spire_draft(draft: nn.Module, target: nn.Module) -> None:
    """Fill a SPIRe draft (`spire.SpireDraftModel`) sharded on the target's 1-D mesh, once it has
    storage (`to_empty`), with what `SpireDraftModel.from_target` builds in one process, no rank
    ever holding it whole: pruned init (method §3.1) copies each parameter's local shard from the
    target's (`pruned_source`): a draft parameter has its target parameter's shape, and with the same
    Shard(0) placement on a mesh of the same ranks each rank's rows are the same, so no communication;
    the random_init ablation draws the same numbers as one process, one tensor at a time
    (`Transformer.initial_parameters`), each rank keeping its rows. The feedback mixture starts at zeros."""
    from spirelib.model.transformer import Transformer

    with torch.no_grad():
        if draft.cfg.pruned_init:
            for name, p in draft.body.named_parameters():
                source = draft.pruned_source(name)
                src = target.get_parameter(source)
                if not hasattr(src, "to_local"):  # a whole target: every rank keeps its rows
                    place(p, src)
                    continue
                if (src.placements, src.device_mesh, src.shape) != (p.placements, p.device_mesh, p.shape):
                    raise ValueError(f"the draft's {name} and the target's {source} are not sharded alike "
                                     f"({p.placements} over {p.device_mesh}, {src.placements} over "
                                     f"{src.device_mesh}): shard both with training.fsdp on one 1-D mesh")
                p.to_local().copy_(src.to_local())
        else:
            for name, full in Transformer.initial_parameters(draft.body.cfg):
                place(draft.body.get_parameter(name), full)
        local_parameter(draft, "mix").zero_()


def block_units(model: nn.Module) -> list[nn.Module]:
    """The modules a trained model is sharded by, one by one inside the root (`shard_units`): its blocks
    (a `Transformer`'s, a `spire.SpireDraftModel`'s), none for a model without `blocks`."""
    return list(model.blocks) if isinstance(getattr(model, "blocks", None), nn.ModuleList) else []


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered whole (collective: every rank calls it), or `t` itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def clip_grad_norm(params: list, max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` for plain or sharded (DTensor) gradients: the global norm
    from each rank's local shards (their squared norms all-reduced), then every local shard scaled
    in place. torch's own, given DTensor gradients, materialized the whole fp32 gradient on every rank
    during the step (traced: +77 GB a rank at 70B); this holds no more than the shards. Returns the
    total norm (a plain 0-dim tensor, on the gradients' device; collective when sharded)."""
    grads = [p.grad for p in params if p.grad is not None]
    local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    if not any(hasattr(g, "to_local") for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    total = torch.nn.utils.get_total_norm(local).float() ** 2  # this rank's share of the squared norm
    dist.all_reduce(total)
    total = total.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # torch's clipping coefficient
    torch._foreach_mul_([g for g in local if g.numel()], coef)
    return total


def teacher_head(target: nn.Module) -> tuple[nn.Module, torch.Tensor]:
    """(norm, unembedding weight): a replicated frozen copy of a (sharded or plain) target's final
    norm and unembedding, MixedLoss's teacher head (method §3.7; `spire.SpireObjective`'s `head`),
    so the loss never touches a sharded target parameter. Collective on a sharded target."""
    from spirelib.model.transformer import RMSNorm

    w_norm = full_tensor(target.norm.weight.detach())
    norm = RMSNorm(w_norm.shape[0], target.norm.eps)
    norm.weight = nn.Parameter(w_norm.clone(), requires_grad=False)  # the gathered gain, its device and dtype
    return norm, full_tensor(target.unembed.weight.detach()).clone()


# ------------------------------------------------------------------ checkpoints (full state, CPU offload)

def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(model state, optimizer state) of a sharded model, gathered whole on rank 0's CPU (empty
    dicts elsewhere); the optimizer state in `optimizer.state_dict()`'s single-process layout
    (parameters numbered in group order), which `checkpoint.save_checkpoint` writes: the saved model
    loads in one process (and in the HF export) as any other."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=options)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=options)
    if dist.get_rank() != 0:
        return {}, {}
    order = [fqn for group in optim_sd["param_groups"] for fqn in group["params"]]
    index = {fqn: i for i, fqn in enumerate(order)}
    groups, start = [], 0
    for group in optim_sd["param_groups"]:
        n = len(group["params"])
        groups.append({**group, "params": list(range(start, start + n))})
        start += n
    state = {index[fqn]: s for fqn, s in optim_sd["state"].items()}
    return model_sd, {"state": state, "param_groups": groups}


def local_rows(p: torch.Tensor) -> tuple[int, int]:
    """Rows [start, stop) of dim 0 of parameter `p` that this rank holds: a sharded parameter's
    (FSDP2's Shard(0) on a 1-D mesh: `torch.chunk`'s rows, as `place` lays them out), all of a plain one's."""
    if not hasattr(p, "to_local"):
        return 0, p.shape[0]
    from torch.distributed.tensor import Shard

    if tuple(p.placements) != (Shard(0),) or p.device_mesh.ndim != 1:
        raise ValueError(f"a parameter sharded as {p.placements} over {p.device_mesh}; this code reads rows of "
                         "Shard(0) on a 1-D mesh (what training.fsdp shards)")
    n = p.shape[0]
    chunk = -(-n // p.device_mesh.size())
    start = min(p.device_mesh.get_local_rank() * chunk, n)
    stop = min(start + chunk, n)
    if stop - start != p.to_local().shape[0]:
        raise ValueError(f"rows {start}..{stop} of a parameter of {n} rows, but this rank holds "
                         f"{p.to_local().shape[0]}: not torch.chunk's layout")
    return start, stop


def load_local_state(model: nn.Module, optimizer: torch.optim.Optimizer, rows, meta: dict) -> None:
    """Resume a sharded model and its optimizer from a single-process checkpoint (`checkpoint.save_checkpoint`)
    reading this rank's rows of each tensor only (`rows`: `checkpoint.Rows` of the checkpoint, `meta` its
    meta.json): the weights and AdamW's moments, 1/world of the state a rank (231 GB in all at 70B); a
    0-dim state (AdamW's step) whole."""
    from torch.distributed.tensor import DTensor

    from spirelib.training.checkpoint import optimizer_state_dict

    tied = meta.get("tied", {})
    with torch.no_grad():
        for name, p in model.named_parameters():
            start, stop = local_rows(p)
            if stop > start:
                _local(p).copy_(rows.read("model.safetensors", tied.get(name, name), start, stop))
    order = [p for group in optimizer.param_groups for p in group["params"]]
    tensors = {}
    for key in rows.keys("optimizer.safetensors"):
        p = order[int(key.split(".")[1])]  # state.<parameter index>.<name>
        if not rows.shape("optimizer.safetensors", key):  # 0-dim, the step: whole, on every rank
            tensors[key] = rows.read("optimizer.safetensors", key)
            continue
        start, stop = local_rows(p)
        local = torch.empty_like(_local(p))  # this rank's rows of a moment, on the parameter's device
        if stop > start:
            local.copy_(rows.read("optimizer.safetensors", key, start, stop))
        tensors[key] = DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                          stride=p.stride()) if hasattr(p, "to_local") else local
    optimizer.load_state_dict(optimizer_state_dict(tensors, meta))


# ------------------------------------------------------------------ the meta device

def meta_copy(model: nn.Module) -> nn.Module:
    """`model` copied with every parameter on the meta device (no weight is copied; ties kept): the
    skeleton a sharded model is gathered into (`gather_plain`)."""
    memo = {id(p): nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
            for p in model.parameters()}
    return copy.deepcopy(model, memo)


def materialize(model: nn.Module, device: torch.device) -> None:
    """Give a model built on the meta device storage on `device` (values undefined until filled)."""
    model.to_empty(device=device)
    retie(model)


def retie(model: nn.Module) -> None:
    """Tie again what `model`'s modules tie (`Transformer.tie`), after their Parameters were replaced."""
    for module in model.modules():
        if hasattr(module, "tie"):
            module.tie()


def gather_plain(model: nn.Module, skeleton: nn.Module) -> nn.Module:
    """A sharded trained model as a plain module on every rank: gathered into `skeleton` (its unsharded
    copy on the meta device, `meta_copy`; collective) on the host, one tensor at a time, so no device
    ever holds the whole model (a 70B target's SPIRe draft is 77 GB in fp32)."""
    names = {name for name, _ in skeleton.named_parameters()}
    for name, p in model.named_parameters():
        owner, _, leaf = name.rpartition(".")
        whole = full_tensor(p.detach()).cpu()
        skeleton.get_submodule(owner)._parameters[leaf] = nn.Parameter(whole, requires_grad=p.requires_grad)
        names.discard(name)
    if names:
        raise ValueError(f"parameters of the plain model missing from the sharded one: {sorted(names)[:5]}")
    retie(skeleton)  # a tied Parameter was replaced once, by its first name
    return skeleton
