"""The training configuration (`TrainConfig`: optimizer, schedule, budget, method §6) and the
checked construction of any config dataclass from a params mapping (`from_dict_checked`): both
refuse a bad value with a message naming the field, before any compute."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields


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
