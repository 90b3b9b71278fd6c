"""Draft training losses (method §3.7).

p is the target's next-token distribution, q the draft's (both at temperature 1).
HardTargetLoss is cross-entropy with the data's next token; distillation is
CE(p, q) = -sum_i p_i log q_i; alpha = sum_i min(p_i, q_i) is the probability that
rejection sampling accepts the draft's token (Leviathan et al. 2023); MixedLoss(w) =
w * CE(p, q) - (1 - w) * alpha. SPIRe uses w = 0.5; w = 1 is pure distillation.

`draft_losses` computes the chosen loss, every per-position part and the gradient from logits
in one chunked pass over the vocabulary; training uses `head_draft_losses`, the same fused with
the draft's and the target's unembeddings, so that no (positions, V) tensor beyond one chunk of
rows exists (at the paper's batch, 64 x 1024 x 50,304 fp32 logits are 13 GB each).
tests/model/test_spire.py checks both against the plain definitions, value and gradients.
"""

from __future__ import annotations

import functools

import torch


def mix(distill_ce: torch.Tensor, alpha: torch.Tensor, weight: float) -> torch.Tensor:
    """MixedLoss(w) from its parts: w * CE(p, q) - (1 - w) * alpha (both already averaged)."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"MixedLoss weight must be in [0, 1], got {weight}")
    return weight * distill_ce - (1.0 - weight) * alpha


def _chunk_parts(log_q: torch.Tensor, p: torch.Tensor, label: torch.Tensor, mix_weight: float | None, grad: bool):
    """Per-row distillation CE, alpha, hard CE of one chunk (c, V) of draft log-probabilities
    log_q against target probabilities p and labels (c, 1), and d(sum of row losses)/d logits
    (c, V) if `grad`: d CE(p, q)/dz = q - p; d alpha/dz = m q - q (m . q) with m = [q < p];
    d CE(label)/dz = q - onehot."""
    q = log_q.exp()
    parts = (-(p * log_q).sum(-1), torch.minimum(p, q).sum(-1), -log_q.gather(1, label)[:, 0])
    if not grad:
        return (*parts, None)
    if mix_weight is None:
        return (*parts, q.scatter_add_(1, label, -torch.ones_like(label, dtype=q.dtype)))
    if mix_weight == 1.0:  # distillation alone: alpha's term below is multiplied by 0, the same bits
        return (*parts, q - p)
    below = torch.where(q < p, q, 0.0)  # m * q
    return (*parts, mix_weight * (q - p) - (1.0 - mix_weight) * (below - q * below.sum(-1, keepdim=True)))


def _logit_chunk_parts(logits: torch.Tensor, target_logits: torch.Tensor, label: torch.Tensor,
                       mix_weight: float | None, grad: bool):
    """`_chunk_parts` of a chunk of draft and target logits (c, V), in the accumulation dtype."""
    return _chunk_parts(torch.log_softmax(logits, dim=-1), torch.softmax(target_logits, dim=-1), label,
                        mix_weight, grad)


@functools.cache
def _compiled_chunk_parts():
    """`_logit_chunk_parts` compiled (torch.compile, one static graph per chunk shape and loss): its
    dozen passes over a (c, V) chunk (both softmaxes, exp, the three parts, the gradient) fuse into a
    few loops, which a SPIRe training step's heads and loss gain from on the CPU (docs/benchmarks.md,
    "Where a training step's time goes": the loss's chunk arithmetic compiled). Every shape, loss and
    gradient flag is a graph of its own (05's variants make a dozen): the recompile limits are raised
    as for decoding (`compiled.compile_for_decoding`), so none runs eagerly for want of one."""
    for limit in ("recompile_limit", "accumulated_recompile_limit"):
        setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 512))
    return torch.compile(_logit_chunk_parts, dynamic=False)


def _loss_of(parts, mix_weight):
    distill, alpha, hard = parts
    return hard.mean() if mix_weight is None else mix(distill.mean(), alpha.mean(), mix_weight)


class _DraftLosses(torch.autograd.Function):
    """The training loss of draft logits z (N, V) against target logits (N, V) and labels (N,),
    with the per-position distillation CE, alpha and hard CE, in one pass over row chunks.

    The loss is the last op of a step, so forward computes its gradient with respect to z
    too (`_chunk_parts`) and backward only scales it: no (N, V) intermediates beyond one chunk
    (but z itself and its gradient are (N, V): training uses `_HeadDraftLosses`).
    At exact ties q_i = p_i, alpha's gradient counts p_i as the minimum (autograd of
    torch.minimum splits it in half; ties have probability zero for real logits).
    """

    @staticmethod
    def forward(ctx, logits, target_logits, labels, mix_weight, chunk):
        acc = torch.promote_types(logits.dtype, torch.float32)
        n = logits.shape[0]
        parts = tuple(torch.empty(n, dtype=acc, device=logits.device) for _ in range(3))
        grad = torch.empty_like(logits, dtype=acc) if ctx.needs_input_grad[0] else None
        for i in range(0, n, chunk):
            rows = slice(i, i + chunk)
            log_q = torch.log_softmax(logits[rows].to(acc), dim=-1)  # (c, V)
            p = torch.softmax(target_logits[rows].to(acc), dim=-1)
            *chunk_parts, dz = _chunk_parts(log_q, p, labels[rows, None], mix_weight, grad is not None)
            for part, value in zip(parts, chunk_parts):
                part[rows] = value
            if grad is not None:
                grad[rows] = dz
        ctx.save_for_backward(grad)
        ctx.n, ctx.dtype = n, logits.dtype
        ctx.mark_non_differentiable(*parts)
        return _loss_of(parts, mix_weight), *parts

    @staticmethod
    def backward(ctx, grad_loss, *_):
        (grad,) = ctx.saved_tensors
        return (grad * (grad_loss / ctx.n)).to(ctx.dtype), None, None, None, None


def draft_losses(draft_logits: torch.Tensor, target_logits: torch.Tensor, labels: torch.Tensor,
                 mix_weight: float | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A draft's training loss and its parts, per position, from logits.

    draft_logits and target_logits (..., V), labels (...). `mix_weight` w gives MixedLoss(w);
    None gives HardTargetLoss. Returns the scalar loss (differentiable in draft_logits) and
    {"distill_ce", "alpha", "hard_ce"}, each (...) and detached, whatever the loss.
    Training uses `head_draft_losses`, which never holds (..., V) logits.
    """
    V = draft_logits.shape[-1]
    chunk = max(1, (1 << (28 if draft_logits.is_cuda else 17)) // V)  # rows per chunk: GPU big, CPU cache-sized
    loss, *parts = _DraftLosses.apply(draft_logits.reshape(-1, V), target_logits.reshape(-1, V),
                                      labels.reshape(-1), mix_weight, chunk)
    return loss, {name: part.view(labels.shape) for name, part in zip(PARTS, parts)}


PARTS = ("distill_ce", "alpha", "hard_ce")


class _HeadDraftLosses(torch.autograd.Function):
    """`_DraftLosses` fused with both unembeddings: draft logits z = h W^T from normed draft
    hidden states h (N, d) and the draft's unembedding W (V, d), target logits from normed
    target hidden states (N, d) and the target's unembedding (V, d), chunk by chunk over rows.

    Forward computes the loss, its parts and the gradients with respect to h and W (dz from
    `_chunk_parts`, then dz W and dz^T h per chunk), so no (N, V) tensor beyond one chunk
    exists; backward only scales them. Matmuls run in h's dtype; softmaxes, the losses and
    the gradients accumulate in at least fp32 (as `model._LinearCrossEntropy`).
    """

    # parameters: torch's autograd.Function.forward takes each input as an argument of its own
    @staticmethod
    def forward(ctx, h, weight, target_h, target_weight, labels, mix_weight, chunk, chunk_parts_fn):
        acc = torch.promote_types(h.dtype, torch.float32)
        n = h.shape[0]
        w, tw, th = weight.to(h.dtype), target_weight.to(h.dtype), target_h.to(h.dtype)
        parts = tuple(torch.empty(n, dtype=acc, device=h.device) for _ in range(3))
        need = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_h = torch.empty(h.shape, dtype=h.dtype, device=h.device) if need else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=h.device) if need else None
        for i in range(0, n, chunk):
            rows = slice(i, i + chunk)
            hc = h[rows]  # (c, d)
            logits, target_logits = (hc @ w.T).to(acc), (th[rows] @ tw.T).to(acc)  # (c, V) each
            *chunk_parts, dz = chunk_parts_fn(logits, target_logits, labels[rows, None], mix_weight, need)
            for part, value in zip(parts, chunk_parts):
                part[rows] = value
            if need:
                dz = dz.to(h.dtype)
                grad_h[rows] = dz @ w
                grad_w += (dz.T @ hc).to(acc)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.n, ctx.weight_dtype = n, weight.dtype
        ctx.mark_non_differentiable(*parts)
        return _loss_of(parts, mix_weight), *parts

    @staticmethod
    def backward(ctx, grad_loss, *_):
        grad_h, grad_w = ctx.saved_tensors
        scale = grad_loss / ctx.n
        return (grad_h * scale.to(grad_h.dtype), (grad_w * scale).to(ctx.weight_dtype), *[None] * 6)


#: Rows per chunk of `head_draft_losses` on a CPU: as many as 2^19 logits (2 MB in fp32, a core's
#: L2 here) and at least this many, so that a large vocabulary's matmuls keep their rows: at the
#: paper's V = 50,304, d = 512, 2,048 rows took 13.0 and 13.2 s in chunks of 64 and 10.9 and 9.9 s
#: in chunks of 128 (one thread, 2026-12-07). At V <= 4,096 the logits rule gives 128 or more.
CPU_ROWS = 128


def head_draft_losses(draft_x: torch.Tensor, draft_weight: torch.Tensor, target_x: torch.Tensor,
                      target_weight: torch.Tensor, labels: torch.Tensor, mix_weight: float | None,
                      chunk: int | None = None, compiled: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`draft_losses(draft_x @ draft_weight^T, target_x @ target_weight^T, labels, mix_weight)`
    without either logits tensor: rows go through both unembeddings, the losses and the
    gradient in chunks of `chunk` rows (default: on CPU 2^19 logits and at least `CPU_ROWS` rows;
    ~2^26 logits on GPU).

    draft_x (..., d): the draft's last hidden states after its final norm (differentiable;
    the norm stays outside, under autograd, so gradients reach its gain and the hidden
    states); draft_weight (V, d) its unembedding (differentiable); target_x (..., d) and
    target_weight (V, d) the frozen target's normed last hidden states at the same positions
    and its unembedding; labels (...). Under autocast the matmuls run in the autocast dtype.
    `compiled`: each chunk's softmax arithmetic, losses and gradient run compiled
    (`_compiled_chunk_parts`; equal to eager up to rounding), the matmuls as they are.
    """
    device = draft_x.device.type
    if torch.is_autocast_enabled(device):
        draft_x = draft_x.to(torch.get_autocast_dtype(device))
    V, d = draft_weight.shape
    if chunk is None:
        chunk = max(1, (1 << 26) // V) if draft_x.is_cuda else max(CPU_ROWS, (1 << 19) // V)
    with torch.autocast(device, enabled=False):
        loss, *parts = _HeadDraftLosses.apply(draft_x.reshape(-1, d), draft_weight, target_x.reshape(-1, d),
                                              target_weight, labels.reshape(-1), mix_weight, chunk,
                                              _compiled_chunk_parts() if compiled else _logit_chunk_parts)
    return loss, {name: part.view(labels.shape) for name, part in zip(PARTS, parts)}
