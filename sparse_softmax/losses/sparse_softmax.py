"""Sparse-softmax (Sun et al. 2021): cross-entropy normalised over the k largest logits only.

``sparse_softmax_loss`` takes logits and lets autograd through ``topk``; ``sparse_softmax_chunk`` is the
same loss for a block of rows with its gradient written out explicitly, as ``k + 1`` (class, value)
pairs per row, which is what ``fused_output_loss`` turns into a sparse backward of the output layer.
On a GPU both go through a Triton kernel (``sparse_softmax_triton.py``) that finds the top k in the same
sweep as the log-sum-exp, instead of ``torch.topk``.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from ._common import SparseChunk, check_range, compute_dtype, exp_shifted_, prepare_rows, reduce_rows
from .dispatch import TRITON, Tiles, check_impl, use_triton

if TRITON:
    from .sparse_softmax_triton import sparse_softmax_chunk_triton


def sparse_softmax_loss(
    logits: Tensor,
    target: Tensor,
    k: int,
    ignore_index: int | None = None,
    reduction: str = "sum",
    label_smoothing: float = 0.0,
    *,
    impl: str = "auto",
    tiles: Tiles = Tiles(),
) -> Tensor:
    """``logsumexp(topk(z, k)) - z_t`` per row (SPACES semantics).

    The target is *not* added to the support when it falls outside the top-k: the loss then stays
    positive and pushes z_t up and the top-k logits down. Only the k selected logits and z_t receive
    gradient, so no dense softmax is ever formed.

    ``label_smoothing`` ε spreads ε of the target mass uniformly over the k kept classes:
    ``(1-ε)·(lse_k - z_t) + ε·(lse_k - mean(topk(z)))``. fairseq's ``-Σ_V log p`` smoothing would be
    +∞ here, because every class outside the support has probability 0.

    Args:
        logits: (N, V) scores, any float dtype (computed in float32; float64 in float64).
        target: (N,) integer classes; rows equal to ``ignore_index`` count for nothing.
        k: the support's size, in [1, V].
        ignore_index, reduction: as ``F.cross_entropy``'s ("sum", "mean" over counted rows, "none").
        label_smoothing: ε in [0, 1].
        impl: "auto", "torch" or "triton" (``dispatch.use_triton``): on a GPU the row kernel finds the top k in
            the same sweep as the log-sum-exp, instead of ``torch.topk``.
        tiles: the row kernel's sizes (``dispatch.Tiles``).

    Returns:
        The loss, reduced: a scalar, or (N,) with ``reduction="none"``.
    """
    rows = prepare_rows(logits, target, ignore_index, reduction)
    check_range("k", k, 1, logits.shape[1])
    check_range("label_smoothing", label_smoothing, 0.0, 1.0)
    check_impl(impl)
    if use_triton(logits, impl, k):
        score = functools.partial(sparse_softmax_chunk_triton, tiles=tiles)
        loss = _SparseRows.apply(logits, rows.target, int(k), float(label_smoothing), score)
        return reduce_rows(loss, rows.valid, reduction)
    dtype = compute_dtype(logits)
    top = logits.topk(int(k), dim=-1, sorted=False).values.to(dtype)
    lse = top.logsumexp(dim=-1)
    z_t = logits.gather(1, rows.target[:, None]).squeeze(1).to(dtype)
    loss = lse - z_t
    if label_smoothing > 0:
        loss = (1.0 - label_smoothing) * loss + label_smoothing * (lse - top.mean(dim=-1))
    return reduce_rows(loss, rows.valid, reduction)


def sparse_softmax_chunk(z: Tensor, target: Tensor, k: int, label_smoothing: float, want_grad: bool,
                         impl: str = "auto", tiles: Tiles = Tiles()) -> SparseChunk:
    """Score logits ``z (B, V)`` (float32/64, overwritten) against ``target (B,)`` as ``sparse_softmax_loss``.

    The gradient of ``(1-ε)·(lse_k - z_t) + ε·(lse_k - mean(topk))`` is ``p_j - ε/k`` on each of the top
    k (p: the softmax over them) and ``-(1-ε)`` at the target. ``impl`` and ``tiles`` as ``sparse_softmax_loss``'s.
    """
    if use_triton(z, impl, k):
        return sparse_softmax_chunk_triton(z, target, k, label_smoothing, want_grad, tiles)
    t = target[:, None]
    top, classes = z.topk(k, dim=-1, sorted=False)
    lse_k = top.logsumexp(dim=-1, keepdim=True)
    z_t = z.gather(1, t)
    loss = (lse_k - z_t).squeeze(1)
    if label_smoothing > 0:
        loss = (1.0 - label_smoothing) * loss + label_smoothing * (lse_k.squeeze(1) - top.mean(dim=-1))
    top_z, total = exp_shifted_(z, top.amax(dim=-1, keepdim=True))  # full logsumexp, for the logged plain CE
    nll = (top_z + total.log() - z_t).squeeze(1)
    if not want_grad:
        return SparseChunk(loss, nll, None, None)
    grad = top.sub_(lse_k).exp_()
    if label_smoothing > 0:
        grad.sub_(label_smoothing / k)
    grad = torch.cat([grad, torch.full_like(z_t, label_smoothing - 1.0)], dim=1)
    return SparseChunk(loss, nll, torch.cat([classes, t], dim=1), grad)


class _SparseRows(torch.autograd.Function):
    """Row losses of Sparse-softmax from a block scorer that hands over the gradient as k + 1 (class, value) pairs
    a row (``sparse_softmax_chunk``'s contract; the row kernel's in the product): backward scatters them into the
    dense logit gradient, which is what autograd through ``topk`` writes too, without keeping the top k's autograd
    graph or running a second top-k."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, k: int, label_smoothing: float,
                score: Callable[..., SparseChunk]) -> Tensor:
        scored = score(logits.detach(), target, k, label_smoothing, ctx.needs_input_grad[0])
        ctx.save_for_backward(scored.classes, scored.grad)
        ctx.logits_like = logits.shape, logits.dtype, logits.device
        return scored.loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        classes, grad = ctx.saved_tensors
        shape, dtype, device = ctx.logits_like
        values = (grad * grad_loss[:, None].to(grad.dtype)).to(dtype)
        return torch.zeros(shape, dtype=dtype, device=device).scatter_add_(1, classes, values), None, None, None, None
