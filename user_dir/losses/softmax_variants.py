"""Softmax cross-entropy, plain or label-smoothed, and on transformed logits: temperature, soft-margin
and additive-margin (AM) softmax.

Each baseline is plain softmax CE after one change to the logits, so they share ``_ce_rows``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import check_range, compute_dtype, prepare_rows, reduce_rows


def _ce_rows(z: Tensor, target: Tensor, label_smoothing: float = 0.0) -> Tensor:
    return F.cross_entropy(z, target, reduction="none", label_smoothing=label_smoothing)


def _margin_rows(z: Tensor, target: Tensor, margin: float) -> Tensor:
    """CE of ``z`` with ``margin`` subtracted from the target logit only."""
    shifted = z.scatter_add(1, target[:, None], z.new_full((z.shape[0], 1), -float(margin)))
    return _ce_rows(shifted, target)


def softmax_loss(
    logits: Tensor, target: Tensor, ignore_index: int | None = None, reduction: str = "sum", label_smoothing: float = 0.0
) -> Tensor:
    """Softmax cross-entropy; label smoothing ε gives ``(1-ε)·CE + ε·mean_i(-log p_i)`` (torch's definition:
    the target keeps its share of ε, where fairseq's ``label_smoothed_cross_entropy`` spreads ε over the
    other V-1 classes)."""
    rows = prepare_rows(logits, target, ignore_index, reduction)
    check_range("label_smoothing", label_smoothing, 0.0, 1.0)
    z = logits.to(compute_dtype(logits))
    return reduce_rows(_ce_rows(z, rows.target, label_smoothing), rows.valid, reduction)


def temperature_softmax_loss(
    logits: Tensor, target: Tensor, temperature: float, ignore_index: int | None = None, reduction: str = "sum"
) -> Tensor:
    """``CE(z / τ)``: τ < 1 sharpens, τ > 1 flattens the training distribution."""
    rows = prepare_rows(logits, target, ignore_index, reduction)
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    z = logits.to(compute_dtype(logits)) / temperature
    return reduce_rows(_ce_rows(z, rows.target), rows.valid, reduction)


def soft_margin_softmax_loss(
    logits: Tensor, target: Tensor, margin: float, ignore_index: int | None = None, reduction: str = "sum"
) -> Tensor:
    """Soft-margin (SM) softmax: ``-log e^{z_t-m} / (e^{z_t-m} + Σ_{j≠t} e^{z_j})`` on raw logits."""
    rows = prepare_rows(logits, target, ignore_index, reduction)
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin!r}")
    z = logits.to(compute_dtype(logits))
    return reduce_rows(_margin_rows(z, rows.target, margin), rows.valid, reduction)


def am_softmax_loss(
    cosine: Tensor,
    target: Tensor,
    margin: float = 0.35,
    scale: float = 30.0,
    ignore_index: int | None = None,
    reduction: str = "sum",
) -> Tensor:
    """Additive-margin softmax on cosine logits: ``CE(s·(cos - m·onehot(t)))``.

    ``cosine`` must be cos(θ) between normalised features and normalised class weights, in [-1, 1];
    the margin is a training-time device only (predict with ``argmax cos``).
    """
    rows = prepare_rows(cosine, target, ignore_index, reduction)
    if margin < 0 or not scale > 0:
        raise ValueError(f"AM-softmax needs margin >= 0 and scale > 0, got margin={margin!r}, scale={scale!r}")
    c = cosine.to(compute_dtype(cosine))
    with torch.no_grad():
        if bool((c.abs() > 1 + 1e-4).any()):
            raise ValueError("am_softmax_loss expects cosine logits in [-1, 1]; normalise features and weights")
    return reduce_rows(_margin_rows(c * scale, rows.target, margin * scale), rows.valid, reduction)
