"""Sparse-softmax rows as one Triton kernel: the GPU path of ``sparse_softmax_chunk``.

On a GPU ``torch.topk`` dominates the PyTorch path: a top 10 of a long row by radix passes costs more than all
of ``F.cross_entropy`` (benchmarks/results/gpu_h200.md). Here one program scores one row in a single sweep over its
logits, in float32 registers, with no reduction and no branch inside the loop: each of the BLOCK lanes (the columns
≡ j mod BLOCK) updates its running maximum and Σ exp (for the plain nll, as the AS kernel does), keeps its two
largest logits with their columns, and the largest logit it let go. After the sweep the top K is chosen once from
the 2·BLOCK kept logits (``tl.topk``).

That choice is exact unless a lane let go of a logit above the chosen k-th, i.e. held three of the row's top k
(about C(k, 3) / BLOCK² of rows of random logits), or the row has fewer than k finite logits. Such a row is swept
again in the same program by the merging sweep, which is exact on any row: block by block it merges the logits at
least the running K-th into the row's running top K, inserting them one at a time (a maximum and a replacement
each) or, for a block with more than ``Tiles.insert_limit`` of them in the row, by ``tl.topk`` over the old top
K and the block's.

Value and column travel together as one int64 key, so that ``tl.topk`` (values only) selects both: the
float's bits made order-preserving as a signed int32 in the high half, the column in the low half
(ties go to the higher column; any tie-break is a valid top k).

The output is ``SparseChunk``'s: row losses, nll, and the gradient as k + 1 (class, value) pairs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import SparseChunk
from .dispatch import Tiles
from .triton_helpers import online_lse

LOWEST = tl.constexpr(-0x7FFFFFFFFFFFFFFF - 1)  # below every key (a -inf logit's key included)
HIGHEST = tl.constexpr(0x7FFFFFFFFFFFFFFF)


@triton.jit
def _keys(z, cols):
    """(order-preserving int32 bits of ``z``) << 32 | ``cols``: larger key, larger logit."""
    bits = z.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: flip the magnitude bits
    return (ordered.to(tl.int64) << 32) | cols.to(tl.int64)


@triton.jit
def _unkey(keys):
    """The logits (float32) and columns (int64) of ``keys``."""
    ordered = (keys >> 32).to(tl.int32)
    bits = ordered ^ ((ordered >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True), keys & 0xFFFFFFFF


@triton.jit
def _candidates(z, kth):
    """Which logits of ``z`` (M, B) may enter their rows' top K, whose K-th key is ``kth`` (M,): those at
    least its value (ties decided by the keys later); every one while a row's top K is not full."""
    value, _ = _unkey(kth)
    return z >= tl.where(kth == LOWEST, float("-inf"), value)[:, None]


@triton.jit
def _merge(best, keys, news, INSERT_LIMIT: tl.constexpr):
    """Merge the candidate ``keys`` (M, B; the others LOWEST) into the rows' running top K ``best`` (M, K,
    in no order), ``news`` the most candidates of a row. Returns the new top K and its K-th keys."""
    M: tl.constexpr = best.shape[0]
    K: tl.constexpr = best.shape[1]
    if news > INSERT_LIMIT:
        best = tl.topk(tl.reshape(tl.join(best, tl.topk(keys, K)), [M, 2 * K]), K)
    else:
        slots = tl.arange(0, K)[None, :]
        for _ in range(news):  # the largest candidate of each row replaces the row's K-th, if larger
            top = tl.max(keys, axis=1)
            kth = tl.min(best, axis=1)
            slot = tl.argmin(best, axis=1)
            best = tl.where((slots == slot[:, None]) & (top > kth)[:, None], top[:, None], best)
            keys = tl.where(keys == top[:, None], LOWEST, keys)
    return best, tl.min(best, axis=1)


@triton.jit
def _sweep_lanes(z_row, V, BLOCK: tl.constexpr):
    """One sweep over a row with no reduction and no branch in it: its lanes' maxima and sums, each lane's
    two largest logits with their columns (-1: none yet; -inf logits never enter), and the largest logit
    each lane let go."""
    cols = tl.arange(0, BLOCK)
    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_sum = tl.zeros([BLOCK], tl.float32)
    first_col = tl.full([BLOCK], -1, tl.int32)
    second = tl.full([BLOCK], float("-inf"), tl.float32)
    second_col = tl.full([BLOCK], -1, tl.int32)
    let_go = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in tl.range(0, V, BLOCK):
        z = tl.load(z_row + start + cols, mask=start + cols < V, other=float("-inf")).to(tl.float32)
        above_first, above_second = z > lane_max, z > second
        let_go = tl.maximum(let_go, tl.where(above_second, second, z))
        second = tl.where(above_first, lane_max, tl.where(above_second, z, second))
        second_col = tl.where(above_first, first_col, tl.where(above_second, start + cols, second_col))
        first_col = tl.where(above_first, start + cols, first_col)
        lane_max, lane_sum = online_lse(lane_max, lane_sum, z)
    return lane_max, lane_sum, first_col, second, second_col, let_go


@triton.jit
def _lane_keys(z, cols):
    """``_keys`` of the lanes' kept logits, LOWEST where a lane kept none."""
    return tl.where(cols >= 0, _keys(z, cols), LOWEST)


@triton.jit
def _sweep_merging(z_row, V, K: tl.constexpr, BLOCK: tl.constexpr, INSERT_LIMIT: tl.constexpr):
    """The row's top K keys (1, K), exact, a block's candidates merged into them as the block is read."""
    cols = tl.arange(0, BLOCK)
    best = tl.full([1, K], LOWEST, tl.int64)  # the row's top K, as a block of one row for _merge
    kth = tl.full([1], LOWEST, tl.int64)  # its K-th key: a logit below it cannot enter
    for start in tl.range(0, V, BLOCK):
        inside = start + cols < V
        z = tl.load(z_row + start + cols, mask=inside, other=float("-inf")).to(tl.float32)[None, :]
        candidate = _candidates(z, kth) & inside[None, :]
        news = tl.max(tl.sum(candidate.to(tl.int32), axis=1), axis=0)
        if news > 0:
            best, kth = _merge(best, tl.where(candidate, _keys(z, start + cols[None, :]), LOWEST), news, INSERT_LIMIT)
    return best


@triton.jit
def _row(z_ptr, z_stride, target_ptr):
    """This program's row (as a block of one), its logits, target and target logit."""
    row = tl.program_id(0).to(tl.int64) + tl.arange(0, 1)
    z_row = z_ptr + tl.program_id(0).to(tl.int64) * z_stride
    target = tl.load(target_ptr + row)
    return row, z_row, target, tl.load(z_row + target).to(tl.float32)


@triton.jit
def _sparse_softmax_row(z_ptr, z_stride, target_ptr, k, smoothing, loss_ptr, nll_ptr, classes_ptr, grad_ptr,
                        swept_ptr, V, WANT_GRAD: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr,
                        INSERT_LIMIT: tl.constexpr):
    row, z_row, target, z_t = _row(z_ptr, z_stride, target_ptr)
    lane_max, lane_sum, first_col, second, second_col, let_go = _sweep_lanes(z_row, V, BLOCK)
    kept = tl.reshape(tl.join(_lane_keys(lane_max, first_col), _lane_keys(second, second_col)), [1, 2 * BLOCK])
    best = tl.topk(kept, K)
    kth = tl.min(tl.where(tl.arange(0, K)[None, :] < k, best, HIGHEST), axis=1)
    again = tl.max(((tl.max(let_go, axis=0) > _unkey(kth)[0]) | (kth == LOWEST)).to(tl.int32), axis=0)
    if again > 0:  # a lane may have let one of the top k go, or fewer than k logits are finite
        best = _sweep_merging(z_row, V, K, BLOCK, INSERT_LIMIT)
    if swept_ptr is not None:
        tl.store(swept_ptr + tl.program_id(0), again)
    _finish_row(best, lane_max, lane_sum, z_t, row, target, k, smoothing, loss_ptr, nll_ptr, classes_ptr, grad_ptr,
                WANT_GRAD, K)


@triton.jit
def _finish_row(best, lane_max, lane_sum, z_t, row, target, k, smoothing, loss_ptr, nll_ptr, classes_ptr, grad_ptr,
                WANT_GRAD: tl.constexpr, K: tl.constexpr):
    """Store the loss and nll of ``row`` (a block of one) from its top K keys ``best`` (1, K, in no order), its
    lanes' maxima and sums, and its target logit ``z_t``; with ``WANT_GRAD`` its gradient pairs too: p_j - ε/k on
    the top k (p: the softmax over them), then ε - 1 at the target."""
    top = tl.max(lane_max, axis=0)
    nll = tl.log(tl.sum(lane_sum * tl.exp(lane_max - top), axis=0)) + top - z_t
    values, classes = _unkey(tl.topk(best, K))
    first_k = tl.arange(0, K)[None, :] < k
    values = tl.where(first_k, values, float("-inf"))
    largest = tl.max(values, axis=1)
    lse = tl.log(tl.sum(tl.exp(values - largest[:, None]), axis=1)) + largest
    loss = lse - z_t
    if smoothing > 0:
        mean = tl.sum(tl.where(first_k, values, 0.0), axis=1) / k
        loss = (1.0 - smoothing) * loss + smoothing * (lse - mean)
    tl.store(loss_ptr + row, loss)
    tl.store(nll_ptr + row, nll)
    if WANT_GRAD:
        out = row[:, None] * (k + 1) + tl.arange(0, K)[None, :]
        tl.store(classes_ptr + out, classes, mask=first_k)
        tl.store(grad_ptr + out, tl.exp(values - lse[:, None]) - smoothing / k, mask=first_k)
        tl.store(classes_ptr + row * (k + 1) + k, target.to(tl.int64))
        tl.store(grad_ptr + row * (k + 1) + k, tl.zeros_like(loss) + (smoothing - 1.0))


def block_for(v: int, top: int, block: int) -> int:
    """The logits a program loads at once from a row of ``v``: ``block``, fewer for a short row, never fewer than
    the top k's width ``top`` (a block must hold at least K columns for its top K)."""
    return max(top, min(block, triton.next_power_of_2(v)))


def top_width(k: int) -> int:
    """K, the top k's width in registers: k rounded up to a power of two, at least 2 (``tl.topk``'s)."""
    return max(2, triton.next_power_of_2(k))


def empty_rows(n: int, k: int, device: torch.device, want_grad: bool) -> SparseChunk:
    """The outputs of ``n`` scored rows: float32 losses and nll, and with ``want_grad`` the k + 1 gradient pairs a
    row (int64 classes, float32 values); without, those are None."""
    loss = torch.empty(n, dtype=torch.float32, device=device)
    pairs = (torch.empty(n, k + 1, dtype=torch.int64, device=device),
             torch.empty(n, k + 1, dtype=torch.float32, device=device)) if want_grad else (None, None)
    return SparseChunk(loss, torch.empty_like(loss), *pairs)


def sparse_softmax_chunk_triton(z: Tensor, target: Tensor, k: int, label_smoothing: float, want_grad: bool,
                                tiles: Tiles = Tiles(), swept: Tensor | None = None) -> SparseChunk:
    """``sparse_softmax_chunk`` by the row kernel, one program a row.

    Args:
        z: (N, V) float32/bfloat16/float16 logits on a GPU (or the CPU under ``TRITON_INTERPRET=1``); only read.
        target: (N,) int64 classes.
        k: the top k, at most ``dispatch.MAX_K``.
        label_smoothing: ε, spread over the top k.
        want_grad: also hand over the gradient pairs.
        tiles: ``sparse_block``, ``sparse_warps`` and ``insert_limit`` are read.
        swept: an (N,) int32 tensor on ``z``'s device, or None; set to 1 on the rows that the merging sweep swept
            again, 0 on the others.

    Returns:
        ``SparseChunk``: row losses and nll (N,), and with ``want_grad`` the (N, k + 1) classes and gradient values,
        all in float32.
    """
    n, v = z.shape
    if z.stride(1) != 1:
        z = z.contiguous()
    out = empty_rows(n, k, z.device, want_grad)
    top = top_width(k)
    if n:
        _sparse_softmax_row[(n,)](
            z_ptr=z, z_stride=z.stride(0), target_ptr=target, k=k, smoothing=float(label_smoothing),
            loss_ptr=out.loss, nll_ptr=out.nll, classes_ptr=out.classes, grad_ptr=out.grad, swept_ptr=swept, V=v,
            WANT_GRAD=want_grad, K=top, BLOCK=block_for(v, top, tiles.sparse_block), INSERT_LIMIT=tiles.insert_limit,
            num_warps=tiles.sparse_warps)
    return out
