"""AS rows that keep few classes handing their gradient over as (class, value) pairs, outside the package until a
GPU has timed it: promoted into the fused output layer if it beats the dense products there, deleted if not
(``tools/kernel_tuning.py`` times both, ``tools/kernel_compile.py`` compiles the kernel).

On a GPU the fused layer scores a block of as_softmax logits with the AS row kernel and gives every row with a
gradient the two dense products, even a row that keeps 2 of V classes (a sparse row), whose share of the products
costs the same as a dense row's. Here the AS kernel writes a row that keeps at most ``cap`` classes as its kept
classes and their gradient values instead of its gradient row (a masked row writes nothing), and the Sparse-softmax
layer's backward kernels turn those pairs into the gradients of the features and the weight, touching only those
classes' weight rows; the products take the rows that keep more. A row's unused pairs carry the value 0, which the
backward adds as nothing.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from sparse_softmax.losses.as_softmax_triton import _gradient_block, _score_row, block_for
from sparse_softmax.losses.dispatch import Tiles
from sparse_softmax.losses.output_layer import _Gradients, _logit_blocks


@triton.jit
def _as_softmax_row_pairs(z_ptr, z_stride, target_ptr, weight_ptr, delta, loss_ptr, nll_ptr, kept_ptr, grad_ptr,
                          grad_stride, classes_ptr, values_ptr, V, CAP: tl.constexpr, ALL_KEPT: tl.constexpr,
                          BLOCK: tl.constexpr):
    """The product's AS row kernel with its gradient: a row that keeps 2 to ``CAP`` classes writes them as pairs
    (in column order), a masked row nothing, the others their gradient rows."""
    row, z_row, target, top, cutoff, kept_mass, kept = _score_row(z_ptr, z_stride, target_ptr, delta, loss_ptr,
                                                                   nll_ptr, kept_ptr, V, ALL_KEPT, BLOCK)
    weight = tl.load(weight_ptr + row).to(tl.float32)
    as_pairs = kept <= CAP
    if (kept > 1) | ~as_pairs:
        written = tl.zeros([], tl.int32)  # pairs written so far
        for start in tl.range(0, V, BLOCK):
            g, keep, inside = _gradient_block(z_row, start, V, target, top, cutoff, kept_mass, weight, BLOCK)
            cols = start + tl.arange(0, BLOCK)
            if as_pairs:
                at = row * CAP + written + tl.cumsum(keep.to(tl.int32), axis=0) - 1
                tl.store(classes_ptr + at, cols, mask=keep)
                tl.store(values_ptr + at, g, mask=keep)
                written += tl.sum(keep.to(tl.int32), axis=0)
            else:
                tl.store(grad_ptr + row * grad_stride + cols, g.to(grad_ptr.dtype.element_ty), mask=inside)


class KeptPairs(NamedTuple):
    """Each row's kept count, and for a row that keeps 2 to ``cap`` classes its first ``kept`` (class, value)
    pairs; the others' pairs are (0, 0)."""

    kept: Tensor  # (n,) int32
    classes: Tensor  # (n, cap) int64
    values: Tensor  # (n, cap) float32

    @staticmethod
    def empty(n: int, cap: int, device: torch.device) -> "KeptPairs":
        return KeptPairs(torch.empty(n, dtype=torch.int32, device=device),
                         torch.zeros(n, cap, dtype=torch.int64, device=device),
                         torch.zeros(n, cap, dtype=torch.float32, device=device))


def as_softmax_rows_pairs_triton(logits: Tensor, target: Tensor, weight: Tensor, delta: float, pairs: KeptPairs,
                                 tiles: Tiles = Tiles()):
    """``as_softmax_rows_triton(..., want_grad=True, in_place=True)`` on contiguous ``logits (n, V)``, with the
    gradient of a row that keeps at most ``pairs.classes.shape[1]`` classes written to ``pairs`` instead of its
    row. Returns the row losses, nll, masked and dense flags, and the gradient (the logits' buffer)."""
    n, v = logits.shape
    row_loss = torch.empty(n, dtype=torch.float32, device=logits.device)
    nll = torch.empty_like(row_loss)
    if n:
        _as_softmax_row_pairs[(n,)](
            z_ptr=logits, z_stride=logits.stride(0), target_ptr=target, weight_ptr=weight, delta=float(delta),
            loss_ptr=row_loss, nll_ptr=nll, kept_ptr=pairs.kept, grad_ptr=logits, grad_stride=logits.stride(0),
            classes_ptr=pairs.classes, values_ptr=pairs.values, V=v, CAP=pairs.classes.shape[1],
            ALL_KEPT=delta >= 1.0, BLOCK=block_for(v, tiles.as_block), num_warps=tiles.as_warps)
    return row_loss, nll, pairs.kept == 1, pairs.kept == v, logits


def fused_as_softmax_by_pairs(hidden: Tensor, weight: Tensor, target: Tensor, delta: float, cap: int,
                              bias: Tensor | None = None, tiles: Tiles = Tiles()
                              ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The fused layer's as_softmax, summed over every row of ``hidden (N, H)``, with its few-class rows as pairs:
    (loss, dL/dhidden, dL/dweight, dL/dbias), the gradients in float32, computed in this one pass (GPU, or the CPU
    in Triton's interpreter)."""
    n = hidden.shape[0]
    rows = torch.arange(n, device=hidden.device)
    ones = torch.ones(n, dtype=torch.float32, device=hidden.device)
    grads = _Gradients(hidden, weight, bias, torch.float32)
    loss = hidden.new_zeros((), dtype=torch.float32)
    pairs = KeptPairs.empty(n, cap, hidden.device)
    for done, ids, h, z in _logit_blocks(hidden, weight, bias, rows, hidden.dtype, tiles):
        few = KeptPairs(*(part[done] for part in pairs))
        row_loss, _, _, _, grad = as_softmax_rows_pairs_triton(z, target[done], ones[done], delta, few, tiles)
        loss += row_loss.sum()
        grads.live_rows(ids, h, grad, few.kept > cap)
        some = ((few.kept > 1) & (few.kept <= cap)).nonzero().squeeze(1)  # the rows that keep 2 to cap classes
        if some.numel():
            grads.pairs(hidden, ids[some], few.classes[some], few.values[some], tiles)
    return loss, grads.grad_hidden, grads.grad_weight, grads.grad_bias
