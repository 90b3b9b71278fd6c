"""Per-rank memory of SPIRe draft training under ddp and fsdp (`spirelib.training.fsdp`).

A model of the bytes one rank holds while a SPIRe draft (method §3) trains against a frozen
target, from the shapes alone (computed, not measured; GB = 1e9 bytes):

- frozen target, in bf16 (2 bytes a parameter): whole under ddp; under fsdp its 1/N share,
  plus what a forward gathers at once (the root: embedding, final norm and unembedding, and two
  blocks, the running one and the one prefetched), plus the replicated teacher head (final
  norm and unembedding) MixedLoss reads;
- the draft's training state: fp32 weights, gradients and AdamW's two moments (16 bytes a
  parameter); ddp adds its gradient buckets (4 bytes a parameter) and autocast's bf16 copies of
  the weights (2); fsdp holds the 1/N share, plus the units gathered during a step at 8 bytes a
  parameter (bf16 weights, bf16 gradients, their fp32 copy for the reduce-scatter): the root
  (embedding, unembedding, norm, mixing logits) and two blocks;
- the target's residual stream the step keeps (`Transformer.residual_stream(layers=...)`: the
  draft's n_d memory entries and the last one), bf16, for the rank's windows.

Left out: the draft's own activations (k passes; they scale with the rank's windows, and
micro-batches bound them), the CUDA context and allocator slack (a few GB): a figure under the
device's memory by less than ~10% is not a promise. The draft is the paper's ratio, a quarter of
the target's layers (`draft_layers`), with the target's embedding and unembedding.

Checked against the traced run (`spirelib.training.simulate`, docs/scaling-out.md): at 70B over 8
ranks this model's 99.1 GB is 18% under the simulated step's 120.5 GB (the activations and the
loss's chunks it leaves out); plan with the simulation, use this for quick what-ifs over N.
"""

from __future__ import annotations

from dataclasses import dataclass

from spirelib.throughput.perfmodel import ModelShape, body_params, resolve_shape

LLAMA3_VOCAB = 128_256
PARALLEL = ("ddp", "fsdp")  # how torchrun's ranks share a training (training.fsdp): the one list the series checks


def draft_layers(target: ModelShape) -> int:
    """The paper's SPIRe draft depth: a quarter of the target's layers (20 of Llama 3 70B's 80)."""
    return max(1, target.num_layers // 4)


@dataclass(frozen=True)
class RankMemory:
    """Bytes per rank, by part (module docstring)."""

    target_weights: float  # frozen target: its share (fsdp) or all of it (ddp)
    target_gathered: float  # fsdp: what a target forward gathers at once; 0 under ddp
    teacher_head: float  # fsdp: the replicated final norm and unembedding; 0 under ddp (the target's own)
    draft_state: float  # fp32 weights, gradients, AdamW moments (fsdp: the share)
    draft_extra: float  # ddp: gradient buckets and bf16 copies; fsdp: the units gathered during a step
    stream: float  # the residual-stream entries the step keeps

    @property
    def total(self) -> float:
        return (self.target_weights + self.target_gathered + self.teacher_head + self.draft_state + self.draft_extra
                + self.stream)


def rank_memory(target: ModelShape | str, parallel: str, world: int, *, vocab: int = LLAMA3_VOCAB,
                n_draft: int | None = None, batch: int = 64, seq_len: int = 1024,
                micro_batch: int = 0) -> RankMemory:
    """Per-rank memory (`RankMemory`) of SPIRe training on `target` over `world` ranks; `batch`
    windows of `seq_len` a step over all ranks, `micro_batch` windows at once (0: the rank's share)."""
    if parallel not in PARALLEL:
        raise ValueError(f"parallel must be one of {PARALLEL}, got {parallel!r}")
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    shape = resolve_shape(target)
    n_d = draft_layers(shape) if n_draft is None else n_draft
    d = shape.d_model
    block = body_params(shape) / shape.num_layers
    ends = 2 * vocab * d + d  # embedding, unembedding, final norm
    p_target = body_params(shape) + ends
    p_draft = n_d * block + ends + n_d * (n_d + 1)
    windows = micro_batch or max(1, batch // world)
    stream = (n_d + 1) * windows * seq_len * d * 2
    if world == 1:  # one process: neither DDP's buckets nor sharding; autocast's bf16 copies
        return RankMemory(2 * p_target, 0.0, 0.0, 16 * p_draft, 2 * p_draft, stream)
    if parallel == "ddp":
        return RankMemory(2 * p_target, 0.0, 0.0, 16 * p_draft, 6 * p_draft, stream)
    return RankMemory(2 * p_target / world, 2 * (ends + 2 * block), 2 * (vocab * d + d), 16 * p_draft / world,
                      8 * (ends + n_d * (n_d + 1) + 2 * block), stream)


def smallest_world(target: ModelShape | str, parallel: str, budget: float, *, max_world: int = 1024,
                   **kwargs) -> int | None:
    """The fewest ranks whose per-rank memory fits `budget` bytes (None: none up to `max_world`;
    under ddp the per-rank memory shrinks only with the stream, so mostly 1 or None)."""
    for world in range(1, max_world + 1):
        if rank_memory(target, parallel, world, **kwargs).total <= budget:
            return world
    return None


def memory_table(targets=("llama3-8b", "llama3-70b"), worlds=(1, 2, 4, 8, 16), **kwargs) -> list[dict]:
    """Rows {target, parallel, world, GB by part, total_gb} for every target, mode and world size."""
    rows = []
    for target in targets:
        for parallel in PARALLEL:
            for world in worlds:
                m = rank_memory(target, parallel, world, **kwargs)
                rows.append({"target": target, "parallel": parallel, "world": world,
                             **{k: v / 1e9 for k, v in vars(m).items()}, "total_gb": m.total / 1e9})
    return rows
