"""Checkpoints: safetensors tensors plus JSON metadata, keyed by a config hash. No pickle.

A checkpoint is a folder:

    model.safetensors       the model's state_dict
    optimizer.safetensors   optimizer tensors ("state.<param index>.<name>"); the rest
                            (param_groups, scalars) lives in meta.json
    rng.safetensors         torch CPU (and CUDA) generator states
    meta.json               {"format", "identity", "config_hash", "step", "finished",
                             "summary", "optimizer", "files": {name: sha256}}

`identity` is the full JSON-able description of what was trained (model config, training
config, data checksum, objective, and whatever the caller adds, e.g. a target checkpoint's
hash); `config_hash(identity)` is its sha256. Saving is atomic (write a sibling folder,
then swap), so a crash never leaves a half-written checkpoint; `read_meta` verifies every
file's sha256 and refuses a corrupt checkpoint, `check_identity` refuses one trained for a
different identity, naming the fields that differ.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FORMAT = 1


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: corrupt, or trained for another config."""


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def config_hash(identity: dict) -> str:
    return hashlib.sha256(canonical_json(identity).encode()).hexdigest()


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def diff_identities(saved: dict, requested: dict) -> list[str]:
    """Human-readable differences, one per dotted field: 'train.lr: 0.001 (checkpoint) != 0.002 (requested)'."""
    a, b = _flatten(saved), _flatten(requested)
    lines = []
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            lines.append(f"{key}: {a.get(key, '<absent>')!r} (checkpoint) != {b.get(key, '<absent>')!r} (requested)")
    return lines


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _optimizer_tensors(sd: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {}
    for idx, state in sd["state"].items():
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{idx}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{idx}.{name}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _optimizer_state(tensors: dict[str, torch.Tensor], rest: dict) -> dict:
    """The `optimizer.state_dict()` saved as `tensors` and meta.json's `rest`."""
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = value
    for key, value in rest["scalars"].items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in rest["param_groups"]]
    return {"state": state, "param_groups": groups}


def read_optimizer_state(path: Path, meta: dict) -> dict:
    """The optimizer state of checkpoint `path` (its `read_meta`), as `optimizer.state_dict()` gives it."""
    return _optimizer_state(load_file(Path(path) / "optimizer.safetensors"), meta["optimizer"])


def rng_state() -> dict[str, torch.Tensor]:
    states = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            states[f"torch_cuda.{i}"] = s
    return states


def set_rng_state(states: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(states["torch_cpu"])
    cuda = [states[k] for k in sorted(k for k in states if k.startswith("torch_cuda."))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def _untied_state(full: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A state_dict with every tensor shared by several names (tied embeddings) stored once,
    under its first name, and {other name: first name} for the rest (safetensors refuses
    shared tensors)."""
    state, tied, first = {}, {}, {}
    for name, value in full.items():
        source = _same(value, first)
        if source is not None:
            tied[name] = source
            continue
        first[name] = value
        state[name] = value.detach().cpu().contiguous()
    return state, tied


def _same(value: torch.Tensor, first: dict[str, torch.Tensor]) -> str | None:
    """The name in `first` of a tensor that is `value` (same storage, offset, shape, strides)."""
    for name, other in first.items():
        if (other.numel() and value.data_ptr() == other.data_ptr() and value.shape == other.shape
                and value.stride() == other.stride() and value.dtype == other.dtype):
            return name
    return None


def save_checkpoint(path: Path, model: torch.nn.Module, identity: dict, *, step: int, finished: bool,
                    optimizer: torch.optim.Optimizer | None = None, summary: dict | None = None,
                    state: dict | None = None, optimizer_state: dict | None = None) -> None:
    """Write a checkpoint folder atomically (the previous one stays valid until the swap). `state` and
    `optimizer_state` replace `model.state_dict()` and `optimizer.state_dict()` (a sharded model's,
    gathered whole: `fsdp.full_state`)."""
    path = Path(path)
    tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state, tied = _untied_state(model.state_dict() if state is None else state)
    save_file(state, tmp / "model.safetensors")
    meta = {"format": FORMAT, "identity": identity, "config_hash": config_hash(identity), "step": step,
            "finished": finished, "summary": summary or {}, "torch": torch.__version__}
    if tied:
        meta["tied"] = tied
    if optimizer is not None or optimizer_state is not None:
        sd = optimizer.state_dict() if optimizer_state is None else optimizer_state
        tensors, meta["optimizer"] = _optimizer_tensors(sd)
        save_file(tensors, tmp / "optimizer.safetensors")
    save_file(rng_state(), tmp / "rng.safetensors")
    meta["files"] = {f.name: _sha256(f) for f in sorted(tmp.glob("*.safetensors"))}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def checkpoint_path(path: Path) -> Path | None:
    """The checkpoint folder at `path`, or its previous version if a crash interrupted a swap."""
    path = Path(path)
    for candidate in (path, path.with_name(path.name + ".old")):
        if (candidate / "meta.json").is_file():
            return candidate
    return None


def finished_checkpoint(run_dir: Path | None) -> bool:
    """Whether the run folder `run_dir` (None: no such run) holds a finished checkpoint, from its
    meta.json alone (no file is hashed: a plan's look, `spirelib.workbook.plan`; loading it checks)."""
    found = None if run_dir is None else checkpoint_path(Path(run_dir) / "checkpoint")
    if found is None:
        return False
    try:
        return bool(json.loads((found / "meta.json").read_text()).get("finished"))
    except (OSError, ValueError):
        return False


def read_meta(path: Path) -> dict:
    """meta.json of a checkpoint, after checking every listed file's sha256."""
    path = Path(path)
    fix = f"delete {path} to retrain from scratch (or restore it from a backup)"
    try:
        meta = json.loads((path / "meta.json").read_text())
        files = meta["files"]
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt: unreadable meta.json ({e}); {fix}") from e
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {meta.get('format')}, this code reads {FORMAT}; {fix}")
    for name, digest in files.items():
        f = path / name
        if not f.is_file() or _sha256(f) != digest:
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} is missing or fails its sha256 check; {fix}")
    return meta


def check_identity(path: Path, meta: dict, identity: dict) -> None:
    """Refuse a checkpoint whose identity differs from `identity`, naming the differing fields."""
    if meta["config_hash"] == config_hash(identity):
        return
    diffs = diff_identities(meta["identity"], identity)
    raise CheckpointError(
        f"checkpoint {path} was trained for a different config (hash {meta['config_hash'][:12]} != "
        f"{config_hash(identity)[:12]}); differing fields:\n  " + "\n  ".join(diffs)
        + f"\nUse the config it was trained with, or delete {path} (or choose another run folder) to train anew."
    )


def load_checkpoint(path: Path, model: torch.nn.Module, identity: dict | None = None,
                    optimizer: torch.optim.Optimizer | None = None, restore_rng: bool = False) -> dict:
    """Load weights (and optimizer / RNG state) into `model`; verify integrity and, if given,
    the identity. Returns the metadata."""
    path = Path(path)
    meta = read_meta(path)
    if identity is not None:
        check_identity(path, meta, identity)
    try:
        state = load_file(path / "model.safetensors")
        for name, source in meta.get("tied", {}).items():
            state[name] = state[source]  # load_state_dict copies into the model's own (shared) Parameter
        model.load_state_dict(state)
        if optimizer is not None:
            optimizer.load_state_dict(read_optimizer_state(path, meta))
        if restore_rng:
            set_rng_state(load_file(path / "rng.safetensors"))
    except (RuntimeError, KeyError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} does not fit this model/optimizer ({e}); "
                              f"delete {path} to retrain") from e
    return meta
