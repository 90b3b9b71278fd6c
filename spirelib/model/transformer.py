"""Decoder-only GQA-SwiGLU transformer: the target and every draft are built from it.

Pre-RMSNorm blocks, rotary positions, grouped-query attention, SwiGLU MLP, final norm,
untied embedding and unembedding (method §2 "Models"). Heads x d_head may differ from
d_model (the paper's target has 8 heads of 128 on d_model 512). The body parameters
(blocks only: two norm gains, W_q/W_k/W_v/W_o, gate/up/down) are exactly the
performance model's count, `perfmodel.body_params(config.shape())`.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from spirelib.model.compiled import compile_for_decoding
from spirelib.model.config import ModelConfig, SinkWindow
from spirelib.model.cross_entropy import linear_cross_entropy
from spirelib.model.kvcache import DenseKVCache, KVCache, reuse, visibility
from spirelib.model.rope import apply_rope, rope_rotation

# fp32 matmuls and convolutions on a GPU use TF32 tensor cores, in every process that imports the
# engine, for training and decoding alike (so decoding speed never depends on whether a model was
# trained first in the same process). CPU arithmetic is unchanged.
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    """Grouped-query attention. W_q, W_k, W_v live in one matrix (one matmul on the ordinary
    path); `queries` and `keys_values` project separately, for SPIRe's memory (method §3.2)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.q_dim = cfg.n_q * cfg.d_head
        self.wqkv = nn.Linear(cfg.d_model, (cfg.n_q + 2 * cfg.n_kv) * cfg.d_head, bias=cfg.qkv_bias)
        self.wo = nn.Linear(self.q_dim, cfg.d_model, bias=False)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.cfg.d_head).transpose(1, 2)  # (B, n, T, d_head)

    def qkv(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated queries (B, n_q, T, d_head), keys and values (B, n_kv, T, d_head) of x (B, T, d_model);
        queries and keys are rotated together (one rotation instead of two: fewer kernels per step)."""
        n_q, n_kv = self.cfg.n_q, self.cfg.n_kv
        heads = self._heads(self.wqkv(x), n_q + 2 * n_kv)  # (B, n_q + 2 n_kv, T, d_head)
        qk = apply_rope(heads[:, : n_q + n_kv], rope)  # (B, n_q + n_kv, T, d_head)
        return qk[:, :n_q], qk[:, n_q:], heads[:, n_q + n_kv :]

    def queries(self, x: torch.Tensor, rope) -> torch.Tensor:
        """Rotated queries (B, n_q, T, d_head) of x (B, T, d_model)."""
        bias = None if self.wqkv.bias is None else self.wqkv.bias[: self.q_dim]
        return apply_rope(self._heads(F.linear(x, self.wqkv.weight[: self.q_dim], bias), self.cfg.n_q), rope)

    def keys_values(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated keys and values (B, n_kv, T, d_head) of x (B, T, d_model)."""
        bias = None if self.wqkv.bias is None else self.wqkv.bias[self.q_dim :]
        k, v = F.linear(x, self.wqkv.weight[self.q_dim :], bias).chunk(2, dim=-1)
        return apply_rope(self._heads(k, self.cfg.n_kv), rope), self._heads(v, self.cfg.n_kv)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | BlockMask | None) -> torch.Tensor:
        """Softmax attention of q (B, n_q, T, d_head) over k, v (B, n_kv, S, d_head); mask (B, 1, T, S)
        of visible keys, None for causal attention over T == S positions, or a FlexAttention block
        mask that reads only the live key blocks (`DenseKVCache.live_mask`). Returns (B, T, d_model)."""
        if isinstance(mask, BlockMask):
            out = flex_attention(q, k, v, block_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
        else:
            out = scaled_dot_product_attention(q, k, v, mask)  # (B, n_q, T, d_head)
        B, _, T, _ = out.shape
        return self.wo(out.transpose(1, 2).reshape(B, T, self.q_dim))


def scaled_dot_product_attention(q, k, v, mask):
    """SDPA of q (B, n_q, T, d_head) over k, v (B, n_kv, S, d_head) with grouped-query heads
    (query head h reads kv head h // groups). With a mask (B, 1, T, S) the groups fold into
    the query axis, so a kv head's cache is read once for all its query heads and never
    copied; causal attention (mask None, T == S) repeats the kv heads instead."""
    B, n_q, T, d_head = q.shape
    groups = n_q // k.shape[1]
    if groups == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    if mask is None:  # folding would give every group the causal pattern of one long sequence
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    folded = q.reshape(B, k.shape[1], groups * T, d_head)  # row g * T + t: group g's query t
    out = F.scaled_dot_product_attention(folded, k, v, attn_mask=mask.repeat(1, 1, groups, 1))
    return out.view(B, n_q, T, d_head)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); gate and up share one matmul."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_gate_up = nn.Linear(cfg.d_model, 2 * cfg.d_ff, bias=False)
        self.w_down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_gate_up(x).chunk(2, dim=-1)
        return self.w_down(F.silu(gate) * up)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(x)).

    `forward` attends to the block's own keys/values (through a cache, if given). SPIRe's
    draft layers attend to given memory instead (method §3.2, 3.3): they build keys/values with
    `memory_kv`, queries with `queries`, and close the residual with `finish` (`finish_heads`),
    in training all inside one `run` per pass.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, rope, mask: torch.Tensor | None, cache: KVCache | None = None,
                layer: int = 0, slots: torch.Tensor | None = None, q_pos: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = self.attn.qkv(self.attn_norm(x), rope)
        if cache is not None:
            cache.write(layer, slots, k, v)
            k, v = cache.layer_kv(layer, q_pos)
            cache.record_scores(layer, q, k, q_pos)  # a no-op unless a verification-guided draft reads them
        return self.finish(x, self.attn.attend(q, k, v, mask))

    def queries(self, x: torch.Tensor, rope) -> torch.Tensor:
        """Rotated queries (B, n_q, T, d_head) of the block's input x (B, T, d_model)."""
        return self.attn.queries(self.attn_norm(x), rope)

    def memory_kv(self, memory: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values (B, n_kv, T, d_head) of memory vectors (B, T, d_model), normed as an input would be."""
        return self.attn.keys_values(self.attn_norm(memory), rope)

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The rest of the block after attention: x + attended (B, T, d_model), then + mlp(norm(.))."""
        x = x + attended
        return x + self.mlp(self.mlp_norm(x))

    def finish_heads(self, x: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """`finish` of the attention heads' outputs concatenated, (B, T, n_q d_head), before W_o."""
        return self.finish(x, self.attn.wo(heads))

    def run(self, fn, *args):
        """`fn(self, *args)`: whatever `fn` computes with this block's methods, as one call. SPIRe's
        k-pass (method §3.6) runs a layer's share of each pass so; FSDP2 registers `run` as a sharded
        block's forward method (`training.fsdp.BLOCK_METHODS`), so the block is gathered once per
        call, not once per method `fn` uses. Every tensor `fn` makes that carries a gradient is in
        its result (FSDP2 hooks the backward's gather on the outputs), and what it reads that carries
        one is in `args` (it hooks the gradient's reduction on the inputs)."""
        return fn(self, *args)


def _reset_parameter(name: str, p: torch.Tensor, std: float, num_layers: int) -> None:
    """`Transformer.reset_parameters` of its parameter `name`."""
    if name.endswith("norm.weight"):
        nn.init.ones_(p)
    elif name.endswith(".bias"):
        nn.init.zeros_(p)
    elif name.endswith(("wo.weight", "w_down.weight")):
        nn.init.normal_(p, 0.0, std / math.sqrt(2 * num_layers))
    else:
        nn.init.normal_(p, 0.0, std)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.unembed = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.tie()
        self.reset_parameters()

    def tie(self) -> None:
        """With `cfg.tie_embeddings`, make unembed.weight the embedding's Parameter (again: after
        a `load_state_dict(assign=True)`, which replaces Parameters one by one)."""
        if self.cfg.tie_embeddings:
            self.unembed.weight = self.embed.weight

    def reset_parameters(self, std: float = 0.02) -> None:
        """GPT-2 style: N(0, 0.02), residual output projections scaled by 1/sqrt(2 * layers)."""
        for name, p in self.named_parameters():
            _reset_parameter(name, p, std, self.cfg.num_layers)

    @staticmethod
    def initial_parameters(cfg: ModelConfig):
        """(name, tensor) of every parameter of `Transformer(cfg)` constructed now, one at a time on the
        CPU: the same random numbers from the global generator, without the model ever held whole (a
        sharded model's ranks keep their rows of each, `training.fsdp.init_spire_draft`). The
        constructor draws twice, in its layers' own initializations (nn.Embedding's, nn.Linear's, in
        construction order) and in `reset_parameters`; the first draws are made here too, into
        tensors dropped at once, so that the second give the same numbers."""
        with torch.device("meta"):  # the shapes; nothing is drawn on the meta device
            skeleton = Transformer(cfg)
        with torch.no_grad():
            for module in skeleton.modules():
                if hasattr(module, "reset_parameters") and not any(True for _ in module.children()):
                    scratch = copy.copy(module)  # the layer, its parameters on the CPU (dropped after)
                    scratch._parameters = {n: None if p is None else nn.Parameter(torch.empty(p.shape, dtype=p.dtype))
                                           for n, p in module._parameters.items()}
                    scratch.reset_parameters()
            for name, p in skeleton.named_parameters():
                full = torch.empty(p.shape)  # the default dtype, as the constructor's
                _reset_parameter(name, full, 0.02, cfg.num_layers)
                yield name, full

    def rope(self, positions: torch.Tensor):
        return rope_rotation(positions, self.cfg.d_head, self.cfg.rope_base, self.cfg.rope_scaling)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None, cache: KVCache | None = None, *,
                valid: torch.Tensor | None = None, sparse: SinkWindow | None = None) -> torch.Tensor:
        """Next-token logits (B, T, V) for tokens (B, T) at positions (B, T) (default 0..T-1).

        With `cache`, the new keys/values are stored at `positions` (entries where `valid`
        is False are dropped, e.g. padding of ragged rows) and attention reads the whole
        cache (its own sparsity applies). Without a cache, attention is causal over the T
        tokens, restricted to sink + window if `sparse` is given. Positions are positions in
        the original text (RoPE uses them).
        """
        return self._blocks(tokens, positions, cache, valid, sparse, keep=(self.cfg.num_layers,), readout="logits")[-1]

    def last_logits(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                    cache: KVCache | None = None, *, valid: torch.Tensor | None = None,
                    last: torch.Tensor | None = None, greedy: bool = False) -> torch.Tensor:
        """Next-token logits (B, V) of one token per row, the one at index `last` (B,) (default
        T - 1, the last), or with `greedy` their argmax (B,), the greedy next tokens (arguments
        as `forward`). A decoding step and a prefill that emits the first new token call this:
        under compiled decoding the head and the argmax run inside the forward's graph."""
        return self._blocks(tokens, positions, cache, valid, None, keep=(self.cfg.num_layers,),
                            readout="greedy" if greedy else "next", last=last)[-1]

    def hidden(self, tokens: torch.Tensor, positions: torch.Tensor | None = None, cache: KVCache | None = None, *,
               valid: torch.Tensor | None = None, sparse: SinkWindow | None = None) -> torch.Tensor:
        """The last block's output (B, T, d_model), before the final norm (arguments as `forward`).
        A prefill that only fills the cache calls this: (B, T, V) logits would cost a third of
        its FLOPs here and, at V = 50,304, more memory than the rest of the pass."""
        return self._blocks(tokens, positions, cache, valid, sparse, keep=(self.cfg.num_layers,))[-1]

    def residual_stream(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                        cache: KVCache | None = None, *, valid: torch.Tensor | None = None,
                        sparse: SinkWindow | None = None, layers: tuple[int, ...] | None = None) -> torch.Tensor:
        """The residual stream at `layers` (0: the embedding, i: after block i; default all
        n_layers + 1), stacked (len(layers), B, T, d_model) in the order given (arguments as
        `forward`); `head(stream[i])` of the entry for n_layers are the logits. Only the entries
        asked for are kept: a draft reading a few of an 8B target's 33 entries holds those alone."""
        keep = tuple(range(self.cfg.num_layers + 1)) if layers is None else tuple(layers)
        if not keep or not all(0 <= i <= self.cfg.num_layers for i in keep):
            raise ValueError(f"layers must be residual-stream entries 0..{self.cfg.num_layers}, got {layers}")
        entries = tuple(sorted(set(keep)))
        kept = dict(zip(entries, self._blocks(tokens, positions, cache, valid, sparse, keep=entries)))
        return torch.stack([kept[i] for i in keep])

    def new_cache(self, batch: int, capacity: int, sparse: SinkWindow | None = None, scored: int = 0,
                  slot: tuple | None = None) -> DenseKVCache:
        """A dense KV cache for this model on its device and dtype, applying its sliding window if
        any (or reading only `sparse`'s sink + window), recording the attention of `scored` queries
        per row if > 0 (`DenseKVCache.record_scores`). Under compiled decoding the model keeps its
        cache of the same shape and `slot` (the generation it serves) for the process (`kvcache.reuse`).
        With `live_reads`, decode-time attention reads only the live key blocks (`DenseKVCache.live_mask`)."""
        param = next(self.parameters())
        c = self.cfg

        def build():
            return DenseKVCache(c.num_layers, batch, c.n_kv, c.d_head, capacity, sparse=sparse or c.attention_window,
                                scored=scored, live_reads=self.live_reads, device=param.device, dtype=param.dtype)
        key = ("dense", batch, capacity, sparse, scored, slot)
        return reuse(self, key, build) if self.compiled_decoding else build()

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) of last-block outputs x (..., d_model): final norm, then unembedding."""
        return self.unembed(self.norm(x))

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of tokens (B, T) against targets (B, T), fused with the
        unembedding (`linear_cross_entropy`: the (B, T, V) logits never exist)."""
        x = self.norm(self.hidden(tokens))
        return linear_cross_entropy(x.flatten(0, 1), self.unembed.weight, targets.flatten())

    def compile_decoding(self, enabled: bool = True) -> Transformer:
        """Run every cached forward (prefills, AD steps, verification, draft passes) through one
        static compiled graph per shape and output (`compile_for_decoding`: torch.compile
        without graph breaks; on CPU C++ kernels with a C++ wrapper, on CUDA Triton kernels that a
        round's CUDA graph captures, `decoding.graphs`), or, with `enabled` False, eagerly again:
        eager is the reference. Dense caches read their
        whole capacity at decode time, so that a graph serves every step; a prefill's graph
        serves every batch of its (B, L). Results equal eager up to rounding (fused kernels,
        RoPE in real arithmetic)."""
        self._compiled = None
        if enabled:
            self._compiled = compile_for_decoding(self._stream, next(self.parameters()).device)
        return self

    _compiled = None  # the compiled `_stream`, see `compile_decoding`
    # Decode-time attention over a dense cache through a FlexAttention block mask that reads the live
    # key blocks only (a split-KV kernel on a GPU, `DenseKVCache.live_mask`) instead of the whole
    # capacity, masked (the default: the path measured so far; `bench gpu-check` times both).
    live_reads = False

    @property
    def compiled_decoding(self) -> bool:
        """Whether cached decode-time forwards run compiled (`compile_decoding`)."""
        return self._compiled is not None

    def __getstate__(self) -> dict:
        """What a copy (or a pickle) of the model holds: not its compiled forward, bound to this
        model and its dtype; a copy compiles its own (`drafts.in_dtype`)."""
        state = super().__getstate__()
        state.pop("_compiled", None)
        return state

    def _blocks(self, tokens, positions, cache, valid, sparse, keep: tuple[int, ...], readout: str | None = None,
                last: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Run the blocks; the residual-stream entries `keep` (sorted: 0 the embedding, i after
        block i), the last one read out through the head as `readout` says (`_stream`)."""
        B, T = tokens.shape
        wanted = tuple(i in keep for i in range(self.cfg.num_layers + 1))
        if positions is None:
            positions = torch.arange(T, device=tokens.device).expand(B, T)
        window = self.cfg.attention_window
        if window is not None and cache is None:
            sparse = sparse or window
        elif window is not None and cache.sparse is None:
            raise ValueError(f"this model attends through a sliding window of {self.cfg.sliding_window} positions; "
                             "its cache must apply it: build it with Transformer.new_cache")
        if cache is None:
            mask = None if sparse is None else visibility(positions, positions, sparse)  # (B, 1, T, T); None: causal
            return self._stream(tokens, None, positions, None, mask, wanted, readout, last)
        if positions.untyped_storage().data_ptr() == cache.lengths.untyped_storage().data_ptr():
            positions = positions.clone()  # e.g. cache.lengths[:, None]: the forward updates lengths in place
        cache.plan(positions, valid)  # what the host decides, outside any compiled graph
        return (self._compiled or self._stream)(tokens, cache, positions, valid, None, wanted, readout, last)

    def _stream(self, tokens, cache, positions, valid, mask, wanted: tuple[bool, ...], readout: str | None = None,
                last: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The blocks over tokens (B, T) at positions (B, T): with a `cache` (planned, `plan`),
        its bookkeeping first (`register`, `valid` as `forward`'s) and its visibility mask; without
        one, the visibility `mask` given (None: causal). Returns the residual-stream entries i with
        `wanted[i]`, the last one read out by the head if `readout` says so: "logits" (B, T, V);
        "next", the logits (B, V) of one token per row, the one at index `last` (B,) (None: T - 1);
        "greedy", their argmax (B,). What `compile_decoding` compiles: one graph per `wanted`,
        `readout` and whether `last` is given (constants, which dynamo never turns into symbolic
        values), so the cache's bookkeeping, the head and the greedy argmax run inside the
        forward's graph: a decoding step is one replay. Its outputs live until the next replay
        (CUDA graphs' pool): a caller copies what it keeps."""
        slots = None
        if cache is not None:
            slots = cache.register(positions, valid)  # (B, T), in place at fixed addresses
            mask = cache.mask(positions)  # (B, 1, T, S) or None: causal
        rope = self.rope(positions)
        x = self.embed(tokens)  # (B, T, d_model)
        stream = [x] if wanted[0] else []
        for i, block in enumerate(self.blocks):
            x = block(x, rope, mask, cache, i, slots, positions)
            if wanted[i + 1]:
                stream.append(x)
        if readout is None:
            return stream
        if readout != "logits":  # one token per row
            x = x[:, -1] if last is None else x[torch.arange(x.shape[0], device=x.device), last]  # (B, d_model)
        logits = self.head(x)  # (B, T, V) or (B, V)
        stream[-1] = logits.argmax(-1) if readout == "greedy" else logits
        return stream
