"""The EAGLE-3 draft model (Li et al. 2025, arXiv 2503.01840), beside SPIRe's (method §3).

EAGLE-3 drafts from the target's features rather than its tokens alone: the target's residual
stream at three depths (low, middle, high), concatenated and fused by one linear map `fc`
(3 d -> d), is the draft's input *hidden state*. Its one decoder layer attends with queries, keys
and values made from [norm(embed(token)) ; norm(hidden)] (2 d wide), closes the residual on the
hidden state, then a SwiGLU MLP, a final norm and a head over the draft vocabulary, which may be
a reduced one (`draft_vocabulary`: its most frequent tokens; `d2t` maps a draft id to the
target's). The token embedding is the target's, copied and frozen.

Pairing (EAGLE's, as speculators and vLLM use it): the draft's entry at position p reads the token
at p and the target's feature at p - 1 (which predicted it), and predicts the token at p + 1. For
verified positions those entries' keys and values are written straight into the draft's dense
cache (`write_verified`: the keys of a one-layer draft depend on its input alone); position 0 has
no entry. A draft round then runs `step` k times: the first on the pending token with the target's
feature, each later one on its own proposal with the draft's own output hidden state before the
final norm (EAGLE's feature re-use: the target's features stop at the verified text).

"Training-time test" (`unrolled_hidden`): training runs those k steps unrolled over every position
of a window at once; step j's hidden state is step j - 1's output and its attention sees what it
sees at inference: the verified entries up to its first position (causal, step 0's keys) and its
own earlier steps' keys at the same entry (the diagonal). tests/model/test_eagle3.py checks that
k unrolled steps equal k `step` calls to fp32 precision.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from spirelib.model.compiled import CompiledStep
from spirelib.model.config import Eagle3Config, ModelConfig, eagle3_layers
from spirelib.model.kvcache import DenseKVCache, reuse
from spirelib.model.rope import rope_rotation
from spirelib.model.transformer import MLP, Attention, RMSNorm, Transformer


def draft_vocabulary(tokens, size: int, vocab_size: int) -> torch.Tensor:
    """The reduced draft vocabulary (EAGLE-3's d2t, as target ids): the `size` most frequent
    tokens of the token array `tokens` (ties to the smaller id; too few distinct tokens filled with
    the smallest ids not yet chosen), sorted ascending, as speculators builds it. (size,) long."""
    if not 1 <= size <= vocab_size:
        raise ValueError(f"a draft vocabulary of {size} tokens out of {vocab_size}")
    counts = np.bincount(np.asarray(tokens, dtype=np.int64).ravel(), minlength=vocab_size)[:vocab_size]
    order = np.lexsort((np.arange(vocab_size), -counts))  # by count descending, then id ascending
    seen = order[counts[order] > 0][:size]
    if len(seen) < size:
        rest = np.setdiff1d(np.arange(vocab_size), seen)[: size - len(seen)]
        seen = np.concatenate([seen, rest])
    return torch.from_numpy(np.sort(seen)).long()


class Eagle3DraftModel(CompiledStep, nn.Module):
    """EAGLE-3's draft for a target of shape `target_cfg` (the module docstring). Parameters: `embed`
    (frozen), `fc`, `input_norm`, `hidden_norm`, `attn` (W_q, W_k, W_v over 2 d; W_o to d), `mlp_norm`,
    `mlp`, `norm`, `head` (V_draft, d); buffer `d2t` (V_draft,) the target id of each draft id (absent
    with the whole vocabulary)."""

    def __init__(self, target_cfg: ModelConfig, cfg: Eagle3Config = Eagle3Config(),
                 d2t: torch.Tensor | None = None):
        super().__init__()
        layers = cfg.target_layers or eagle3_layers(target_cfg.num_layers)
        if not all(0 <= i <= target_cfg.num_layers for i in layers):
            raise ValueError(f"target layers {layers} are not residual-stream entries 0..{target_cfg.num_layers}")
        V, d = target_cfg.vocab_size, target_cfg.d_model
        size = V if cfg.draft_vocab is None else cfg.draft_vocab
        if size > V:
            raise ValueError(f"a draft vocabulary of {size} exceeds the target's {V}")
        self.cfg, self.target_cfg, self.target_layers = cfg, target_cfg, tuple(layers)
        # the layer's shape: the target's, less its sliding window and biases (one dense layer)
        self.layer_cfg = replace(target_cfg, num_layers=1, d_ff=cfg.d_ff or target_cfg.d_ff, sliding_window=None,
                                 qkv_bias=False, tie_embeddings=False)
        self.embed = nn.Embedding(V, d).requires_grad_(False)
        self.fc = nn.Linear(len(layers) * d, d, bias=False)
        self.input_norm = RMSNorm(d, target_cfg.norm_eps)
        self.hidden_norm = RMSNorm(d, target_cfg.norm_eps)
        self.attn = Attention(replace(self.layer_cfg, d_model=2 * d))  # W_q, W_k, W_v read [embedding ; hidden]
        self.attn.wo = nn.Linear(self.attn.q_dim, d, bias=False)  # back to the hidden state's width
        self.mlp_norm = RMSNorm(d, target_cfg.norm_eps)
        self.mlp = MLP(self.layer_cfg)
        self.norm = RMSNorm(d, target_cfg.norm_eps)
        self.head = nn.Linear(d, size, bias=False)
        self.reduced = size < V
        if self.reduced:
            if d2t is None:  # the first `size` ids (the plan sizes a draft so, on the meta device)
                d2t = torch.arange(size)
            else:
                d2t = torch.as_tensor(d2t, dtype=torch.long)
                if d2t.shape != (size,) or len(set(d2t.tolist())) != size or not bool(((d2t >= 0) & (d2t < V)).all()):
                    raise ValueError(f"d2t must hold {size} distinct target ids in 0..{V - 1}")
            self.register_buffer("d2t", d2t.clone())
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        """Matrices N(0, std), W_o and W_down scaled down as a 1-layer `Transformer`'s; gains 1."""
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(("wo.weight", "w_down.weight")):
                nn.init.normal_(p, 0.0, std / math.sqrt(2))
            elif name != "embed.weight":
                nn.init.normal_(p, 0.0, std)

    @classmethod
    def from_target(cls, target: Transformer, cfg: Eagle3Config = Eagle3Config(), d2t: torch.Tensor | None = None,
                    device=None) -> Eagle3DraftModel:
        """A draft for `target`, on its device (or `device`), in fp32 at least (as SPIRe's, trained in
        fp32 and cast for decoding): the target's embedding copied and frozen, the head and final
        norm the target's rows of the draft vocabulary and final norm with `cfg.init_head`, the rest
        random from the global generator. `d2t`: the reduced vocabulary (`draft_vocabulary`)."""
        param = next(target.parameters())
        draft = cls(target.cfg, cfg, d2t).to(device=device or param.device,
                                              dtype=torch.promote_types(param.dtype, torch.float32))
        def whole(t: torch.Tensor) -> torch.Tensor:  # a target sharded with FSDP2 holds DTensors: gathered
            return t.full_tensor() if hasattr(t, "full_tensor") else t

        with torch.no_grad():
            draft.embed.weight.copy_(whole(target.embed.weight))
            if cfg.init_head:
                unembed = whole(target.unembed.weight)
                draft.head.weight.copy_(unembed if not draft.reduced else unembed[draft.d2t])
                draft.norm.weight.copy_(whole(target.norm.weight))
        return draft

    @property
    def draft_vocab(self) -> int:
        return self.head.out_features

    def trainable_parameters(self) -> int:
        """N of the token budget (20 x N): every parameter but the frozen embedding."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    # --- the layer ----------------------------------------------------------------------------

    def fuse(self, stream: torch.Tensor) -> torch.Tensor:
        """The draft's hidden state from the target's residual stream at `target_layers`,
        (n, ..., d) -> fc([low ; mid ; high]) (..., d), in the draft's dtype."""
        return self.fc(torch.cat(list(stream.to(self.fc.weight.dtype)), dim=-1))

    def _qkv(self, tokens: torch.Tensor, hidden: torch.Tensor, rope):
        """Queries (B, n_q, T, d_head), keys and values (B, n_kv, T, d_head) of tokens (B, T) with
        hidden states (B, T, d): the attention input [input_norm(embed) ; hidden_norm(hidden)]."""
        x = torch.cat([self.input_norm(self.embed(tokens)), self.hidden_norm(hidden)], dim=-1)  # (B, T, 2 d)
        return self.attn.qkv(x, rope)

    def _finish(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The layer's output (before the final norm): the residual on the hidden state, then the MLP."""
        x = hidden + attended
        return x + self.mlp(self.mlp_norm(x))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary (..., V) of layer outputs (..., d): the draft
        vocabulary's scattered to their target ids, -inf elsewhere (probability 0 at any
        temperature, so rejection sampling against the target stays exactly lossless)."""
        z = self.head(self.norm(out))  # (..., V_draft)
        if not self.reduced:
            return z
        full = z.new_full((*z.shape[:-1], self.target_cfg.vocab_size), float("-inf"))
        return full.index_copy(-1, self.d2t, z)

    def rope(self, positions: torch.Tensor):
        """The target's rotations (`rope.rope_rotation`) for positions (B, T)."""
        c = self.layer_cfg
        return rope_rotation(positions, c.d_head, c.rope_base, c.rope_scaling)

    # --- inference ----------------------------------------------------------------------------

    def new_cache(self, batch: int, capacity: int) -> DenseKVCache:
        """The draft's own dense cache, one layer (reused per shape under compiled decoding)."""
        c, param = self.layer_cfg, self.fc.weight

        def build():
            return DenseKVCache(1, batch, c.n_kv, c.d_head, capacity, device=param.device, dtype=param.dtype)
        return reuse(self, ("dense", batch, capacity), build) if self.compiled_decoding else build()

    def write_verified(self, cache: DenseKVCache, tokens: torch.Tensor, hidden: torch.Tensor,
                       positions: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """Keys and values of verified entries: tokens (B, T) at positions (B, T) with the fused
        target features of the positions before them, hidden (B, T, d); entries with `valid` False
        are dropped. No attention runs: a one-layer draft's keys depend on its input alone."""
        if tokens.shape[1] == 0:  # a prefill of one position: no entry yet
            return
        slots = cache.prepare(positions, valid)
        _, k, v = self._qkv(tokens, hidden.to(self.fc.weight.dtype), self.rope(positions))
        cache.write(0, slots, k, v)

    def compile_decoding(self, enabled: bool = True) -> Eagle3DraftModel:
        """Run `step` as one compiled graph (`compiled.CompiledStep`), or eagerly again."""
        self.compile_step(enabled, self.fc.weight.device)
        return self

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             cache: DenseKVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step: tokens (B,) at positions (B,) with input hidden states (B, d) (the fused
        target feature of the position before, or the draft's own last output) -> next-token logits
        over the target's vocabulary (B, V) and the output hidden state (B, d), the next step's
        input. Writes the entry's key and value into `cache` first; the query sees every entry up
        to its own position."""
        pos = positions[:, None]  # (B, 1)
        cache.plan(pos)
        return self.run_step(tokens, hidden, pos, cache)

    def _step(self, tokens, hidden, pos, cache):
        slots = cache.register(pos)  # (B, 1), in place
        q, k, v = self._qkv(tokens[:, None], hidden[:, None], self.rope(pos))
        cache.write(0, slots, k, v)
        attended = self.attn.attend(q, *cache.layer_kv(0, pos), cache.mask(pos))  # (B, 1, d)
        out = self._finish(hidden[:, None], attended)[:, 0]  # (B, d)
        return self.logits(out), out

    # --- training: training-time test --------------------------------------------------------

    def unrolled_hidden(self, tokens: torch.Tensor, stream: torch.Tensor, k: int) -> torch.Tensor:
        """k draft steps from every position of a window at once, teacher-forced: tokens (B, T) at
        positions 0..T-1, stream (n, B, T, d) the target's residual stream at `target_layers` on them.
        Returns the layer outputs (B, k, T - 1, d) before the final norm: [:, j, p - 1] is step j
        from entry p (token p, target feature p - 1), at position p + j, reading token p + j (clamped
        to T - 1: entries with p + j > T - 1 are padding, for the caller to drop), predicting token
        p + j + 1. Step j's attention sees step 0's keys at entries <= p (causal) and steps 1..j's at
        entry p itself (their positions p + 1 .. p + j), as `step` does at inference."""
        B, T = tokens.shape
        entries = torch.arange(1, T, device=tokens.device)  # (N,) positions of step 0
        hidden = self.fuse(stream[:, :, :-1])  # (B, N, d) the target feature before each entry
        own_k, own_v = [], []  # per step >= 1: (B, n_kv, N, d_head), at each entry
        outs = []
        for j in range(k):
            pos = (entries + j).expand(B, -1)  # (B, N)
            toks = tokens[:, (entries + j).clamp(max=T - 1)]  # (B, N)
            q, key, value = self._qkv(toks, hidden, self.rope(pos))
            if j == 0:
                k0, v0 = key, value
            else:
                own_k.append(key)
                own_v.append(value)
            hidden = self._finish(hidden, self.attn.wo(_tree_attention(q, k0, v0, own_k, own_v)))  # (B, N, d)
            outs.append(hidden)
        return torch.stack(outs, dim=1)  # (B, k, N, d)


def _tree_attention(q, k0, v0, own_k, own_v) -> torch.Tensor:
    """Attention of the queries q (B, n_q, N, d_head) of one unrolled step over step 0's keys and
    values k0, v0 (B, n_kv, N, d_head), causal, and the earlier steps' `own_k`, `own_v` (lists of
    (B, n_kv, N, d_head)) at the query's own entry only. Grouped-query heads: query head h reads
    kv head h // groups. Returns the heads concatenated (B, N, n_q d_head), before W_o. On the CPU in
    fp32 or fp64, through the flash kernel (`_FlashTreeAttention`); elsewhere dense (`_dense_tree_attention`)."""
    B, n_q, N, dh = q.shape
    if q.device.type != "cpu" or q.dtype not in (torch.float32, torch.float64):
        return _dense_tree_attention(q, k0, v0, own_k, own_v)
    groups = n_q // k0.shape[1]
    if groups > 1:  # the flash kernel wants as many kv heads as query heads
        k0, v0, *own = (x.repeat_interleave(groups, dim=1) for x in (k0, v0, *own_k, *own_v))
        own_k, own_v = own[: len(own_k)], own[len(own_k) :]
    out = _FlashTreeAttention.apply(q, k0, v0, *own_k, *own_v)  # (B, n_q, N, dh)
    return out.transpose(1, 2).reshape(B, N, n_q * dh)


class _FlashTreeAttention(torch.autograd.Function):
    """`_tree_attention` (groups of 1) through the CPU flash kernel: its causal attention over step 0
    gives an output O_c and its log-sum-exp l; the own entries' scores t_i join the same softmax, so the
    output is a O_c + sum_i b_i v_i with a = exp(l - L), b_i = exp(t_i - L), L = logsumexp(l, t_1..).
    Backward hands the flash kernel a dO and the whole output O: its score gradient P_c (a dO.v - a dO.O)
    is then the whole softmax's (no (N, N) tensor ever exists; equal to the dense form up to rounding,
    tests/model/test_eagle3_model.py)."""

    @staticmethod
    def forward(ctx, q, k0, v0, *own):
        j, scale = len(own) // 2, q.shape[-1] ** -0.5
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k0, v0, 0.0, True, scale=scale)
        a = b = None
        if j:
            scores = torch.stack([(q * key).sum(-1) * scale for key in own[:j]])  # (j, B, H, N)
            total = torch.logaddexp(lse, scores.logsumexp(0))
            a, b = (lse - total).exp(), (scores - total).exp()
            out = out * a[..., None]  # same strides as the kernel's output, as its backward reads it
            for weight, value in zip(b, own[j:]):
                out += weight[..., None] * value
        ctx.save_for_backward(q, k0, v0, out, lse, a, b, *own)
        ctx.j, ctx.scale = j, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k0, v0, out, lse, a, b, *own = ctx.saved_tensors
        j, scale = ctx.j, ctx.scale
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad if a is None else grad * a[..., None], q, k0, v0, out, lse, 0.0, True, scale=scale)
        if not j:
            return dq, dk, dv
        seen = (grad * out).sum(-1)  # (B, H, N): dO . O
        grad_keys, grad_values = [], []
        for weight, key, value in zip(b, own[:j], own[j:]):
            dscore = (weight * ((grad * value).sum(-1) - seen) * scale)[..., None]  # (B, H, N, 1)
            dq = dq + dscore * key
            grad_keys.append(dscore * q)
            grad_values.append(weight[..., None] * grad)
        return dq, dk, dv, *grad_keys, *grad_values


def _dense_tree_attention(q, k0, v0, own_k, own_v) -> torch.Tensor:
    """`_tree_attention` with every (N, N) score: the reference, and the path off the CPU."""
    B, n_q, N, dh = q.shape
    n_kv = k0.shape[1]
    g = q.view(B, n_kv, n_q // n_kv, N, dh)  # (B, n_kv, groups, N, dh)
    scale = 1.0 / math.sqrt(dh)
    causal = torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
    scores = [torch.einsum("bhgnd,bhmd->bhgnm", g, k0).masked_fill(~causal, float("-inf"))]  # (B, n_kv, g, N, N)
    scores += [torch.einsum("bhgnd,bhnd->bhgn", g, key)[..., None] for key in own_k]  # (B, n_kv, g, N, 1) each
    wide = torch.promote_types(q.dtype, torch.float32)
    probs = torch.softmax(torch.cat(scores, dim=-1).to(wide) * scale, dim=-1).to(q.dtype)
    out = torch.einsum("bhgnm,bhmd->bhgnd", probs[..., :N], v0)
    for i, value in enumerate(own_v):
        out = out + probs[..., N + i, None] * value[:, :, None]
    return out.reshape(B, n_q, N, dh).transpose(1, 2).reshape(B, N, n_q * dh)
