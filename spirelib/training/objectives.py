"""What the trainer minimises, `objective(model, batch) -> (loss, metrics)`: SPIRe's k-pass
objective against the frozen target (method §3.6-3.7, `SpireObjective`). A plain language model's
is its own loss (`Transformer.loss`)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from spirelib.model.transformer import Transformer
from spirelib.training.losses import head_draft_losses


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
        passes stay eager. Measured through the trainer on a 2-core CPU (docs/benchmarks.md): a step
        1.22x faster at 4 x 1,024 and 1.05x at 4 x 640, for 14-17 s of compilation from a cold
        cache; the whole step compiled is about 1.5x faster, but for ~2 min, most of it the
        draft's k passes (~70 s for a fifth of their time). The results equal eager up to rounding."""
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
