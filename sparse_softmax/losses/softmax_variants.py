"""Softmax cross-entropy, plain or label-smoothed, and on transformed logits: temperature, soft-margin
and additive-margin (AM) softmax.

Each baseline is plain softmax CE after one change to the logits, so they share ``_ce_rows``.
``softmax_chunk`` is the (label-smoothed) CE of a block of rows with its gradient written out, for
``fused_output_loss``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import check_range, compute_dtype, exp_shifted_, prepare_rows, reduce_rows


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


class SoftmaxChunk(NamedTuple):
    """One block of rows scored by softmax CE; per-row tensors have shape ``(B,)``."""

    loss: Tensor  # unweighted row losses (label-smoothed when asked)
    nll: Tensor  # plain softmax cross-entropy
    grad: Tensor | None  # (B, V) unweighted gradient w.r.t. the logits, in the logits' buffer


def softmax_chunk(z: Tensor, target: Tensor, label_smoothing: float, want_grad: bool) -> SoftmaxChunk:
    """Score logits ``z (B, V)`` (float32/64, overwritten) as ``softmax_loss`` does: the gradient of
    ``(1-ε)·CE + ε·mean_i(-log p_i)`` is ``p - (1-ε)·onehot(t) - ε/V``. Works in ``z``'s buffer."""
    t = target[:, None]
    z_t = z.gather(1, t)
    mean = z.mean(dim=-1) if label_smoothing > 0 else None
    top, total = exp_shifted_(z)
    lse = top + total.log()
    nll = (lse - z_t).squeeze(1)
    loss = nll if mean is None else (1.0 - label_smoothing) * nll + label_smoothing * (lse.squeeze(1) - mean)
    if not want_grad:
        return SoftmaxChunk(loss, nll, None)
    p = z.div_(total)
    if label_smoothing > 0:
        p.sub_(label_smoothing / z.shape[1])
    p.scatter_add_(1, t, torch.full_like(z_t, label_smoothing - 1.0))
    return SoftmaxChunk(loss, nll, p)
