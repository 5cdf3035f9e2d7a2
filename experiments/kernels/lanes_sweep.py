"""A second sweep for the Sparse-softmax row kernel, outside the package until a GPU has timed it: promoted into
``sparse_softmax/losses/sparse_softmax_triton.py`` if it beats the merging sweep there, deleted if not
(``tools/kernel_tuning.py`` times both, ``tools/kernel_compile.py`` compiles both).

The product's sweep merges each block's candidates into the row's running top k, which reduces across the row's
lanes and branches at every block. This one does neither: each of the BLOCK lanes (columns ≡ j mod BLOCK) keeps its
two largest logits and the largest it let go, elementwise, and the top k is chosen from the kept ones once, at the
end. It is exact unless a lane let go of a logit above the chosen k-th, i.e. held three of the row's top k (about
C(k, 3) / BLOCK² of rows of random logits), or the row has fewer than k finite logits: such a row is swept again by
the product's merging sweep, in the same program. Everything else (keys, the row's finish, the outputs) is the
product kernel's.
"""
from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from sparse_softmax.losses.dispatch import Tiles
from sparse_softmax.losses.sparse_softmax_triton import (LOWEST, _finish_row, _keys, _row, _sweep_merging, _unkey,
                                                         block_for, empty_rows, top_width)
from sparse_softmax.losses.triton_helpers import online_lse

HIGHEST = tl.constexpr(0x7FFFFFFFFFFFFFFF)


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
def _sparse_softmax_row_by_lanes(z_ptr, z_stride, target_ptr, k, smoothing, loss_ptr, nll_ptr, classes_ptr, grad_ptr,
                                 swept_ptr, V, WANT_GRAD: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr,
                                 INSERT_LIMIT: tl.constexpr):
    row, z_row, target, z_t = _row(z_ptr, z_stride, target_ptr)
    lane_max, lane_sum, first_col, second, second_col, let_go = _sweep_lanes(z_row, V, BLOCK)
    kept = tl.reshape(tl.join(_lane_keys(lane_max, first_col), _lane_keys(second, second_col)), [1, 2 * BLOCK])
    best = tl.topk(kept, K)
    kth = tl.min(tl.where(tl.arange(0, K)[None, :] < k, best, HIGHEST), axis=1)
    kth_value = _unkey(kth)[0]
    # Exact unless a lane let go of a logit above the k-th chosen (three of the top k in one lane: about
    # C(k, 3) / BLOCK² of random rows), or fewer than k logits were finite: then the merging sweep.
    again = tl.max(((tl.max(let_go, axis=0) > kth_value) | (kth == LOWEST)).to(tl.int32), axis=0)
    if again > 0:
        best = _sweep_merging(z_row, V, K, BLOCK, INSERT_LIMIT)[2]
    if swept_ptr is not None:
        tl.store(swept_ptr + tl.program_id(0), again)
    _finish_row(best, lane_max, lane_sum, z_t, row, target, k, smoothing, loss_ptr, nll_ptr, classes_ptr, grad_ptr,
                WANT_GRAD, K)


def sparse_softmax_chunk_by_lanes(z: Tensor, target: Tensor, k: int, label_smoothing: float, want_grad: bool,
                                  tiles: Tiles = Tiles(), swept: Tensor | None = None):
    """``sparse_softmax_chunk_triton`` with the lanes' sweep: the same arguments and outputs. ``swept``, an (N,)
    int32 tensor, is set to 1 on the rows that the merging sweep swept again (the lanes may have missed one of
    their top k), 0 on the others."""
    n, v = z.shape
    if z.stride(1) != 1:
        z = z.contiguous()
    out = empty_rows(n, k, z.device, want_grad)
    top = top_width(k)
    if n:
        _sparse_softmax_row_by_lanes[(n,)](
            z_ptr=z, z_stride=z.stride(0), target_ptr=target, k=k, smoothing=float(label_smoothing),
            loss_ptr=out.loss, nll_ptr=out.nll, classes_ptr=out.classes, grad_ptr=out.grad, swept_ptr=swept, V=v,
            WANT_GRAD=want_grad,
            K=top, BLOCK=block_for(v, top, tiles.sparse_block), INSERT_LIMIT=tiles.insert_limit,
            num_warps=tiles.sparse_warps)
    return out
