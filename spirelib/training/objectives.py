"""What the trainer minimises, `objective(model, batch) -> (loss, metrics)` (`Objective`): a language
model's next-token cross-entropy (`lm_objective`) and SPIRe's k-pass objective against the frozen
target (method §3.6-3.7, `SpireObjective`); `ObjectiveModule` runs one as a module's forward, for
the DDP and FSDP wrappers."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from spirelib.model.transformer import Transformer
from spirelib.training.losses import head_draft_losses

#: ``objective(model, batch) -> (loss, metrics)``. `batch` is a LongTensor (B, T+1) of token windows
#: on the training device (B is this rank's share of `TrainConfig.batch_size`, or `micro_batch_size`
#: windows of it when set, T = `seq_len`). `loss` is a scalar tensor to minimize, the mean over the
#: batch's windows (micro-batches of a step are equal in size, so the mean of their losses and the sum
#: of their gradients / their count are those of the whole batch); `metrics` a dict of extra scalars
#: to log (floats or 0-dim tensors, means over the batch likewise; averaged over a step's
#: micro-batches, each logging interval and the validation set). `model` is always the plain module
#: (call any of its methods): under DDP and FSDP the trainer wraps the objective call itself
#: (`ObjectiveModule`), so gradients are reduced whatever the objective computes. Frozen helpers (a
#: target) are captured by the objective (a closure or a callable object) and must live on the same
#: device; bf16 autocast (GPU only) is active around the call.
Objective = Callable[[nn.Module, torch.Tensor], "tuple[torch.Tensor, dict[str, float]]"]


def lm_objective(model: nn.Module, batch: torch.Tensor):
    """Next-token cross-entropy (HardTargetLoss, method §3.7) of a `Transformer` on windows (B, T+1),
    fused with the unembedding (`Transformer.loss`)."""
    return model.loss(batch[:, :-1], batch[:, 1:]), {}


class ObjectiveModule(nn.Module):
    """`objective(model, batch)` as a module's forward, so that DDP, which all-reduces the
    gradients of what runs inside its forward, wraps the whole objective (and FSDP2 shards the model
    with this as its root): objectives call any method of the plain model. `forward(batch, objective)`
    runs another objective on the same model (the evaluation's)."""

    def __init__(self, model: nn.Module, objective: Objective):
        super().__init__()
        self.model, self.objective = model, objective

    def forward(self, batch: torch.Tensor, objective: Objective | None = None):
        return (objective or self.objective)(self.model, batch)


class SpireObjective:
    """Training objective for the trainer, `objective(draft_model, batch) -> (loss, metrics)`:
    the frozen target runs on the batch's inputs (activations on the fly), the draft runs k
    passes (k = its config's), and the configured loss applies at every block position,
    fused with both unembeddings (`losses.head_draft_losses`: the target's next-token
    distributions and the draft's logits exist one chunk of rows at a time). Metrics include
    alpha per draft position j, the training-time estimate of P[draft j accepted | the ones
    before were] (method §8); they stay on the device (0-dim tensors): no host sync per step.

    The target runs in its own dtype (a bf16 checkpoint stays bf16) and keeps only the
    residual-stream entries the draft reads and the last one; its activations are cast to the
    draft's dtype where they enter the draft (fp32 weights, `SpireDraftModel.from_target`).

    `head` (norm, unembedding weight) is the teacher's head for the loss (default the target's
    own): a target sharded with FSDP2 passes a replicated copy (`training.fsdp.teacher_head`),
    so that only `residual_stream` touches its sharded parameters.

    `compiled()` is the same objective with what compiling speeds up compiled; the trainer runs
    it under `TrainConfig.compile`."""

    def __init__(self, target: Transformer, head=None):
        self.target = target.eval().requires_grad_(False)
        self.head_norm, self.head_weight = (target.norm, target.unembed.weight) if head is None else head
        self._teacher = target.residual_stream
        self._compiled = False

    def compiled(self) -> SpireObjective:
        """This objective with the frozen target's forward and the loss's per-chunk arithmetic
        (`head_draft_losses(compiled=True)`) compiled, one static graph per shape; the draft's k
        passes stay eager (what compiling each part gains, and what it takes, measured through the
        trainer: docs/benchmarks.md). The results equal eager up to rounding."""
        other = copy.copy(self)
        other._teacher = torch.compile(self.target.residual_stream, dynamic=False)
        other._compiled = True
        return other

    def __call__(self, model: nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg = model.cfg
        inputs, labels = batch[:, :-1], batch[:, 1:]  # (B, T)
        read = model.memory_layers if cfg.target_activations else ()
        with torch.no_grad():
            stream = self._teacher(inputs, layers=(*read, self.target.cfg.num_layers))  # (n_d+1, B, T, d)
        hidden, positions = model.k_pass_hidden(inputs, stream[:-1], cfg.k)  # (B, n_blocks, k, d), (n_blocks, k)
        with torch.no_grad():
            target_x = self.head_norm(stream[-1][:, positions])  # (B, n_blocks, k, d)
        loss, parts = head_draft_losses(model.body.norm(hidden), model.body.unembed.weight, target_x,
                                        self.head_weight, labels[:, positions],
                                        None if cfg.loss == "hard" else cfg.mix_weight,
                                        compiled=self._compiled)  # parts (B, n_blocks, k)
        per_position = parts["alpha"].detach().mean(dim=(0, 1))  # (k,) acceptance of draft position j
        metrics = {"distill_ce": parts["distill_ce"].detach().mean(), "hard_ce": parts["hard_ce"].detach().mean(),
                   "alpha": per_position.mean()}
        metrics.update({f"alpha_{j + 1}": per_position[j] for j in range(cfg.k)})
        return loss, metrics
