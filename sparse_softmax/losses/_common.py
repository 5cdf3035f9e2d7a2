"""Input checks and reductions shared by every loss in this package.

All losses take logits ``(N, V)`` and either integer targets ``(N,)`` or multi-hot labels ``(N, V)``.
They compute in float32 (float64 when given float64, so ``gradcheck`` works) whatever the logits'
dtype; autograd casts the gradient back to the input dtype.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

REDUCTIONS = ("sum", "mean", "none")


class LossResult(NamedTuple):
    """A loss and what a criterion logs beside it, computed in the same pass over the logits."""

    loss: Tensor  # reduced as requested; differentiable
    nll: Tensor  # plain softmax cross-entropy of the same logits, same reduction, no gradient
    n_masked: Tensor  # int64 scalar: counted rows with loss and gradient 0 (AS-Softmax's masked samples)
    n_dense: Tensor  # int64 scalar: counted rows whose gradient w.r.t. the logits is dense (every class)


class SparseChunk(NamedTuple):
    """One block of rows scored by Sparse-softmax; per-row tensors have shape ``(B,)``."""

    loss: Tensor  # unweighted row losses
    nll: Tensor  # plain softmax cross-entropy of the same logits
    classes: Tensor | None  # (B, k + 1): the top k, then the target (which may repeat one of them)
    grad: Tensor | None  # (B, k + 1): the gradient w.r.t. the logits of those classes (repeats add up)


class Rows(NamedTuple):
    """Targets prepared for gathering: ignored rows point at class 0 and have ``valid`` False."""

    target: Tensor
    valid: Tensor


def compute_dtype(tensor: Tensor) -> torch.dtype:
    """float64 stays float64 (for gradcheck); every other float dtype is computed in float32."""
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32


def check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def check_range(name: str, value: float, low: float, high: float) -> None:
    if not (low <= value <= high):
        raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}")


def check_logits(logits: Tensor) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape (N, V), got {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got {logits.dtype}")


def prepare_rows(logits: Tensor, target: Tensor, ignore_index: int | None, reduction: str) -> Rows:
    """Validate ``logits (N, V)`` / ``target (N,)`` and split off the ignored rows.

    Ignored rows are handled here, before any top-k or softmax statistic, so that padding never
    influences a loss; their target is replaced by 0 so that ``gather`` stays in range.
    """
    check_logits(logits)
    check_reduction(reduction)
    return prepare_targets(target, logits.shape[0], logits.shape[1], ignore_index, f"logits {tuple(logits.shape)}")


def prepare_targets(target: Tensor, rows: int, num_classes: int, ignore_index: int | None, scores: str) -> Rows:
    """``prepare_rows`` for ``rows`` rows of ``num_classes`` scores, described as ``scores`` in errors."""
    if target.dim() != 1 or target.shape[0] != rows:
        raise ValueError(f"target must have shape (N,) = ({rows},) to match {scores}, got {tuple(target.shape)}")
    if target.dtype == torch.bool or target.is_floating_point() or target.is_complex():
        raise ValueError(f"target must be an integer tensor of class indices, got {target.dtype}")
    target = target.long()
    valid = target != ignore_index if ignore_index is not None else torch.ones_like(target, dtype=torch.bool)
    safe = torch.where(valid, target, torch.zeros_like(target))
    if valid.any() and bool(((safe < 0) | (safe >= num_classes)).any()):
        bad = safe[(safe < 0) | (safe >= num_classes)][0].item()
        raise ValueError(f"target contains class {bad}, outside [0, {num_classes}) (ignore_index={ignore_index})")
    return Rows(safe, valid)


def check_multilabel(logits: Tensor, labels: Tensor, reduction: str) -> Tensor:
    """Validate multi-hot ``labels (N, V)`` and return them as a bool mask."""
    check_logits(logits)
    check_reduction(reduction)
    if labels.shape != logits.shape:
        raise ValueError(f"labels must have the shape of logits {tuple(logits.shape)}, got {tuple(labels.shape)}")
    if labels.dtype != torch.bool:
        if bool(((labels != 0) & (labels != 1)).any()):
            raise ValueError("labels must be multi-hot: every entry 0 or 1")
        labels = labels != 0
    return labels


def exp_shifted_(z: Tensor, top: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Overwrite each row of ``z`` with ``exp(z - max z)``; return the row maxima (``top``, when the caller
    knows them already) and the rows' sums of the result, both ``(B, 1)``: logsumexp = max + log sum,
    softmax = z / sum.

    In place and without a temporary the size of ``z``: the block loops call it on large blocks.
    """
    if top is None:
        top = z.amax(dim=-1, keepdim=True)
    return top, z.sub_(top).exp_().sum(dim=-1, keepdim=True)


def row_weights(valid: Tensor, reduction: str, dtype: torch.dtype) -> Tensor:
    """Each row's weight in the reduced loss: 0 for ignored rows, 1 (sum, none) or 1/rows (mean)."""
    weight = valid.to(dtype)
    return weight / valid.sum() if reduction == "mean" else weight


def reduce_rows(row_loss: Tensor, valid: Tensor | None, reduction: str) -> Tensor:
    """Zero the ignored rows, then reduce like ``F.cross_entropy`` (mean = over non-ignored rows)."""
    if valid is not None:
        row_loss = torch.where(valid, row_loss, torch.zeros_like(row_loss))
    if reduction == "none":
        return row_loss
    if reduction == "sum":
        return row_loss.sum()
    count = valid.sum() if valid is not None else row_loss.new_tensor(row_loss.shape[0])
    return row_loss.sum() / count
