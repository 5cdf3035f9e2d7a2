"""AS-Softmax (Adaptive Sparse Softmax, Lv et al.): drop the classes the target already beats by δ.

With p = softmax(z) over all V classes (treated as a constant: no gradient flows through the mask),
class i ≠ t is dropped when ``p_t - p_i > δ`` (strict); the target is always kept and the loss is the
cross-entropy over the kept classes. δ = 1 is plain softmax cross-entropy. A row whose only kept class
is the target has loss 0 and gradient 0: a *masked sample* (what AS-Speed counts).

The work is one ``autograd.Function`` that walks the rows in cache-sized chunks and writes the
gradient ``keep·p/S - onehot(t)`` during the forward pass, so backward only scales it. That avoids the
dense probability, mask and masked-logit tensors a composition of torch ops would keep alive, and
makes the loss about as fast as ``F.cross_entropy`` (see benchmarks/loss_speed.py).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ._common import check_range, compute_dtype, prepare_rows

# Elements per chunk: ~4 MB of float32 on CPU keeps a chunk in cache; on accelerators fewer, larger
# chunks amortise kernel launches.
_CHUNK_ELEMENTS = {"cpu": 1 << 20}
_DEFAULT_CHUNK_ELEMENTS = 1 << 24


class ASSoftmaxOutput(NamedTuple):
    """The reduced loss plus what the criterion logs, computed in the same pass."""

    loss: Tensor  # reduced as requested; differentiable
    n_masked: Tensor  # int64 scalar: non-ignored rows whose only kept class is the target
    nll: Tensor  # plain softmax cross-entropy of the same logits, same reduction, no gradient


class _ASSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, weight: Tensor, delta: float, per_row: bool):
        """Return (loss, masked, nll) with per-row ``weight`` applied; see ``as_softmax``."""
        n, v = logits.shape
        dtype = compute_dtype(logits)
        want_grad = ctx.needs_input_grad[0]
        grad = torch.empty_like(logits) if want_grad else None
        row_loss = torch.empty(n, dtype=dtype, device=logits.device)
        nll = torch.empty(n, dtype=dtype, device=logits.device)
        masked = torch.empty(n, dtype=torch.bool, device=logits.device)
        step = max(1, _CHUNK_ELEMENTS.get(logits.device.type, _DEFAULT_CHUNK_ELEMENTS) // v)
        for start in range(0, n, step):
            end = min(n, start + step)
            t = target[start:end, None]
            z = logits[start:end].to(dtype, copy=True)
            lse = torch.logsumexp(z, dim=-1, keepdim=True)
            log_p_t = z.gather(1, t) - lse
            p = z.sub_(lse).exp_()
            keep = (p.gather(1, t) - p) <= delta
            p.mul_(keep)
            kept_mass = p.sum(dim=-1, keepdim=True)
            only_target = keep.sum(dim=-1) == 1
            masked[start:end] = only_target
            nll[start:end] = -log_p_t.squeeze(1)
            # A masked row's loss is exactly 0 (log S - log p_t would leave rounding noise).
            row_loss[start:end] = torch.where(only_target, 0.0, (kept_mass.log() - log_p_t).squeeze(1))
            if want_grad:
                g = p.div_(kept_mass)
                g.scatter_add_(1, t, torch.full_like(log_p_t, -1.0))
                grad[start:end] = g.mul_(weight[start:end, None])
        loss = row_loss * weight if per_row else (row_loss * weight).sum()
        ctx.per_row = per_row
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(masked, nll)
        return loss, masked, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_masked, _grad_nll):
        (grad,) = ctx.saved_tensors
        if ctx.per_row:
            return grad * grad_loss.to(grad.dtype)[:, None], None, None, None, None
        # The common case (loss.backward() on the summed loss) returns the precomputed buffer as is;
        # it is never modified in place, so repeated backward passes stay correct.
        if grad_loss.numel() == 1 and float(grad_loss) == 1.0:
            return grad, None, None, None, None
        return grad * grad_loss.to(grad.dtype), None, None, None, None


def as_softmax(
    logits: Tensor,
    target: Tensor,
    delta: float,
    ignore_index: int | None = None,
    reduction: str = "sum",
) -> ASSoftmaxOutput:
    """AS-Softmax loss with the masked-row count and the plain CE, from one pass over the logits."""
    rows = prepare_rows(logits, target, ignore_index, reduction)
    check_range("delta", delta, 0.0, 1.0)
    valid = rows.valid
    weight = valid.to(compute_dtype(logits))
    if reduction == "mean":
        weight = weight / valid.sum()
    loss, masked, nll = _ASSoftmax.apply(logits, rows.target, weight, float(delta), reduction == "none")
    nll = torch.where(valid, nll * weight, torch.zeros_like(nll))
    return ASSoftmaxOutput(loss, (masked & valid).sum(), nll if reduction == "none" else nll.sum())


def as_softmax_loss(
    logits: Tensor,
    target: Tensor,
    delta: float,
    ignore_index: int | None = None,
    reduction: str = "sum",
    return_masked: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """AS-Softmax cross-entropy; with ``return_masked`` also the number of masked rows (int64 tensor)."""
    out = as_softmax(logits, target, delta, ignore_index, reduction)
    return (out.loss, out.n_masked) if return_masked else out.loss
