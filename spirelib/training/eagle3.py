"""EAGLE-3's training objective and its recipe (arXiv 2503.01840, §3; beside SPIRe's, method §3.6-3.7).

`Eagle3Objective` is an `objectives.Objective`, so the trainer trains it unchanged (AdamW, warmup +
cosine, safetensors checkpoints, exact resume): the frozen target runs on the batch's inputs and
keeps its residual stream at the draft's three entries and its last one; the draft runs k steps of
training-time test (`Eagle3DraftModel.unrolled_hidden`); step j at entry p is distilled (forward
KL, as EAGLE-3 and speculators train it: the cross-entropy of the draft's distribution against
the target's, which differs from KL(p || q) by the target's entropy, a constant) towards the
target's next-token distribution at position p + j, restricted to the draft vocabulary and
renormalized when it is reduced. The loss is the mean over the k steps of each step's mean over
its entries; `losses.head_draft_losses` fuses it with both unembeddings, so no (tokens x
vocabulary) tensor exists.

`trained_eagle3_draft` is the recipe: the draft vocabulary from the training tokens (when
reduced), the draft built on the target (`Eagle3DraftModel.from_target`), trained on the target's
data for `TrainConfig.tokens_per_param` x its trainable parameters (the frozen embedding is not
counted), cached by an identity that names the target's config hash.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from spirelib.model.config import Eagle3Config
from spirelib.model.eagle3 import Eagle3DraftModel, draft_vocabulary
from spirelib.model.transformer import Transformer
from spirelib.training.config import TrainConfig
from spirelib.training.losses import head_draft_losses
from spirelib.training.pipeline import Data, TrainedModel
from spirelib.training.train import Session, TrainingRun, Validation, full_identity, run_dir_for, train

EAGLE3 = "eagle3_draft"  # the recipe's cache folder name


class Eagle3Objective:
    """`objective(draft, batch) -> (loss, metrics)` for an `Eagle3DraftModel` against the frozen
    `target` (the module docstring). Batches (B, T + 1), T >= k + 1. Metrics, on the device (no host
    sync): "distill_ce", "alpha" (the mean over steps of sum min(p, q) over the draft vocabulary, the
    training-time estimate of acceptance while the target's mass stays inside it) and alpha_1..k."""

    def __init__(self, target: Transformer, head=None):
        self.target = target.eval().requires_grad_(False)
        # (norm, unembedding weight): the teacher's head; a target sharded with FSDP2 passes a replicated
        # copy (`fsdp.teacher_head`), so that only `residual_stream` touches its sharded parameters
        self.head_norm, self.head_weight = (target.norm, target.unembed.weight) if head is None else head

    def __call__(self, model: Eagle3DraftModel, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        k = model.cfg.k
        inputs = batch[:, :-1]  # (B, T)
        T = inputs.shape[1]
        if T < k + 1:
            raise ValueError(f"EAGLE-3's {k} training steps need windows of >= {k + 1} tokens, got {T}")
        last = self.target.cfg.num_layers
        with torch.no_grad():
            stream = self.target.residual_stream(inputs, layers=(*model.target_layers, last))  # (n + 1, B, T, d)
            weight = self.head_weight  # (V, d)
            if model.reduced:
                weight = weight[model.d2t]  # (V_draft, d): the target's logits over the draft vocabulary
        hidden = model.unrolled_hidden(inputs, stream[:-1], k)  # (B, k, T - 1, d)
        losses, alphas, ces = [], [], []
        for j in range(k):
            h = hidden[:, j, : T - 1 - j]  # (B, T - 1 - j, d): entries p = 1 .. T - 1 - j, at positions p + j
            with torch.no_grad():
                target_x = self.head_norm(stream[-1][:, 1 + j :])  # (B, T - 1 - j, d)
            labels = torch.zeros(h.shape[:2], dtype=torch.long, device=h.device)  # unused by distillation
            loss, parts = head_draft_losses(model.norm(h), model.head.weight, target_x, weight, labels, 1.0)
            losses.append(loss)
            alphas.append(parts["alpha"].detach().mean())
            ces.append(parts["distill_ce"].detach().mean())
        per_step = torch.stack(alphas)  # (k,)
        metrics = {"distill_ce": torch.stack(ces).mean(), "alpha": per_step.mean()}
        metrics.update({f"alpha_{j + 1}": per_step[j] for j in range(k)})
        return torch.stack(losses).mean(), metrics


def eagle3_identity(cfg: Eagle3Config, data: Data, target_hash: str) -> dict:
    """What an EAGLE-3 draft's checkpoint is keyed by, besides its TrainConfig."""
    return {"kind": "eagle3-draft", "eagle3": cfg.to_dict(), "target": target_hash, "data": data.dataset.checksum}


def new_eagle3_draft(target: Transformer, cfg: Eagle3Config, train_tokens=None) -> Eagle3DraftModel:
    """The draft `trained_eagle3_draft` starts from: its reduced vocabulary (if any) the most frequent
    tokens of `train_tokens` (`draft_vocabulary`), weights from the global generator."""
    d2t = None
    if cfg.draft_vocab is not None and cfg.draft_vocab < target.cfg.vocab_size:
        if train_tokens is None:
            raise ValueError("a reduced draft vocabulary is chosen from the training tokens: pass train_tokens")
        d2t = draft_vocabulary(train_tokens, cfg.draft_vocab, target.cfg.vocab_size)
    return Eagle3DraftModel.from_target(target, cfg, d2t)


def vocabulary_sample(docs, tokens: int = 1 << 22) -> np.ndarray:
    """The tokens a reduced draft vocabulary is counted over: a split's whole stream when it is one
    array (`corpus.FlatDocs`), else (a Zarr corpus) `tokens` of it in windows drawn with seed 0."""
    if hasattr(docs, "tokens"):
        return np.asarray(docs.tokens)
    return docs.sample_windows(np.random.default_rng(0), max(1, tokens // 4096), 4096).ravel()


def trained_eagle3_draft(target: TrainedModel, cfg: Eagle3Config, train_cfg: TrainConfig, *, session: Session,
                         name: str = EAGLE3) -> TrainedModel:
    """An EAGLE-3 draft for `target`, trained with `Eagle3Objective` on the target's data in `session`
    (cached, retrained when the target changes), in one process or over torchrun's ranks. The draft (one
    layer) trains replicated, under DDP; with `session.parallel` "fsdp" the frozen target is sharded block by
    block as for SPIRe's draft (`fsdp.shard_frozen_target`; an imported one already is), the draft
    built from its gathered embedding and head and the loss reading a replicated copy of its head
    (`fsdp.teacher_head`). The token budget is `train_cfg.tokens_per_param` x its trainable
    parameters (20 for Chinchilla's 20 x N; a share of it, as the other drafts', is a smaller figure)."""
    from spirelib.training.devices import init_distributed, resolve_device

    identity = eagle3_identity(cfg, target.data, target.config_hash)
    torch.manual_seed(train_cfg.seed)
    dev = resolve_device(session.device)
    _, world = init_distributed(dev)
    frozen = target.model.to(dev)
    model = new_eagle3_draft(frozen, cfg, vocabulary_sample(target.data.dataset.train) if cfg.draft_vocab else None)
    head = None
    if session.parallel == "fsdp" and world > 1:
        from torch.distributed.fsdp import FSDPModule

        from spirelib.training import fsdp

        head = fsdp.teacher_head(frozen)
        if not isinstance(frozen, FSDPModule):
            fsdp.shard_frozen_target(frozen, fsdp.device_mesh(dev, world), dev)
    run = TrainingRun(run_dir_for(name, full_identity(train_cfg, identity)), identity)
    # the one-layer draft trains replicated, under DDP, whichever way the target is shared
    result = train(model, Eagle3Objective(frozen, head), target.data.dataset.train, train_cfg, run=run,
                   validation=Validation(target.data.dataset.val), session=replace(session, parallel="ddp"))
    return TrainedModel(result.model, cfg, train_cfg, result, target.data, identity)
