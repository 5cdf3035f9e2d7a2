"""Taylor softmax and soft-margin Taylor softmax (Banerjee et al. 2021).

``f_n(z) = Σ_{i≤n} z^i / i!`` is positive for even n, so ``p = f_n(z) / Σ f_n`` is a distribution.
It is not shift-invariant (no max subtraction possible), so it is always computed in float32 or
float64. Every computation is per row; the official TF code normalises over the whole batch, a bug.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ._common import compute_dtype, prepare_rows, reduce_rows

GRADIENTS = ("exact", "inf")


def taylor_expansion(z: Tensor, order: int) -> Tensor:
    """``Σ_{i=0..order} z^i / i!`` by Horner's rule."""
    f = torch.ones_like(z)
    for i in range(order, 0, -1):
        f = 1 + z * f / i
    return f


def _check_order(order: int) -> None:
    if int(order) != order or order < 2 or order % 2:
        raise ValueError(f"Taylor order must be an even integer >= 2 (odd orders go negative), got {order!r}")


class _GradientIsPMinusY(torch.autograd.Function):
    """Pass the row losses through unchanged; their gradient w.r.t. z is ``p - onehot(t)``.

    This is the gradient of the order→∞ limit ("Taylor_inf" in the paper), not of the loss itself.
    """

    @staticmethod
    def forward(ctx, z: Tensor, row_loss: Tensor, p_minus_y: Tensor):
        ctx.save_for_backward(p_minus_y)
        return row_loss.clone()

    @staticmethod
    def backward(ctx, grad_rows: Tensor):
        (p_minus_y,) = ctx.saved_tensors
        return p_minus_y * grad_rows[:, None], None, None


def taylor_softmax_loss(
    logits: Tensor,
    target: Tensor,
    order: int = 2,
    gradient: str = "exact",
    ignore_index: int | None = None,
    reduction: str = "sum",
) -> Tensor:
    """``-log(f_n(z_t) / Σ_j f_n(z_j))``; ``gradient="inf"`` back-propagates ``p - y`` instead."""
    rows = prepare_rows(logits, target, ignore_index, reduction)
    _check_order(order)
    if gradient not in GRADIENTS:
        raise ValueError(f"gradient must be one of {GRADIENTS}, got {gradient!r}")
    z = logits.to(compute_dtype(logits))
    f = taylor_expansion(z, order)
    total = f.sum(dim=-1)
    row_loss = total.log() - f.gather(1, rows.target[:, None]).squeeze(1).log()
    if gradient == "inf":
        with torch.no_grad():
            p_minus_y = (f / total[:, None]).scatter_add_(1, rows.target[:, None], -torch.ones_like(total)[:, None])
        row_loss = _GradientIsPMinusY.apply(z, row_loss.detach(), p_minus_y)
    return reduce_rows(row_loss, rows.valid, reduction)


def sm_taylor_softmax_loss(
    logits: Tensor,
    target: Tensor,
    order: int = 2,
    margin: float = 0.0,
    ignore_index: int | None = None,
    reduction: str = "sum",
) -> Tensor:
    """Soft-margin Taylor softmax: the SM formula with ``f_n`` in place of exp.

    The target term is ``f_n(z_t) / f_n(m)``, as the official implementation computes it (the Taylor
    analogue of ``e^{z_t} / e^{m}``; note ``f_n(z_t - m) ≠ f_n(z_t) / f_n(m)``).
    """
    rows = prepare_rows(logits, target, ignore_index, reduction)
    _check_order(order)
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin!r}")
    z = logits.to(compute_dtype(logits))
    f = taylor_expansion(z, order)
    f_t = f.gather(1, rows.target[:, None]).squeeze(1)
    target_term = f_t / taylor_expansion(z.new_tensor(float(margin)), order)
    row_loss = (f.sum(dim=-1) - f_t + target_term).log() - target_term.log()
    return reduce_rows(row_loss, rows.valid, reduction)
