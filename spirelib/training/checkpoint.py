"""Checkpoints: safetensors tensors plus JSON metadata, keyed by a config hash. No pickle.

A checkpoint is a folder: model.safetensors (the model's state_dict), optimizer.safetensors (the
optimizer's tensors, `optimizer_tensors`), rng.safetensors (the generators' states) and meta.json
(`save_checkpoint`). `identity` is the full JSON-able description of what was trained (model
config, training config, data checksum, objective, and whatever the caller adds, e.g. a target
checkpoint's hash); `config_hash(identity)` is its sha256. Saving is atomic (write a sibling folder,
then swap), so a crash never leaves a half-written checkpoint; `read_meta` verifies every file's
sha256 and refuses a corrupt checkpoint, `check_identity` refuses one trained for a different
identity, naming the fields that differ. A distributed run's ranks share the long work
(`checkpoint_group`); a sharded run resuming reads only its rows of each tensor (`Rows`).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import load_file, save_file

#: The meta.json layout written: 2, each file's size and the digests of its chunks; 1 (`READS` it too), each
#: file's one sha256. A newer format than these is refused with the advice to update the code.
FORMAT = 2
READS = (1, 2)
#: Bytes per digest of a checkpoint file: its chunks are hashed and verified in parallel over the ranks.
DIGEST_CHUNK = 1 << 30
#: The timeout of a distributed run's checkpoint collectives (`checkpoint_group`): while rank 0 writes a
#: 70B target's SPIRe draft and its AdamW state (231 GB: 4 minutes at 1 GB/s, 20 at 200 MB/s), the others
#: wait in them; NCCL's default of 10 minutes would end the run.
CHECKPOINT_TIMEOUT = datetime.timedelta(hours=2)


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
        if a.get(key, "(absent)") != b.get(key, "(absent)"):
            lines.append(f"{key}: {a.get(key, '(absent)')!r} (checkpoint) != {b.get(key, '(absent)')!r} (requested)")
    return lines


def checkpoint_group():
    """A gloo process group over all ranks for checkpoints' collectives, its timeout
    `CHECKPOINT_TIMEOUT`; None outside a distributed run. Collective: every rank calls it.

    A distributed run's ranks share the checkpoint's long work on it, its timeout covering rank 0
    writing a sharded model's gathered state (231 GB at 70B: minutes) while the others wait. The
    files are hashed in chunks of `DIGEST_CHUNK` bytes, each rank its share, when written and when
    verified (`read_meta`), the results combined; a sharded run resuming reads only its rows of each
    tensor (`Rows`, `fsdp.load_local_state`)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    return dist.new_group(backend="gloo", timeout=CHECKPOINT_TIMEOUT)


def _sha256(path: Path, offset: int = 0, length: int | None = None) -> str:
    """sha256 of `length` bytes of the file at `path` from `offset` (None: to its end)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        left = length
        while left is None or left > 0:
            block = f.read(1 << 22 if left is None else min(1 << 22, left))
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h.hexdigest()


def _share(items: list, group) -> list:
    """This rank's share of `items` (every world-th one from its rank); all of them without a `group`."""
    return items if group is None else items[dist.get_rank(group)::dist.get_world_size(group)]


def _combined(items: list, group) -> list:
    """Every rank's `items`, concatenated, on every rank (collective under `group`)."""
    if group is None:
        return items
    parts = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, items, group=group)
    return [item for part in parts for item in part]


def _digests(folder: Path, names: list[str], group=None) -> dict:
    """meta.json's "files" for the files `names` in `folder`: size, chunk and the sha256 of each
    `DIGEST_CHUNK` bytes, each rank of `group` hashing its share (collective)."""
    sizes = {name: (folder / name).stat().st_size for name in names}
    chunks = [(name, i) for name in names for i in range(max(1, -(-sizes[name] // DIGEST_CHUNK)))]
    mine = [(name, i, _sha256(folder / name, i * DIGEST_CHUNK, DIGEST_CHUNK)) for name, i in _share(chunks, group)]
    digests = {(name, i): digest for name, i, digest in _combined(mine, group)}
    return {name: {"size": sizes[name], "chunk": DIGEST_CHUNK,
                   "sha256": [digests[n, i] for n, i in chunks if n == name]} for name in names}


def _chunks(files: dict) -> list[tuple[str, int, int | None, str]]:
    """(file, offset, length, sha256) of every digest in meta.json's "files" (length None: to the end
    of the file, an older checkpoint's one digest a file)."""
    if any(isinstance(entry, str) for entry in files.values()):
        return [(name, 0, None, entry) for name, entry in files.items()]
    return [(name, i * entry["chunk"], entry["chunk"], digest)
            for name, entry in files.items() for i, digest in enumerate(entry["sha256"])]


def optimizer_tensors(sd: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """An `optimizer.state_dict()` as a checkpoint stores it: its tensors ({"state.<param index>.<name>":
    tensor}, optimizer.safetensors) and the rest (meta.json's "optimizer": the param groups and the
    scalars); `optimizer_state_dict` is the inverse."""
    tensors, scalars = {}, {}
    for idx, state in sd["state"].items():
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{idx}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{idx}.{name}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def optimizer_state_dict(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    """The `optimizer.state_dict()` of a checkpoint's optimizer tensors (all of them, or a rank's
    rows of each: `fsdp.load_local_state`) and its meta.json (`meta["optimizer"]`: the rest)."""
    rest = meta["optimizer"]
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = value
    for key, value in rest["scalars"].items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in rest["param_groups"]]
    return {"state": state, "param_groups": groups}


class Rows:
    """A checkpoint's tensors by row ranges, read from its safetensors files without reading the
    rest (`safe_open`'s slices): what a rank of a sharded run reads on resume (`fsdp.load_local_state`).
    `keys(file)`, `shape(file, key)`, `read(file, key, start, stop)`: rows [start, stop) of a tensor
    (start None: all of it)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._files = {}

    def _open(self, file: str):
        if file not in self._files:
            self._files[file] = safe_open(self.path / file, framework="pt", device="cpu")
        return self._files[file]

    def keys(self, file: str) -> list[str]:
        return list(self._open(file).keys())

    def shape(self, file: str, key: str) -> list[int]:
        return list(self._open(file).get_slice(key).get_shape())

    def read(self, file: str, key: str, start: int | None = None, stop: int | None = None) -> torch.Tensor:
        if start is None:
            return self._open(file).get_tensor(key)
        return self._open(file).get_slice(key)[start:stop]


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


def load_rng_state(path: Path) -> None:
    """Restore the generators' states checkpoint `path` saved."""
    set_rng_state(load_file(Path(path) / "rng.safetensors"))


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


# parameters: what one checkpoint holds, keyword-only, each optional part defaulted
def save_checkpoint(path: Path, model: torch.nn.Module, identity: dict, *, step: int, finished: bool,
                    optimizer: torch.optim.Optimizer | None = None, summary: dict | None = None,
                    state: dict | None = None, optimizer_state: dict | None = None, group=None) -> None:
    """Write a checkpoint folder atomically (the previous one stays valid until the swap):
    model.safetensors, optimizer.safetensors (`optimizer_tensors`: "state.<param index>.<name>"; the
    rest, param_groups and scalars, lives in meta.json), rng.safetensors (torch CPU and CUDA generator
    states) and meta.json ({"format", "identity", "config_hash", "step", "finished", "summary",
    "optimizer", "files": {name: {"size", "chunk", "sha256": [the sha256 of each `chunk` bytes]}}}:
    format 2; format 1, still read: "files": {name: sha256}). `state` and `optimizer_state` replace
    `model.state_dict()` and `optimizer.state_dict()` (a sharded model's, gathered whole:
    `fsdp.full_state`). Under `group` (`checkpoint_group`) every rank calls it: rank 0 writes the
    files (the others' arguments are not read), every rank hashes its share of them, rank 0 writes
    meta.json and swaps; it returns on every rank once the checkpoint is in place."""
    path = Path(path)
    tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
    writer = group is None or dist.get_rank(group) == 0
    names = [None]
    if writer:
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
            tensors, meta["optimizer"] = optimizer_tensors(sd)
            save_file(tensors, tmp / "optimizer.safetensors")
        save_file(rng_state(), tmp / "rng.safetensors")
        names = [sorted(f.name for f in tmp.glob("*.safetensors"))]
    if group is not None:  # the files are written (rank 0's work, the others wait: under the group's timeout)
        dist.broadcast_object_list(names, src=dist.get_global_rank(group, 0), group=group)
    files = _digests(tmp, names[0], group)
    if writer:
        meta["files"] = files
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    if group is not None:
        dist.barrier(group=group)


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


def read_meta(path: Path, group=None, verify: bool = True) -> dict:
    """meta.json of a checkpoint, after checking every listed file's sha256 (`verify`; without it, a
    checkpoint this run has just written). Under `group` every rank calls it and checks its share of
    the files' chunks; every rank then refuses a corrupt checkpoint alike."""
    path = Path(path)
    fix = f"delete {path} to retrain from scratch (or restore it from a backup)"
    try:
        meta = json.loads((path / "meta.json").read_text())
        files = meta["files"]
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt: unreadable meta.json ({e}); {fix}") from e
    found = meta.get("format")
    if found not in READS:
        newer = isinstance(found, int) and found > FORMAT
        raise CheckpointError(f"checkpoint {path} has format {found}, this code reads formats {list(READS)}; " + (
            "a newer spire-workbook wrote it: update this checkout (git pull, then make setup) to use it, "
            f"or {fix}" if newer else fix))
    if not verify:
        return meta
    bad = [name for name, entry in files.items() if not (path / name).is_file()
           or (isinstance(entry, dict) and (path / name).stat().st_size != entry["size"])]
    bad += [name for name, offset, length, digest in _share(_chunks(files), group)
            if name not in bad and _sha256(path / name, offset, length) != digest]
    bad = sorted(set(_combined(bad, group)))
    if bad:
        raise CheckpointError(f"checkpoint {path} is corrupt: {bad[0]} is missing or fails its sha256 check; {fix}")
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
                    optimizer: torch.optim.Optimizer | None = None, restore_rng: bool = False,
                    meta: dict | None = None) -> dict:
    """Load weights (and optimizer / RNG state) into `model`; verify integrity (unless `meta`, its
    `read_meta`, is given) and, if given, the identity. Returns the metadata."""
    path = Path(path)
    meta = read_meta(path) if meta is None else meta
    if identity is not None:
        check_identity(path, meta, identity)
    try:
        state = load_file(path / "model.safetensors")
        for name, source in meta.get("tied", {}).items():
            state[name] = state[source]  # load_state_dict copies into the model's own (shared) Parameter
        model.load_state_dict(state)
        if optimizer is not None:
            optimizer.load_state_dict(optimizer_state_dict(load_file(path / "optimizer.safetensors"), meta))
        if restore_rng:
            load_rng_state(path)
    except (RuntimeError, KeyError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} does not fit this model/optimizer ({e}); "
                              f"delete {path} to retrain") from e
    return meta
