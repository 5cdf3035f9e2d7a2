"""Sparse-softmax (Sun et al. 2021): cross-entropy normalised over the k largest logits only.

``sparse_softmax_loss`` takes logits and lets autograd through ``topk``; ``sparse_softmax_chunk`` is the
same loss for a block of rows with its gradient written out explicitly, as ``k + 1`` (class, value)
pairs per row, which is what ``fused_output_loss`` turns into a sparse backward of the output layer.
``scale_profile`` tells, for a model's logits, whether training on from there with this loss would sharpen
them or flatten them (how sparse_softmax collapses when the model does not rank its targets high enough).
On a GPU both go through a Triton kernel (``sparse_softmax_triton.py``) that finds the top k in the same
sweep as the log-sum-exp, instead of ``torch.topk``.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from ._common import check_range, compute_dtype, exp_shifted_, kernel_for, prepare_rows, reduce_rows


class SparseChunk(NamedTuple):
    """One block of rows scored by Sparse-softmax; per-row tensors have shape ``(B,)``."""

    loss: Tensor  # unweighted row losses
    nll: Tensor  # plain softmax cross-entropy of the same logits
    classes: Tensor | None  # (B, k + 1): the top k, then the target (which may repeat one of them)
    grad: Tensor | None  # (B, k + 1): the gradient w.r.t. the logits of those classes (repeats add up)


def sparse_softmax_loss(
    logits: Tensor,
    target: Tensor,
    k: int,
    ignore_index: int | None = None,
    reduction: str = "sum",
    label_smoothing: float = 0.0,
) -> Tensor:
    """``logsumexp(topk(z, k)) - z_t`` per row (SPACES semantics).

    The target is *not* added to the support when it falls outside the top-k: the loss then stays
    positive and pushes z_t up and the top-k logits down. Only the k selected logits and z_t receive
    gradient, so no dense softmax is ever formed.

    ``label_smoothing`` ε spreads ε of the target mass uniformly over the k kept classes:
    ``(1-ε)·(lse_k - z_t) + ε·(lse_k - mean(topk(z)))``. fairseq's ``-Σ_V log p`` smoothing would be
    +∞ here, because every class outside the support has probability 0.
    """
    rows = prepare_rows(logits, target, ignore_index, reduction)
    check_range("k", k, 1, logits.shape[1])
    check_range("label_smoothing", label_smoothing, 0.0, 1.0)
    kernel = _kernel(logits, k)
    if kernel is not None:
        loss = _SparseRows.apply(logits, rows.target, int(k), float(label_smoothing),
                                 kernel.sparse_softmax_chunk_triton)
        return reduce_rows(loss, rows.valid, reduction)
    dtype = compute_dtype(logits)
    top = logits.topk(int(k), dim=-1, sorted=False).values.to(dtype)
    lse = top.logsumexp(dim=-1)
    z_t = logits.gather(1, rows.target[:, None]).squeeze(1).to(dtype)
    loss = lse - z_t
    if label_smoothing > 0:
        loss = (1.0 - label_smoothing) * loss + label_smoothing * (lse - top.mean(dim=-1))
    return reduce_rows(loss, rows.valid, reduction)


def sparse_softmax_chunk(z: Tensor, target: Tensor, k: int, label_smoothing: float, want_grad: bool) -> SparseChunk:
    """Score logits ``z (B, V)`` (float32/64, overwritten) against ``target (B,)`` as ``sparse_softmax_loss``.

    The gradient of ``(1-ε)·(lse_k - z_t) + ε·(lse_k - mean(topk))`` is ``p_j - ε/k`` on each of the top
    k (p: the softmax over them) and ``-(1-ε)`` at the target.
    """
    kernel = _kernel(z, k)
    if kernel is not None:
        return kernel.sparse_softmax_chunk_triton(z, target, k, label_smoothing, want_grad)
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


class ScaleProfile(NamedTuple):
    """The Sparse-softmax loss of some rows with their logits multiplied by a scale s; counted rows only."""

    loss: Tensor  # (N, S) nats: lse(s · topk(z)) - s · z_t at each scale (log k at s = 0)
    flat_slope: Tensor  # (N,) the loss's derivative in s at s = 0: mean(topk(z)) - z_t
    rank: Tensor  # (N,) how many classes score strictly above the target (0: it is the argmax)


def scale_profile(logits: Tensor, target: Tensor, k: int, scales: Tensor,
                  ignore_index: int | None = None) -> ScaleProfile:
    """How ``sparse_softmax_loss`` of ``logits`` changes with the logits' scale: why it can collapse.

    Multiplying every logit by s > 0 keeps each row's top k, so the loss ``lse(s·z_K) - s·z_t`` is a
    convex function of s that starts at ``log k`` for s -> 0, whatever the model, with slope
    ``mean(z_K) - z_t``. Where that slope is >= 0 on average over the data, i.e. the target scores no
    higher than the mean of the k largest logits, *flat logits are the loss's minimum over scale*: a
    model trained on with Sparse-softmax from there lowers its loss fastest by shrinking its logits
    (the norm of its output layer or of the features), and the loss plateaus near ``log k``, where the
    target's rank no longer matters. Plain softmax has the same form with ``log V`` and the mean over all
    V classes, which a target almost always beats: it never gains by flattening. A model fine-tuned from
    a pretrained language-model head ranks its targets high from the start; one trained from scratch, or
    with a fresh head, does not (docs/experiments.md, "Why sparse_softmax collapses").

    ``scales`` (S,) are the multipliers to evaluate; the loss is computed in float64.
    """
    z, z_t, top = _counted_top(logits, target, k, ignore_index)
    s = scales.to(top)
    loss = (s[None, :, None] * top[:, None, :]).logsumexp(dim=-1) - s[None, :] * z_t
    return ScaleProfile(loss, (top.mean(dim=-1, keepdim=True) - z_t).squeeze(1), (z > z_t).sum(dim=-1))


def flat_slope(logits: Tensor, target: Tensor, k: int, ignore_index: int | None = None) -> Tensor:
    """``scale_profile``'s flat slope alone, ``mean(topk(z)) - z_t`` per counted row in float64: what a training
    run can afford to log every batch (no scaled losses, no rank over all V classes)."""
    _, z_t, top = _counted_top(logits, target, k, ignore_index)
    return (top.mean(dim=-1, keepdim=True) - z_t).squeeze(1)


def handover_warning(logits: Tensor, target: Tensor, k: int, update: int) -> str | None:
    """What to tell the user when a softmax warm-up ends with a model that flat logits beat on the Sparse-softmax
    loss (``logits`` and ``target``: a sample of the first batch after it, counted rows only), or None.

    Flat logits score ``log k`` whatever the model knows; a model that scores more gains by flattening its logits
    as soon as the top k takes over (``scale_profile``: the loss is convex in the logits' scale), whatever its
    flat slope, and in every run measured that handed over such a model the valid cross-entropy jumped within a
    few dozen updates and stayed (docs/experiments.md, "Why sparse_softmax collapses"). What the jump costs
    depends on the decoding: plain beam search reads the flattened tail, a top-k mask only the ranking, which
    survived a long warm-up (MiniLM question generation after half the run of softmax) and not a short one. One
    line, said once, when it can still be acted on."""
    loss = float(sparse_softmax_loss(logits, target, k, reduction="mean"))
    if loss <= math.log(k):
        return None
    slope = float(flat_slope(logits, target, k).mean())
    return (f"sparse_softmax: the softmax warm-up hands over at update {update} a model that scores "
            f"{loss / math.log(2):.2f} bits on the Sparse-softmax loss (k = {k}), more than flat logits' "
            f"log2 {k} = {math.log2(k):.2f} (flat_slope {slope:+.2f}): training on flattens its logits and its "
            "nll_loss will rise, so plain beam search will read a flat tail. Decode it inside its top k "
            "(fairseq's --decoding-topk, generate()'s TopKRenormalise), where its ranking can hold (it did after "
            "half the run of softmax, not after 10 %), or train with a larger k, whose log k the model beats, or "
            "with cross_entropy or as_softmax (docs/criterions.md, 'Which regime')")


#: Rows a training run measures the flat slope on per batch (evenly spaced): a top k over a few hundred rows costs
#: nothing beside the batch's loss, and the log averages it over many batches.
SLOPE_ROWS = 256


def slope_rows(target: Tensor, ignore_index: int | None, limit: int = SLOPE_ROWS) -> Tensor:
    """Indices of up to ``limit`` evenly spaced counted rows of ``target (N,)``: the sample whose ``flat_slope`` a
    training loop logs (chosen before the logits, so a fused output layer forms them for these rows only)."""
    rows = torch.arange(target.size(0), device=target.device)
    if ignore_index is not None:
        rows = rows[target != ignore_index]
    return rows[:: max(1, rows.numel() // limit)][:limit]


def _counted_top(logits: Tensor, target: Tensor, k: int, ignore_index: int | None) -> tuple[Tensor, Tensor, Tensor]:
    """The counted rows' logits (their own dtype), target logits ``(N, 1)`` and top k (both float64: exact copies,
    so the N × V logits are never cast, which the criterion's every batch would pay for)."""
    rows = prepare_rows(logits, target, ignore_index, "none")
    check_range("k", k, 1, logits.shape[1])
    z = logits[rows.valid]
    z_t = z.gather(1, rows.target[rows.valid, None]).double()
    return z, z_t, z.topk(int(k), dim=-1, sorted=False).values.double()


def _kernel(logits: Tensor, k: int):
    """The Triton kernels when they serve these logits and this k."""
    kernel = kernel_for(logits, "sparse_softmax_triton")
    return kernel if kernel is not None and k <= kernel.MAX_K else None


class _SparseRows(torch.autograd.Function):
    """Row losses of Sparse-softmax from a block scorer that hands over the gradient as k + 1 (class,
    value) pairs a row (``sparse_softmax_chunk``'s contract): backward scatters them into the dense logit
    gradient, which is what autograd through ``topk`` writes too, without keeping the top k's autograd
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
