"""The backward of the fused output layer's Sparse-softmax path on a GPU: from the logits' gradient as (class,
value) pairs, k + 1 a row (``sparse_softmax_triton``'s row kernel hands them over), to the gradients of the
features and the weight, O(N·k·H) where the dense backward costs two N×V×H products.

dL/dh of a row sums its pairs' weight rows, ``Σ_j g_j W[c_j]``, gathered ``Tiles.piece_block`` pairs at a time. The
weight's gradient is a scatter: row c of dL/dW sums g·h over the pairs of class c. By default each program adds
its row's pairs with atomic adds, N·(k+1)·H of them in whatever order the GPU runs them; under
``torch.use_deterministic_algorithms(True)`` the pairs are sorted by class instead and each class's sum is taken
by one program in a fixed order and added once: deterministic, and without atomics. A frequent class (a common
word in every row's top k) is split into pieces of ``Tiles.piece`` pairs, so that no program sums a batch's worth of
rows alone; a second launch adds its pieces up.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .dispatch import Tiles


@triton.jit
def _slice(index_ptr, scale_ptr, j0, end, BLOCK_P: tl.constexpr):
    """Entries j0 … j0 + ``BLOCK_P`` of the (index, scale) pairs that end before ``end``: their indices (int64,
    0 past the end), scales (0 past it) and which are taken."""
    j = j0 + tl.arange(0, BLOCK_P)
    taken = j < end
    index = tl.load(index_ptr + j, mask=taken, other=0).to(tl.int64)
    return index, tl.load(scale_ptr + j, mask=taken, other=0.0), taken


@triton.jit
def _gathered_sum(x_ptr, x_stride, index_ptr, scale_ptr, start, end, u, in_h, BLOCK_P: tl.constexpr,
                  BLOCK_H: tl.constexpr):
    """Σ scale[j]·x[index[j]] over j in [start, end) at the ``BLOCK_H`` columns u, in float32, summed in this
    order ``BLOCK_P`` rows at a time: the gather both backward kernels are made of (all of a row's k + 1 weight
    rows at once spilled registers from k = 64 on, 7 KB a thread on sm_90)."""
    s = tl.zeros([BLOCK_H], tl.float32)
    for j0 in tl.range(start, end, BLOCK_P):
        index, scale, taken = _slice(index_ptr, scale_ptr, j0, end, BLOCK_P)
        x = tl.load(x_ptr + index[:, None] * x_stride + u[None, :], mask=taken[:, None] & in_h[None, :],
                    other=0.0).to(tl.float32)
        s += tl.sum(scale[:, None] * x, axis=0)
    return s


@triton.jit
def _sparse_layer_backward(classes_ptr, grad_ptr, rows_ptr, h_ptr, h_stride, w_ptr, w_stride, gh_ptr, gw_ptr, H, PAIRS,
                           BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr, ATOMIC_WEIGHT: tl.constexpr):
    """One program: a counted row's ``BLOCK_H`` hidden units, its ``PAIRS`` pairs. dL/dh[row] = Σ_j g_j W[c_j] is
    stored (a row is counted once); with ``ATOMIC_WEIGHT``,
    dL/dW[c_j] += g_j h[row] is added atomically (a class recurs, across rows and within one when the target is
    among the top k)."""
    i = tl.program_id(0).to(tl.int64)
    u = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    in_h = u < H
    row = tl.load(rows_ptr + i)
    first = i * PAIRS
    end = first + PAIRS
    s = _gathered_sum(w_ptr, w_stride, classes_ptr, grad_ptr, first, end, u, in_h, BLOCK_P, BLOCK_H)
    tl.store(gh_ptr + row * H + u, s, mask=in_h)
    if ATOMIC_WEIGHT:
        h = tl.load(h_ptr + row * h_stride + u, mask=in_h, other=0.0).to(tl.float32)
        for j0 in tl.range(first, end, BLOCK_P):
            classes, g, taken = _slice(classes_ptr, grad_ptr, j0, end, BLOCK_P)
            tl.atomic_add(gw_ptr + classes[:, None] * H + u[None, :], g[:, None] * h[None, :],
                          mask=taken[:, None] & in_h[None, :], sem="relaxed")


@triton.jit
def _sum_pieces(x_ptr, x_stride, index_ptr, scale_ptr, starts_ptr, ends_ptr, out_ptr, out_rows_ptr, part_ptr,
                slots_ptr, H, SPLIT: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr):
    """One program: piece i's ``BLOCK_H`` columns, s = Σ scale[j]·x[index[j]] over j in [starts[i], ends[i]),
    summed in this order. Added to out[out_rows[i]]; or, with ``SPLIT`` and slots[i] ≥ 0 (a piece of a row
    of out split in several), stored in part[slots[i]]. A launch adds to each row of out at most once."""
    i = tl.program_id(0)
    u = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    in_h = u < H
    s = _gathered_sum(x_ptr, x_stride, index_ptr, scale_ptr, tl.load(starts_ptr + i), tl.load(ends_ptr + i), u,
                      in_h, BLOCK_P, BLOCK_H)
    apart = tl.zeros([], tl.int32)  # 1: stored in part, not added to out
    if SPLIT:  # (without it, slots and part are None)
        slot = tl.load(slots_ptr + i)
        apart = (slot >= 0).to(tl.int32)
        if apart != 0:
            tl.store(part_ptr + slot.to(tl.int64) * H + u, s, mask=in_h)
    if apart == 0:
        out = out_ptr + tl.load(out_rows_ptr + i).to(tl.int64) * H + u
        tl.store(out, tl.load(out, mask=in_h) + s, mask=in_h)


def sparse_layer_backward_triton(hidden: Tensor, weight: Tensor, rows: Tensor, classes: Tensor, grad: Tensor,
                                 grad_hidden: Tensor, grad_weight: Tensor, tiles: Tiles = Tiles()) -> None:
    """Add the gradients of the features and the weight that the logit gradient pairs of the counted rows stand
    for; the weight's by sorting under ``torch.use_deterministic_algorithms(True)``, by atomic adds otherwise.

    Args:
        hidden: (N, H) the features; weight: (V, H) the output layer's weight.
        rows: (n,) int64, the rows of ``hidden`` the pairs belong to (each at most once).
        classes, grad: (n, P) int64 classes and float32 values of the logit gradient, row weights applied.
        grad_hidden: (N, H) float32, added to at ``rows`` (the other rows stay as they are).
        grad_weight: (V, H) float32, added to.
        tiles: ``backward_block_h``, ``piece_block`` and ``piece`` are read.
    """
    n, pairs = classes.shape
    h = hidden.shape[1]
    hidden, weight, classes, grad = hidden.contiguous(), weight.contiguous(), classes.contiguous(), grad.contiguous()
    by_sorting = torch.are_deterministic_algorithms_enabled()
    if n:
        _sparse_layer_backward[(n, triton.cdiv(h, tiles.backward_block_h))](
            classes_ptr=classes, grad_ptr=grad, rows_ptr=rows, h_ptr=hidden, h_stride=hidden.stride(0), w_ptr=weight,
            w_stride=weight.stride(0), gh_ptr=grad_hidden, gw_ptr=grad_weight, H=h, PAIRS=pairs,
            BLOCK_P=tiles.piece_block, BLOCK_H=tiles.backward_block_h, ATOMIC_WEIGHT=not by_sorting)
        if by_sorting:
            sorted_weight_gradient(hidden, rows[:, None].expand(n, pairs).flatten(), classes.flatten(), grad.flatten(),
                                   grad_weight, tiles)


def sorted_weight_gradient(hidden: Tensor, pair_rows: Tensor, classes: Tensor, grad: Tensor, grad_weight: Tensor,
                           tiles: Tiles = Tiles()) -> None:
    """Add Σ grad·hidden[pair_rows] over each class's pairs (all 1-D) to its row of ``grad_weight`` without
    atomics: the pairs sorted by class (stably, so the order of a class's pairs is fixed), cut into pieces (a
    class's pairs, at most ``tiles.piece`` of them), each summed by one program; the pieces of a class with more
    pairs are summed apart and then added up by a second launch."""
    h, piece = hidden.shape[1], tiles.piece
    by_class, order = torch.sort(classes.to(torch.int32), stable=True)
    pair_rows, pair_grad = pair_rows[order], grad[order]
    m = order.numel()
    at = torch.arange(m, device=order.device)
    edge = torch.ones(m + 1, dtype=torch.bool, device=order.device)  # a class's pairs begin at j (or j = m)
    edge[1:m] = by_class[1:] != by_class[:-1]
    class_start = torch.cummax(torch.where(edge[:m], at, 0), dim=0).values
    starts = ((at - class_start) % piece == 0).nonzero().squeeze(1)
    ends = torch.cat([starts[1:], at.new_full((1,), m)])
    split = ~(edge[starts] & edge[ends])  # a piece of a class with more than `piece` pairs
    slots = split.cumsum(0) - 1
    # A class of L > piece pairs has fewer than 2·L / piece pieces.
    parts = torch.empty(2 * m // piece, h, dtype=torch.float32, device=hidden.device)
    columns = triton.cdiv(h, tiles.backward_block_h)
    sizes = dict(H=h, BLOCK_P=tiles.piece_block, BLOCK_H=tiles.backward_block_h)
    _sum_pieces[(starts.numel(), columns)](
        x_ptr=hidden, x_stride=hidden.stride(0), index_ptr=pair_rows, scale_ptr=pair_grad, starts_ptr=starts,
        ends_ptr=ends, out_ptr=grad_weight, out_rows_ptr=by_class[starts], part_ptr=parts,
        slots_ptr=torch.where(split, slots, -1), SPLIT=True, **sizes)
    firsts = (split & edge[starts]).nonzero().squeeze(1)  # each split class's first piece
    if firsts.numel():  # each split class: the sum of its pieces' sums, in order
        first = slots[firsts]
        _sum_pieces[(firsts.numel(), columns)](
            x_ptr=parts, x_stride=h, index_ptr=torch.arange(parts.shape[0], device=parts.device),
            scale_ptr=torch.ones(parts.shape[0], device=parts.device), starts_ptr=first,
            ends_ptr=torch.cat([first[1:], slots[-1:] + 1]), out_ptr=grad_weight, out_rows_ptr=by_class[starts[firsts]],
            part_ptr=None, slots_ptr=None, SPLIT=False, **sizes)
