"""AS-Softmax rows as one Triton kernel: the GPU path of ``as_softmax_rows``.

On a GPU the block loop of ``as_softmax_rows`` is bound by memory traffic: each block is copied to
float32 and swept by some ten elementwise and reduction kernels, several times ``F.cross_entropy``'s time
(benchmarks/results/gpu_h100.md). Here one program scores one row in three
sweeps over its logits, all arithmetic in float32 registers: (1) the running maximum M and
Σ e with e = exp(z - M); (2) with the cutoff ``e_t - δ·Σe`` (class i is dropped when
``e_i < e_t - δ·Σe``, i.e. ``p_t - p_i > δ``, the same test as ``as_softmax_chunk``) the kept mass
Σ_kept e and the kept count; (3) the weighted gradient ``w·(e/Σ_kept e on kept classes - onehot(t))``,
written once in the logits' dtype. A row is 256 KB in bf16 at V = 128k, so the second and third sweeps
mostly read what the first left in L2. Where the cutoff is at most 0 (p_t ≤ δ: a dense row, as every row is
early in training; always with δ ≥ 1, the fused layer's cross_entropy) every class is kept and Σ_kept e = Σ e:
the second sweep is skipped.

Masked rows (the target alone is kept) get loss 0 and gradient exactly 0, as in the PyTorch path.
Float64 logits stay on the PyTorch path (the kernel computes in float32).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .dispatch import Tiles
from .triton_helpers import online_lse


@triton.jit
def _score_row(z_ptr, z_stride, target_ptr, delta, loss_ptr, nll_ptr, kept_ptr, V, ALL_KEPT: tl.constexpr,
               BLOCK: tl.constexpr):
    """Sweeps (1) and (2) of this program's row, whose loss, nll and kept count it stores. Returns the row, its
    logits, target, maximum ``top``, cutoff and kept mass Σ_kept e, for the gradient's sweep."""
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * z_stride
    target = tl.load(target_ptr + row)
    z_t = tl.load(z_row + target).to(tl.float32)
    cols = tl.arange(0, BLOCK)
    # (1) per-lane running maximum and sum of exp(z - max), merged at the end (online softmax)
    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_sum = tl.zeros([BLOCK], tl.float32)
    for start in tl.range(0, V, BLOCK):
        z = tl.load(z_row + start + cols, mask=start + cols < V, other=float("-inf")).to(tl.float32)
        lane_max, lane_sum = online_lse(lane_max, lane_sum, z)
    top = tl.max(lane_max, axis=0)
    total = tl.sum(lane_sum * tl.exp(lane_max - top), axis=0)
    cutoff = tl.exp(z_t - top) - delta * total

    # (2) the kept classes' mass and count. A cutoff of at most 0 (p_t ≤ δ) keeps every class (e ≥ 0): no
    # sweep. With δ ≥ 1 (cross_entropy) that holds exactly, so the cutoff is made -inf, not left to rounding.
    if ALL_KEPT:
        cutoff = float("-inf")
    kept_mass = total
    kept = V + tl.zeros([], tl.int32)
    if cutoff > 0:
        kept_sum = tl.zeros([BLOCK], tl.float32)
        kept_count = tl.zeros([BLOCK], tl.int32)
        for start in tl.range(0, V, BLOCK):
            inside = start + cols < V
            e = tl.exp(tl.load(z_row + start + cols, mask=inside, other=float("-inf")).to(tl.float32) - top)
            keep = inside & (e >= cutoff)
            kept_sum += tl.where(keep, e, 0.0)
            kept_count += keep.to(tl.int32)
        kept_mass = tl.sum(kept_sum, axis=0)
        kept = tl.sum(kept_count, axis=0)
    tl.store(loss_ptr + row, tl.where(kept == 1, 0.0, tl.log(kept_mass) - (z_t - top)))
    tl.store(nll_ptr + row, tl.log(total) - (z_t - top))
    tl.store(kept_ptr + row, kept)
    return row, z_row, target, top, cutoff, kept_mass, kept


@triton.jit
def _gradient_block(z_row, start, V, target, top, cutoff, kept_mass, weight, BLOCK: tl.constexpr):
    """Sweep (3) at the block of columns from ``start``: the weighted gradient ``w·(e/Σ_kept e on kept classes -
    onehot(t))``, which columns are kept and which are inside the row. e / Σ_kept e, not e times its inverse: on a
    masked row Σ_kept e = e_t, so the target's entry is exactly 1 - 1 and the whole row exactly 0."""
    cols = start + tl.arange(0, BLOCK)
    inside = cols < V
    e = tl.exp(tl.load(z_row + cols, mask=inside, other=float("-inf")).to(tl.float32) - top)
    keep = inside & (e >= cutoff)
    g = (tl.where(keep, e / kept_mass, 0.0) - tl.where(cols == target, 1.0, 0.0)) * weight
    return g, keep, inside


@triton.jit
def _as_softmax_row(z_ptr, z_stride, target_ptr, weight_ptr, delta, loss_ptr, nll_ptr, kept_ptr, grad_ptr,
                    grad_stride, V, WANT_GRAD: tl.constexpr, ALL_KEPT: tl.constexpr, BLOCK: tl.constexpr):
    # (no name is bound twice: Triton's compiler, unlike its interpreter, refuses a name of two types, even `_`)
    row, z_row, target, top, cutoff, kept_mass, kept = _score_row(z_ptr, z_stride, target_ptr, delta, loss_ptr,
                                                                   nll_ptr, kept_ptr, V, ALL_KEPT, BLOCK)
    if WANT_GRAD:
        weight = tl.load(weight_ptr + row).to(tl.float32)
        for start in tl.range(0, V, BLOCK):
            g, keep, inside = _gradient_block(z_row, start, V, target, top, cutoff, kept_mass, weight, BLOCK)
            tl.store(grad_ptr + row * grad_stride + start + tl.arange(0, BLOCK), g.to(grad_ptr.dtype.element_ty),
                     mask=inside)


def as_softmax_rows_triton(logits: Tensor, target: Tensor, weight: Tensor | None, delta: float, want_grad: bool,
                           in_place: bool = False, tiles: Tiles = Tiles()):
    """``as_softmax_rows`` by the AS row kernel, one program a row.

    Args:
        logits: (N, V) float32/bfloat16/float16 on a GPU (or the CPU under ``TRITON_INTERPRET=1``).
        target: (N,) int64 classes.
        weight: (N,) each row's weight in the loss whose gradient is asked for (only read with ``want_grad``).
        delta: AS-Softmax's δ; at 1 no class is dropped (cross_entropy).
        want_grad: also write the gradient of ``Σ weight · loss``.
        in_place: write the gradient over the (contiguous) logits: each program reads a block of its row before
            it writes the block's gradient, and no program reads another's row.
        tiles: ``as_block`` and ``as_warps`` are read.

    Returns:
        (row losses, nll, masked, dense): (N,) float32, float32, bool (only the target kept), bool (every class
        kept); and the (N, V) gradient in the logits' dtype, or None.
    """
    n, v = logits.shape
    if logits.stride(1) != 1:
        if in_place:
            raise ValueError("in_place needs logits with contiguous rows")
        logits = logits.contiguous()
    row_loss = torch.empty(n, dtype=torch.float32, device=logits.device)
    nll = torch.empty_like(row_loss)
    kept = torch.empty(n, dtype=torch.int32, device=logits.device)
    grad = (logits if in_place else torch.empty_like(logits)) if want_grad else None
    if n:
        _as_softmax_row[(n,)](
            z_ptr=logits, z_stride=logits.stride(0), target_ptr=target, weight_ptr=weight if want_grad else None,
            delta=float(delta), loss_ptr=row_loss, nll_ptr=nll, kept_ptr=kept, grad_ptr=grad,
            grad_stride=logits.stride(0) if grad is None else grad.stride(0), V=v, WANT_GRAD=want_grad,
            ALL_KEPT=delta >= 1.0, BLOCK=block_for(v, tiles.as_block), num_warps=tiles.as_warps)
    return row_loss, nll, kept == 1, kept == v, grad


def block_for(v: int, block: int) -> int:
    """The logits a program loads at once from a row of ``v``: ``block``, fewer for a short row."""
    return min(block, triton.next_power_of_2(v))
