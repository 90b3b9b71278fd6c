"""Benchmarks: `spire bench NAME [options]`, one module per NAME.

Each module has `add_arguments(parser)`, `problems(args)` (every invalid option, checked before
anything is measured) and `main(args)`; `spirelib.cli` builds `spire bench` from them. What several
share lives here: the model options, the device checks, `synchronize`, and `greedy_mismatch`, how
greedy decoding is judged equal below fp32."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from types import ModuleType


def available() -> dict[str, ModuleType]:
    """NAME (as typed: "spire-train") -> its module, in name order: every module of the package with
    a `main` (one that only serves another, as `gpu_goals` serves `gpu_check`, is no command)."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    modules = {n: importlib.import_module(f"{__name__}.{n}") for n in names}
    return {n.replace("_", "-"): m for n, m in modules.items() if hasattr(m, "main")}


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The target's shape options, defaulting to the default series' target (params/default.yaml)."""
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--target-layers", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--n-q-per-kv", type=int, default=1)
    parser.add_argument("--n-kv", type=int, default=4)
    parser.add_argument("--d-head", type=int, default=32)
    parser.add_argument("--d-ff", type=int, default=512)


MODEL_OPTIONS = ("vocab_size", "target_layers", "d_model", "n_q_per_kv", "n_kv", "d_head", "d_ff")
#: `--dtype`'s names: the models' weights and caches (`torch_dtype`).
DTYPES = ("fp32", "bf16")
#: How many times a timing whose region recorded a round's CUDA graph is taken again (`replayed`).
RETAKES = 2


def model_config(args: argparse.Namespace):
    """The target's `ModelConfig` from `add_model_arguments`' options."""
    from spirelib.model.config import ModelConfig

    return ModelConfig(vocab_size=args.vocab_size, num_layers=args.target_layers, d_model=args.d_model,
                       n_q_per_kv=args.n_q_per_kv, n_kv=args.n_kv, d_head=args.d_head, d_ff=args.d_ff)


def fill_model_options(args: argparse.Namespace, cfg) -> None:
    """Set every `add_model_arguments` option of `args` left None to `cfg`'s (a `ModelConfig`): the
    shape of a benchmark whose default target depends on another option (`bench peer`'s device)."""
    for name in MODEL_OPTIONS:
        if getattr(args, name) is None:
            setattr(args, name, getattr(cfg, "num_layers" if name == "target_layers" else name))


def torch_dtype(name: str):
    """The torch dtype of a `--dtype` name (`DTYPES`)."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


def positive(args: argparse.Namespace, *names: str) -> list[str]:
    """A problem for each option in `names` (or any value of a list option) that is not > 0."""
    out = []
    for name in names:
        value = getattr(args, name)
        if any(v <= 0 for v in (value if isinstance(value, list) else [value])):
            out.append(f"--{name.replace('_', '-')}: must be > 0, got {value}")
    return out


def device_problems(device: str) -> list[str]:
    """Why `--device` cannot run a benchmark on this machine (empty: it can): it must be the CPU or
    a CUDA device that torch sees here."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        return [f"--device {device}: not a device; use cpu, cuda or cuda:N"]
    if dev.type == "cuda" and not torch.cuda.is_available():
        return [(f"--device {device}: no CUDA device here (torch {torch.__version__} sees none); run it on a GPU "
                 "machine, or use --device cpu")]
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        return [f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)"]
    if dev.type not in ("cpu", "cuda"):
        return [f"--device {device}: the benchmarks run on cpu or cuda[:N]"]
    return []


def synchronize(device) -> None:
    """Wait for `device`'s queued kernels (a CUDA device; nothing to wait for on the CPU): a clock read
    after it includes them."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def replayed(measure):
    """`measure()` (a timed region of decoding) and how many round graphs its last take recorded
    (`graphs.GRAPHS.watch`). A take that recorded one timed a capture and a sync, not replays alone,
    so it is taken again, at most `RETAKES` times; a count still above 0 is for the caller to flag,
    never to average in. On the CPU nothing records (no graphs): one take."""
    from spirelib.decoding.graphs import GRAPHS

    for _ in range(RETAKES + 1):
        with GRAPHS.watch() as recorded:
            result = measure()
        if not recorded[0]:
            break
    return result, recorded[0]


#: Logits this close make a near-tie: greedy decoding below fp32 may flip its argmax (`greedy_mismatch`).
TIE_LOGITS = 0.125


def greedy_mismatch(target, contexts, tokens, reference, tie: float = TIE_LOGITS) -> str | None:
    """None when greedy `tokens` (B, G) equal the target's own greedy `reference` (B, G) after
    `contexts` (B, T), or where each row first differs the target's top two logits after the
    reference's prefix are within `tie` (a near-tie: low-precision rounding may flip the argmax, and
    every later token follows from it); otherwise where and by how much they differ."""
    import torch

    for row in range(tokens.shape[0]):
        differ = (tokens[row] != reference[row]).nonzero()
        if not len(differ):
            continue
        i = int(differ[0])
        prefix = torch.cat([contexts[row], reference[row, :i]])[None]  # (1, T + i)
        with torch.no_grad():
            top = target(prefix)[0, -1].float().topk(2).values  # (2,)
        gap = float(top[0] - top[1])
        if gap > tie:
            return f"row {row} differs at new token {i}, where the target's top two logits are {gap:.3f} apart"
    return None
