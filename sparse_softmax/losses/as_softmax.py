"""AS-Softmax (Adaptive Sparse Softmax, Lv et al.): drop the classes the target already beats by δ.

With p = softmax(z) over all V classes (treated as a constant: no gradient flows through the mask),
class i ≠ t is dropped when ``p_t - p_i > δ`` (strict); the target is always kept and the loss is the
cross-entropy over the kept classes. δ = 1 is plain softmax cross-entropy. A row whose only kept class
is the target has loss 0 and gradient 0: a *masked sample* (what AS-Speed counts).

``as_softmax_chunk`` does the math for a block of rows and writes the gradient ``keep·p/S - onehot(t)``
into the block's own buffer. Two drivers share it: ``as_softmax_rows`` walks logits in cache-sized
blocks (a thin ``autograd.Function`` around it hands the gradient it wrote on to backward, or scales
it), and ``fused_output_loss`` (``output_layer.py``) computes each block from decoder features. That
avoids the dense probability, mask and masked-logit tensors a composition of torch ops would keep
alive, and makes the loss about as fast as ``F.cross_entropy`` (see benchmarks/loss_speed.py).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ._common import LossResult, check_range, compute_dtype, exp_shifted_, prepare_rows, row_weights
from .dispatch import TRITON, Tiles, check_impl, use_triton

if TRITON:
    from .as_softmax_triton import as_softmax_rows_triton


class ASChunk(NamedTuple):
    """One block of rows scored by AS-Softmax; per-row tensors have shape ``(B,)``."""

    loss: Tensor  # unweighted row losses (0 on masked rows)
    nll: Tensor  # plain softmax cross-entropy of the same logits
    masked: Tensor  # bool: the target is the only kept class (loss and gradient 0)
    kept: Tensor  # how many classes each row keeps (V: every class, a dense gradient)
    dropped: Tensor  # (B, V) bool: the classes the loss leaves out
    grad: Tensor | None  # (B, V) unweighted gradient w.r.t. the logits, in the logits' buffer


def as_softmax_chunk(z: Tensor, target: Tensor, delta: float, want_grad: bool) -> ASChunk:
    """Score logits ``z (B, V)`` (float32/64, overwritten) against ``target (B,)``; works in ``z``'s buffer.

    With ``e = exp(z - max z)`` and ``Σe`` its row sum, class i is dropped when ``e_i < e_t - δ·Σe``
    (``p_t - p_i > δ``), the loss is ``log Σ_kept e - log e_t`` and its gradient ``e/Σ_kept e - onehot(t)``
    on the kept classes: the probabilities are never normalised, which saves a pass over the block.
    """
    t = target[:, None]
    z_t = z.gather(1, t)
    top, total = exp_shifted_(z)
    e, log_e_t = z, z_t - top  # z's buffer now holds e
    dropped = e.lt(e.gather(1, t) - delta * total)
    kept = e.shape[1] - torch.count_nonzero(dropped, dim=-1)
    kept_mass = e.masked_fill_(dropped, 0.0).sum(dim=-1, keepdim=True)
    masked = kept == 1
    # A masked row's loss is exactly 0 (log Σ_kept e - log e_t would leave rounding noise).
    loss = torch.where(masked, 0.0, (kept_mass.log() - log_e_t).squeeze(1))
    grad = None
    if want_grad:
        grad = e.div_(kept_mass)
        grad.scatter_add_(1, t, torch.full_like(z_t, -1.0))
    return ASChunk(loss, (total.log() - log_e_t).squeeze(1), masked, kept, dropped, grad)


def as_softmax_rows(logits: Tensor, target: Tensor, weight: Tensor, delta: float, want_grad: bool,
                    impl: str = "auto", tiles: Tiles = Tiles()):
    """Row losses, nll, masked and dense (every class kept) flags of ``logits (N, V)``, block by block,
    and the gradient of ``Σ weight · loss`` w.r.t. the logits when ``want_grad``. On a GPU one Triton
    kernel does it (``as_softmax_triton.py``); ``impl`` and ``tiles`` as ``as_softmax``'s."""
    if use_triton(logits, impl):
        return as_softmax_rows_triton(logits, target, weight, delta, want_grad, tiles=tiles)
    n, v = logits.shape
    dtype = compute_dtype(logits)
    grad = torch.empty_like(logits) if want_grad else None
    row_loss = torch.empty(n, dtype=dtype, device=logits.device)
    nll = torch.empty_like(row_loss)
    masked = torch.empty(n, dtype=torch.bool, device=logits.device)
    dense = torch.empty_like(masked)
    step = tiles.rows(logits.device, v, fused=False)
    buffer = torch.empty(min(step, n), v, dtype=dtype, device=logits.device)  # one block's logits, reused
    for start in range(0, n, step):
        end = min(n, start + step)
        z = buffer[: end - start].copy_(logits[start:end])
        chunk = as_softmax_chunk(z, target[start:end], delta, want_grad)
        row_loss[start:end], nll[start:end], masked[start:end] = chunk.loss, chunk.nll, chunk.masked
        dense[start:end] = chunk.kept == v
        if want_grad:
            grad[start:end] = chunk.grad.mul_(weight[start:end, None])
    return row_loss, nll, masked, dense, grad


class _ASSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, weight: Tensor, delta: float, per_row: bool, impl: str,
                tiles: Tiles):
        """(weighted loss, row nll, masked, dense); the gradient is computed here, backward scales it."""
        row_loss, nll, masked, dense, grad = as_softmax_rows(logits, target, weight, delta, ctx.needs_input_grad[0],
                                                             impl, tiles)
        ctx.per_row = per_row
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(nll, masked, dense)
        loss = row_loss * weight
        return (loss if per_row else loss.sum()), nll, masked, dense

    @staticmethod
    def backward(ctx, grad_loss: Tensor, *_unused):
        (grad,) = ctx.saved_tensors
        if ctx.per_row:
            grad = grad * grad_loss.to(grad.dtype)[:, None]
        # The common case (loss.backward() on the summed loss) returns the precomputed buffer as is;
        # it is never modified in place, so repeated backward passes stay correct.
        elif not (grad_loss.numel() == 1 and float(grad_loss) == 1.0):
            grad = grad * grad_loss.to(grad.dtype)
        return grad, None, None, None, None, None, None


def as_softmax(logits: Tensor, target: Tensor, delta: float, ignore_index: int | None = None,
               reduction: str = "sum", *, impl: str = "auto", tiles: Tiles = Tiles()) -> LossResult:
    """AS-Softmax loss with the plain CE and the masked and dense row counts, from one pass over the logits.

    Args:
        logits: (N, V) scores, any float dtype (computed in float32; float64 in float64).
        target: (N,) integer classes; rows equal to ``ignore_index`` count for nothing.
        delta: δ in [0, 1]: class i is dropped when ``p_t - p_i > δ``.
        ignore_index, reduction: as ``F.cross_entropy``'s ("sum", "mean" over counted rows, "none").
        impl: "auto", "torch" or "triton" (``dispatch.use_triton``): on a GPU one Triton kernel scores a row in
            float32 registers, with no float32 copy of the logits.
        tiles: the sizes of the blocks of rows (PyTorch) or of the kernel's loads (``dispatch.Tiles``).

    Returns:
        ``LossResult``: the loss and plain nll, reduced (scalars, or (N,) with "none"), and the counted rows that
        are masked (only the target kept) and dense (every class kept).
    """
    rows = prepare_rows(logits, target, ignore_index, reduction)
    check_range("delta", delta, 0.0, 1.0)
    check_impl(impl)
    weight = row_weights(rows.valid, reduction, compute_dtype(logits))
    loss, nll, masked, dense = _ASSoftmax.apply(logits, rows.target, weight, float(delta), reduction == "none",
                                                impl, tiles)
    nll = torch.where(rows.valid, nll * weight, torch.zeros_like(nll))
    return LossResult(loss, nll if reduction == "none" else nll.sum(), (masked & rows.valid).sum(),
                      (dense & rows.valid).sum())


def as_softmax_loss(logits: Tensor, target: Tensor, delta: float, ignore_index: int | None = None,
                    reduction: str = "sum", *, impl: str = "auto", tiles: Tiles = Tiles()) -> Tensor:
    """AS-Softmax cross-entropy: ``as_softmax``'s loss (which gives the counts the criterion logs too)."""
    return as_softmax(logits, target, delta, ignore_index, reduction, impl=impl, tiles=tiles).loss
