"""The language model's loss, fused with its unembedding: the mean next-token cross-entropy of
hidden states against targets, computed one chunk of rows at a time so that the (tokens x
vocabulary) logits never exist (method §2 "Models"; `Transformer.loss`). The drafts' losses,
which also read the teacher's distributions, are `spirelib.training.losses`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: Rows per chunk on a CPU: as many as `CPU_LOGITS` logits (a chunk that stays in cache), and at
#: least `CPU_ROWS`, below which the chunk's matmuls run skinny and the (V, d) gradient is read and
#: written once per few rows: at the paper's V = 50,304, d = 512, one thread (2026-12-07), 2,048 rows
#: took 20.1 s in chunks of 41 (the logits rule alone) and 7.7 s in chunks of 512. At the
#: workbook's V = 4,096 the two rules agree (512 rows).
CPU_LOGITS, CPU_ROWS = 1 << 21, 512
GPU_LOGITS = 1 << 28


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits h @ W^T against targets, without materializing all logits.

    The loss is the last op of a step, so forward computes the gradients too, chunk by chunk
    over rows (logits, softmax, minus one-hot, then both matmuls), and backward only scales
    them. Peak memory is one chunk of logits instead of (N, V), and each chunk is reused
    while still in cache. Matmuls run in h's dtype, log-softmax and accumulation in at least fp32.
    """

    @staticmethod
    def forward(ctx, h, weight, targets, chunk):
        acc = torch.promote_types(h.dtype, torch.float32)
        w = weight.to(h.dtype)  # (V, d)
        total = h.new_zeros((), dtype=acc)
        grad_h, grad_w = [], torch.zeros(weight.shape, dtype=acc, device=h.device)
        for i in range(0, h.shape[0], chunk):
            hc, tc = h[i : i + chunk], targets[i : i + chunk, None]  # (c, d), (c, 1)
            log_probs = torch.log_softmax((hc @ w.T).to(acc), dim=-1)  # (c, V)
            total = total - log_probs.gather(1, tc).sum()
            probs = log_probs.exp_()
            dlogits = probs.scatter(1, tc, probs.gather(1, tc) - 1).to(h.dtype)  # d(sum of losses)/d logits
            grad_h.append(dlogits @ w)  # (c, d)
            grad_w += (dlogits.T @ hc).to(acc)  # (V, d), in place: no new (V, d) tensor a chunk
        ctx.save_for_backward(torch.cat(grad_h), grad_w)
        ctx.weight_dtype, ctx.n = weight.dtype, h.shape[0]
        return total / h.shape[0]

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        scale = grad_out / ctx.n
        return grad_h * scale.to(grad_h.dtype), (grad_w * scale).to(ctx.weight_dtype), None, None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """mean_i CE(softmax(h_i @ weight^T), targets_i) for h (N, d), weight (V, d), targets (N,),
    computed in chunks of rows (`_LinearCrossEntropy`). Under autocast, the matmuls run in
    the autocast dtype."""
    device = h.device.type
    if torch.is_autocast_enabled(device):
        h = h.to(torch.get_autocast_dtype(device))
    V = weight.shape[0]
    chunk = max(1, GPU_LOGITS // V) if h.is_cuda else max(CPU_ROWS, CPU_LOGITS // V)  # rows per chunk
    with torch.autocast(device, enabled=False):
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
            return _LinearCrossEntropy.apply(h, weight, targets, chunk)
        w = weight.to(h.dtype)
        total = sum(F.cross_entropy((h[i : i + chunk] @ w.T).float(), targets[i : i + chunk], reduction="sum")
                    for i in range(0, h.shape[0], chunk))
        return total / h.shape[0]
