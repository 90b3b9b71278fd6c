"""The EAGLE-3 draft (arXiv 2503.01840, `model.eagle3`) behind the engine's `Draft` protocol.

After every target pass (the prefill, each verification) the draft reads the target's residual
stream at its three entries from the `TargetPass` (no target pass of its own), fuses it (`fc`)
and writes the keys and values of the newly verified entries into its own dense cache: entry p
pairs token p with the target's feature at p - 1, for every verified p whose predecessor is
verified too. The fused feature of each row's last verified position waits in a static buffer
(`feature`) for the next round's first step, on the pending token. A round's k steps then run
one token per row each, the first on the target's feature, the later ones on the draft's own
output hidden state (EAGLE's feature re-use). Rejected entries stay in the cache invisible and
are overwritten: the cache rolls back by its lengths, like every cache here (`kvcache`).

Like `drafts.SpireDraft` it updates its state in place at fixed addresses and asks the device
nothing, so that a round replays as one CUDA graph (`decoding.graphs`). `eagle3_builder` is its
builder in `builders.BUILDERS`, beside its card (`methods.CARDS`).
"""

from __future__ import annotations

import torch

from spirelib.decoding.drafts import draft_tokens
from spirelib.decoding.prefill import TargetPass
from spirelib.model.eagle3 import Eagle3DraftModel
from spirelib.model.kvcache import static_buffer
from spirelib.model.transformer import Transformer


class Eagle3Draft:
    """EAGLE-3's draft for the engine (the module docstring): `target_layers` are the residual-stream
    entries it fuses; its state is its dense cache and the fused feature of each row's last verified
    position (B, d)."""

    def __init__(self, model: Eagle3DraftModel, temperature: float = 1.0):
        self.model = model
        self.target_layers = model.target_layers
        self.temperature = temperature
        self.key = ("eagle3", id(model))

    def begin(self, verified: TargetPass, k: int) -> None:
        B = verified.tokens.shape[0]
        weight = self.model.fc.weight
        self.cache = self.model.new_cache(B, verified.cache.capacity)
        self.feature = static_buffer(self.model, ("feature", B), (B, weight.shape[0]), weight.dtype, weight.device)
        self.accept(verified)

    def static_tensors(self) -> list[torch.Tensor]:
        return [*self.cache.static_tensors(), self.feature, *self.model.parameters(), *self.model.buffers()]

    def propose(self, pending: torch.Tensor, positions: torch.Tensor, k: int, u: torch.Tensor | None):
        hidden = self.feature  # (B, d): the first step reads the target's feature of the position before

        def step(tokens: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
            nonlocal hidden
            logits, hidden = self.model.step(tokens, hidden, at, self.cache)  # (B, V), (B, d): fed to the next step
            return logits

        return draft_tokens(step, step(pending, positions), positions, k, self.temperature, u)

    def accept(self, verified: TargetPass) -> None:
        valid = verified.valid  # (B, T), a prefix per row
        fused = self.model.fuse(verified.stream(self.target_layers))  # (B, T, d)
        # entry p + 1 (token p + 1, feature p) for each verified p whose successor is verified too
        self.model.write_verified(self.cache, verified.tokens[:, 1:], fused[:, :-1], verified.positions[:, 1:],
                                  valid[:, 1:])
        count = valid.long().sum(1)  # (B,)
        last = fused[torch.arange(fused.shape[0], device=fused.device), (count - 1).clamp(min=0)]  # (B, d)
        self.feature.copy_(torch.where((count > 0)[:, None], last, self.feature))
        self.cache.rollback(verified.lengths)


def eagle3_builder(target: Transformer, model: Eagle3DraftModel, *, temperature: float) -> Eagle3Draft:
    """A fresh EAGLE-3 draft of the trained `model` for `target` (its builder in `builders.BUILDERS`)."""
    if model.target_cfg.d_model != target.cfg.d_model or model.target_cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError("this EAGLE-3 draft was built for a target of another width or vocabulary")
    return Eagle3Draft(model, temperature)
