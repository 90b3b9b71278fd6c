"""The SPIRe draft (method §3): Sparse KV cache, Pruned Initialization, Recurrent (feedback) memory.

Draft layer i (0-based, of n_d) is pruned from target layer n_t - n_d + i. Its attention
reads *memory* vectors rather than its own layer inputs: for a verified position t, the
target's residual stream entering that target layer, y_t^(n_t - n_d + i) (method §3.3); for a
position the draft processed itself, a learned softmax mixture of all the draft's
activations at t, m_t^i = sum_l softmax(w_i)_l x_t^l (method §3.2). Each layer projects memory
into keys/values with its own K/V weights (after its attention norm, exactly as the target
layer would from its input). Queries see the sink and the window of positions before them
(method §3.4, 9), never their own position: its memory is only made after the pass.

The same computation two ways, which tests/model/test_spire.py checks agree to fp32 precision: `step`
(inference, method §3.5), one position per row, and `k_pass_logits` (training, method §3.6),
every block of k positions of a sequence at once, in k passes. Ablations (method §3.8) are
`SpireConfig` flags; see `config.ABLATIONS`.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from spirelib.model.compiled import CompiledStep
from spirelib.model.config import ModelConfig, SpireConfig
from spirelib.model.kpass_attention import BandedMemory, memory_attention
from spirelib.model.kvcache import SinkWindowKVCache, reuse
from spirelib.model.transformer import Transformer


def block_positions(seq_len: int, k: int, device=None) -> torch.Tensor:
    """Query positions (n_blocks, k) of k-pass training: block b covers 1 + b*k .. b*k + k,
    so every block has at least position 0 as context, as at inference (a context has >= 2
    tokens, the last one pending) and every position has a next-token label in a window
    of seq_len + 1 tokens."""
    n_blocks = (seq_len - 1) // k
    if n_blocks < 1:
        raise ValueError(f"a training sequence of {seq_len} tokens holds no block of k = {k}")
    return 1 + torch.arange(n_blocks, device=device)[:, None] * k + torch.arange(k, device=device)


class SpireDraftModel(CompiledStep, nn.Module):
    """The draft's weights: a `Transformer` of n_d layers on the target's d_model (`body`)
    plus the feedback mixing logits w (n_d, n_d + 1)."""

    def __init__(self, target_cfg: ModelConfig, cfg: SpireConfig):
        super().__init__()
        if cfg.num_layers > target_cfg.num_layers:
            raise ValueError(f"the draft's {cfg.num_layers} layers exceed the target's {target_cfg.num_layers}")
        self.cfg = cfg
        self.target_layers = target_cfg.num_layers
        self.body = Transformer(replace(target_cfg, num_layers=cfg.num_layers))
        self.mix = nn.Parameter(torch.zeros(cfg.num_layers, cfg.num_layers + 1))  # uniform mixture at init

    @classmethod
    def from_target(cls, target: Transformer, cfg: SpireConfig, device=None) -> SpireDraftModel:
        """A draft for `target`: its embedding, last n_d blocks, final norm and unembedding,
        copied (method §3.1, `pruned_source`), or random weights for the `random_init` ablation. On
        the target's device, in fp32 at least whatever the target's dtype (fp64 stays fp64): the draft
        is small, and its weights, gradients and optimizer state need fp32 to train (a bf16 weight of
        0.5 does not move at lr 5e-5); training computes under autocast, decoding runs in the
        target's dtype (`drafts.draft_factory`). `device`: another device for the draft; "meta" builds
        its shapes alone (nothing drawn, nothing copied: a sharded target's trainer fills each rank's
        shards, `training.fsdp.init_spire_draft`); a target sharded with FSDP2 takes that path, since
        this one copies from whole tensors."""
        param = next(target.parameters())
        dtype = torch.promote_types(param.dtype, torch.float32)
        if device is not None and torch.device(device).type == "meta":
            with torch.device("meta"):
                draft = cls(target.cfg, cfg)
            return draft if draft.mix.dtype == dtype else draft.to(dtype=dtype)
        if hasattr(param, "to_local"):
            raise ValueError("from_target builds a whole draft from a whole target; for a target sharded with "
                             "FSDP2 build it with device='meta' and fill it with training.fsdp.init_spire_draft")
        draft = cls(target.cfg, cfg).to(device=device or param.device, dtype=dtype)
        if cfg.pruned_init:
            with torch.no_grad():
                for name, p in draft.body.named_parameters():
                    p.copy_(target.get_parameter(draft.pruned_source(name)))
        return draft

    def pruned_source(self, name: str) -> str:
        """The target parameter that `body`'s parameter `name` starts as under pruned init (method
        §3.1): draft block i is target block n_t - n_d + i; the embedding, the final norm and the
        unembedding are the target's own."""
        if not name.startswith("blocks."):
            return name
        index, rest = name[len("blocks."):].split(".", 1)
        return f"blocks.{self.memory_layers[0] + int(index)}.{rest}"

    @property
    def blocks(self) -> nn.ModuleList:
        return self.body.blocks

    @property
    def memory_layers(self) -> tuple[int, ...]:
        """The target's residual-stream entries this draft reads (method §3.3): for draft layer i,
        the input of target layer n_t - n_d + i, entry n_t - n_d + i of `Transformer.residual_stream`."""
        first = self.target_layers - self.cfg.num_layers
        return tuple(range(first, self.target_layers))

    def feedback_memory(self, activations: list[torch.Tensor]) -> torch.Tensor:
        """m^i = sum_l softmax(w_i)_l x^l over the draft's embedding and layer outputs
        (n_d + 1 tensors (B, T, d_model)); returns (n_d, B, T, d_model)."""
        return torch.einsum("il,lbtd->ibtd", torch.softmax(self.mix, dim=-1), torch.stack(activations))

    # --- inference (method §3.5) -------------------------------------------------------------

    def new_cache(self, batch: int, slack: int) -> SinkWindowKVCache:
        """The draft's memory: a sink + window ring (reused per shape under compiled decoding, `kvcache.reuse`)."""
        c = self.body.cfg
        param = self.mix

        def build():
            return SinkWindowKVCache(c.num_layers, batch, c.n_kv, c.d_head, self.cfg.sparse, slack,
                                     rope_base=c.rope_base, rope_scaling=c.rope_scaling, device=param.device,
                                     dtype=param.dtype)
        return reuse(self, ("ring", batch, slack), build) if self.compiled_decoding else build()

    def write_target_memory(self, cache: SinkWindowKVCache, memory: torch.Tensor,
                            positions: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """Memory for verified positions (B, T) from the target's residual stream at
        `memory_layers`, (n_d, B, T, d_model), in the draft's dtype."""
        slots = cache.prepare(positions, valid)
        rope = self.body.rope(positions)
        for i, block in enumerate(self.blocks):
            cache.write(i, slots, *block.memory_kv(memory[i].to(self.mix.dtype), rope))

    def compile_decoding(self, enabled: bool = True) -> SpireDraftModel:
        """Run `step` as one compiled graph (`compiled.CompiledStep`), or, with `enabled` False,
        eagerly again (the reference); the body too, which decodes alone as an ordinary sparse
        draft when the draft reads no target activations (`spire_draft`)."""
        self.compile_step(enabled, self.mix.device)
        self.body.compile_decoding(enabled)
        return self

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, cache: SinkWindowKVCache) -> torch.Tensor:
        """One draft pass: tokens (B,) at positions (B,) -> next-token logits (B, V); stores
        this position's memory (feedback mixture, or each layer's input without feedback) in
        `cache`, a `SinkWindowKVCache`.

        The cache's bookkeeping (which slot the position takes, the rows' lengths) comes first,
        inside the pass's graph, in place (`SinkWindowKVCache.register`). With feedback the
        position's own memory is invisible to its query (`include_self=False`), and the ring's
        slack keeps every key the query needs, so taking the slot first changes nothing."""
        pos = positions[:, None]  # (B, 1)
        cache.plan(pos)
        return self.run_step(tokens, pos, cache)

    def _step(self, tokens: torch.Tensor, pos: torch.Tensor, cache: SinkWindowKVCache) -> torch.Tensor:
        slots = cache.register(pos)  # (B, 1)
        mask = cache.mask(pos, include_self=not self.cfg.feedback)  # (B, 1, 1, S)
        rope = self.body.rope(pos)
        x = self.body.embed(tokens[:, None])  # (B, 1, d_model)
        activations = [x]
        for i, block in enumerate(self.blocks):
            if not self.cfg.feedback:  # an ordinary transformer over its own positions: self included
                cache.write(i, slots, *block.memory_kv(x, rope))
            x = block.finish(x, block.attn.attend(block.queries(x, rope), *cache.layer_kv(i, pos), mask))
            activations.append(x)
        if self.cfg.feedback:
            for i, (block, memory) in enumerate(zip(self.blocks, self.feedback_memory(activations))):
                cache.write(i, slots, *block.memory_kv(memory, rope))
        return self.body.head(x)[:, 0]

    # --- training (method §3.6) --------------------------------------------------------------

    def k_pass_logits(self, tokens: torch.Tensor, memory: torch.Tensor, k: int,
                      positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft logits for every block position of a sequence, teacher-forced, in k passes: pass j
        computes the j-th position of all blocks; the context before a block is target memory, the
        block's earlier positions are the feedback memory of passes < j.

        tokens (B, T), memory (n_d, B, T, d_model): the frozen target's residual stream at
        `memory_layers` on the same tokens. Returns logits (B, n_blocks, k, V) and their positions (n_blocks, k); the
        logits at position t predict token t + 1. `positions` selects blocks (default: all).
        `head(k_pass_hidden(...))`; training uses `k_pass_hidden` (no (B, n_blocks, k, V) tensor).
        """
        hidden, positions = self.k_pass_hidden(tokens, memory, k, positions)
        return self.body.head(hidden), positions  # (B, n_blocks, k, V)

    def k_pass_hidden(self, tokens: torch.Tensor, memory: torch.Tensor, k: int,
                      positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The last layer's outputs (B, n_blocks, k, d_model), before the final norm, of
        `k_pass_logits` (same arguments), and their positions (n_blocks, k)."""
        B, T = tokens.shape
        span = None  # the blocks' band: known on the host for the regular blocks, else measured (a sync)
        if positions is None:
            positions = block_positions(T, k, tokens.device)  # (n_blocks, k)
            span = (min(max(1, self.cfg.window // k), positions.shape[0]) - 1) * k + self.cfg.window
        if not self.cfg.target_activations:  # an ordinary sparse transformer: one parallel pass
            return self.body.hidden(tokens, sparse=self.cfg.sparse)[:, positions], positions  # (B, n_blocks, k, d)
        if k > self.cfg.window:
            raise ValueError(f"k = {k} exceeds the window {self.cfg.window}: a block would not see its own start")
        n_blocks = positions.shape[0]
        all_rope = self.body.rope(torch.arange(T, device=tokens.device).expand(B, T))
        banded = BandedMemory(positions[:, 0], T, k, self.cfg.sparse, span)
        memory = memory.to(self.mix.dtype)
        targets = [None] * len(self.blocks)  # per layer: the target memory's keys/values, banded (pass 0 makes them)
        own = [([], []) for _ in self.blocks]  # per layer, per pass: the blocks' own keys/values
        hidden = []  # per pass, the last layer's output (B, n_blocks, d_model)
        feedback = None  # the previous pass's feedback memory (n_d, B, n_blocks, d_model) and its rotations
        for j in range(k):
            pos = positions[:, j]  # (n_blocks,)
            rope = self.body.rope(pos.expand(B, n_blocks))
            x = self.body.embed(tokens[:, pos])  # (B, n_blocks, d_model)
            activations = [x]
            for i, block in enumerate(self.blocks):
                x, made, new = block.run(self._pass_layer, j, x, rope, banded, targets[i], own[i],
                                         (memory[i], all_rope) if j == 0 else None,
                                         None if feedback is None else (feedback[0][i], feedback[1]))
                if made is not None:
                    targets[i] = made
                if new is not None:
                    own[i][0].append(new[0])
                    own[i][1].append(new[1])
                activations.append(x)
            hidden.append(x)
            if self.cfg.feedback and j < k - 1:  # the last pass's memory is read by no later pass
                feedback = (self.feedback_memory(activations), rope)
        return torch.stack(hidden, dim=2), positions  # (B, n_blocks, k, d_model)

    # parameters: one layer's share of pass j, as Block.run calls it: its tensors stay arguments for FSDP2 to hook
    def _pass_layer(self, block, j: int, x: torch.Tensor, rope, banded: BandedMemory, target, own, new_target,
                    feedback):
        """Draft layer `block`'s share of pass j of `k_pass_hidden`, as one `Block.run` (a sharded block
        is gathered once for it): on pass 0 the keys/values of the target memory (`new_target`: the
        layer's memory (B, T, d_model) and its rotations), banded; the keys/values of the blocks' new own
        memory: the previous pass's feedback mixture (`feedback`: (B, n_blocks, d_model) and its
        rotations), or without feedback this pass's input x (B, n_blocks, d_model), itself included;
        pass j's queries' attention over the target memory (`target`: band and sink) and the blocks' own
        (`own`: the keys and the values of earlier passes), and the rest of the block. Returns the
        layer's output (B, n_blocks, d_model), the target memory's keys/values if made here (else None),
        and the new own key and value (B, n_kv, n_blocks, d_head) (None: none this pass)."""
        made = None
        if new_target is not None:
            keys, values = block.memory_kv(*new_target)  # (B, n_kv, T, d_head)
            sink = self.cfg.sink
            target = made = ((banded.gather(keys), banded.gather(values)), (keys[:, :, :sink], values[:, :, :sink]))
        if not self.cfg.feedback:  # an ordinary transformer over the block: its own input, itself included
            new = block.memory_kv(x, rope)
        else:
            new = None if feedback is None else block.memory_kv(*feedback)
        keys, values = own if new is None else ([*own[0], new[0]], [*own[1], new[1]])
        mine = (torch.stack(keys, dim=3), torch.stack(values, dim=3)) if keys else None
        q = block.queries(x, rope)  # (B, n_q, n_blocks, d_head)
        return block.finish_heads(x, memory_attention(q, banded, j, *target, mine)), made, new
