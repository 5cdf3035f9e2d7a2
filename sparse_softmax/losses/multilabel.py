"""Multi-label categorical cross-entropy (Su 2020) and its AS-Softmax version.

Su's loss ``log(1 + Σ_neg e^{o_i}) + log(1 + Σ_pos e^{-o_j})`` pushes positives above 0 and negatives
below it, so prediction is ``o > 0``. Both terms are computed as a logsumexp with an appended 0, which
cannot overflow in half precision (the reference code exponentiates directly).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ._common import check_multilabel, check_range, compute_dtype, reduce_rows


def _lse_with_zero(scores: Tensor, include: Tensor) -> Tensor:
    """``log(1 + Σ_{include} e^{scores})`` per row, stably."""
    masked = scores.masked_fill(~include, float("-inf"))
    return torch.cat([masked, masked.new_zeros(masked.shape[0], 1)], dim=1).logsumexp(dim=1)


def _multilabel_rows(logits: Tensor, labels: Tensor, keep_neg: Tensor, keep_pos: Tensor) -> Tensor:
    o = logits.to(compute_dtype(logits))
    return _lse_with_zero(o, ~labels & keep_neg) + _lse_with_zero(-o, labels & keep_pos)


def multilabel_categorical_crossentropy(logits: Tensor, labels: Tensor, reduction: str = "sum") -> Tensor:
    """Su's multi-label loss over multi-hot ``labels (N, V)``; predict the classes with logit > 0."""
    labels = check_multilabel(logits, labels, reduction)
    everything = torch.ones_like(labels)
    return reduce_rows(_multilabel_rows(logits, labels, everything, everything), None, reduction)


def as_multilabel_masks(logits: Tensor, labels: Tensor, delta: float) -> tuple[Tensor, Tensor]:
    """Which negatives and positives AS-Softmax keeps, from p = softmax(logits) (no gradient).

    A negative i is kept iff ``min_pos p - p_i ≤ δ``; a positive t iff ``p_t - max_neg p ≤ δ``. Over an
    empty set the min is +∞ and the max −∞: a row without positives keeps no negative, a row without
    negatives keeps no positive (as the reference implementation behaves).
    """
    with torch.no_grad():
        p = logits.to(compute_dtype(logits)).softmax(dim=-1)
        min_pos = p.masked_fill(~labels, float("inf")).amin(dim=-1, keepdim=True)
        max_neg = p.masked_fill(labels, float("-inf")).amax(dim=-1, keepdim=True)
        return (min_pos - p) <= delta, (p - max_neg) <= delta


def as_multilabel_loss(
    logits: Tensor,
    labels: Tensor,
    delta: float,
    reduction: str = "sum",
    return_masked: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Su's loss restricted to the classes AS-Softmax keeps; δ = 1 keeps all of them.

    With ``return_masked`` also the number of rows where nothing is kept (loss and gradient 0).
    """
    labels = check_multilabel(logits, labels, reduction)
    check_range("delta", delta, 0.0, 1.0)
    keep_neg, keep_pos = as_multilabel_masks(logits, labels, delta)
    loss = reduce_rows(_multilabel_rows(logits, labels, keep_neg, keep_pos), None, reduction)
    if not return_masked:
        return loss
    kept = (~labels & keep_neg) | (labels & keep_pos)
    return loss, (~kept.any(dim=-1)).sum()
