"""The fused output layer's Sparse-softmax forward as one Triton kernel: the logits never leave the chip.

``fused_output_loss`` on a GPU, loss "sparse_softmax": a program takes ``BLOCK_M`` rows of the features
and sweeps the vocabulary a tile of ``BLOCK_V`` weight rows at a time. Each tile's logits are one
``tl.dot`` over the hidden size, accumulated in float32 registers, and are used at once: the rows'
running maximum and Σ exp (the plain nll), the target's logit when the tile holds it, and the rows'
running top K (the keys of ``sparse_softmax_triton``: value and column in one int64; a tile is merged
only when one of its rows beats its running K-th). What leaves the chip is k + 1 (class, value) pairs
a row, the gradient of the logits; ``output_layer.py`` turns them into the gradients of the features
and the weight with gathers and scatter-adds, O(N·k·H), so the whole layer costs about one forward
product where ``F.linear`` + ``F.cross_entropy`` costs three.

The logits are summed in float32 from the inputs' own dtype (``F.linear`` rounds them to bf16/fp16
first): on half inputs the kernel's logits are the more exact ones.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .sparse_softmax_triton import MAX_K, _finish_rows, _keys, empty_rows, top_width

#: Tile sizes: rows a program, vocabulary columns a tile, hidden units a dot. Not yet tuned on a GPU.
BLOCK_M, BLOCK_V, BLOCK_H = 64, 128, 64
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _sparse_output_layer(h_ptr, h_stride, rows_ptr, w_ptr, w_stride, b_ptr, target_ptr, k, smoothing,
                         loss_ptr, nll_ptr, classes_ptr, grad_ptr, N, V, H,
                         HAS_BIAS: tl.constexpr, WANT_GRAD: tl.constexpr, IEEE: tl.constexpr, K: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    first = tl.program_id(0).to(tl.int64) * BLOCK_M
    m = first + tl.arange(0, BLOCK_M)
    in_rows = m < N
    h_rows = tl.load(rows_ptr + m, mask=in_rows, other=0)  # rows of the features (the counted ones)
    target = tl.load(target_ptr + m, mask=in_rows, other=0)
    cols = tl.arange(0, BLOCK_V)
    units = tl.arange(0, BLOCK_H)
    lowest = -0x7FFFFFFFFFFFFFFF - 1

    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    z_t = tl.zeros([BLOCK_M], tl.float32)
    best = tl.full([BLOCK_M, K], lowest, tl.int64)
    kth = tl.full([BLOCK_M], lowest, tl.int64)
    for v0 in tl.range(0, V, BLOCK_V):
        v = v0 + cols
        in_vocab = v < V
        z = tl.zeros([BLOCK_M, BLOCK_V], tl.float32)
        for u0 in tl.range(0, H, BLOCK_H):
            u = u0 + units
            a = tl.load(h_ptr + h_rows[:, None] * h_stride + u[None, :], mask=in_rows[:, None] & (u[None, :] < H),
                        other=0.0)
            b = tl.load(w_ptr + v[None, :].to(tl.int64) * w_stride + u[:, None],
                        mask=(u[:, None] < H) & in_vocab[None, :], other=0.0)
            if IEEE:
                z = tl.dot(a, b, z, input_precision="ieee")
            else:
                z = tl.dot(a, b, z)
        if HAS_BIAS:
            z += tl.load(b_ptr + v, mask=in_vocab, other=0.0).to(tl.float32)[None, :]
        z = tl.where(in_vocab[None, :], z, float("-inf"))
        z_t += tl.sum(tl.where(v[None, :] == target[:, None], z, 0.0), axis=1)

        new_max = tl.maximum(row_max, tl.max(z, axis=1))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        row_sum = row_sum * tl.exp(row_max - shift) + tl.sum(tl.exp(z - shift[:, None]), axis=1)
        row_max = new_max

        keys = tl.where(in_vocab[None, :], _keys(z, v[None, :]), lowest)
        if tl.max((tl.max(keys, axis=1) > kth).to(tl.int32), axis=0) > 0:
            best = tl.topk(tl.reshape(tl.join(best, tl.topk(keys, K)), [BLOCK_M, 2 * K]), K)
            kth = tl.min(best, axis=1)
    nll = tl.log(row_sum) + row_max - z_t
    _finish_rows(best, z_t, nll, m, in_rows, target, k, smoothing, loss_ptr, nll_ptr, classes_ptr, grad_ptr,
                 WANT_GRAD, K)


def sparse_output_layer_triton(hidden: Tensor, weight: Tensor, bias: Tensor | None, rows: Tensor, target: Tensor,
                               k: int, label_smoothing: float, want_grad: bool):
    """Sparse-softmax of the logits ``F.linear(hidden[rows], weight, bias)`` against ``target`` (one per
    row of ``rows``), without forming them: ``SparseChunk`` fields (losses, nll, and with ``want_grad`` the
    gradient as k + 1 (class, value) pairs a row), in float32, for ``k ≤ MAX_K``."""
    n, (v, h) = rows.numel(), weight.shape
    hidden, weight = hidden.contiguous(), weight.contiguous()
    out, (classes, grad) = empty_rows(n, k, hidden.device, want_grad)
    top = top_width(k)  # a tile must hold at least K columns for its top K
    if n:
        _sparse_output_layer[(triton.cdiv(n, BLOCK_M),)](
            hidden, hidden.stride(0), rows, weight, weight.stride(0), weight if bias is None else bias, target,
            k, float(label_smoothing), out.loss, out.nll, classes, grad, n, v, h, HAS_BIAS=bias is not None,
            WANT_GRAD=want_grad, IEEE=hidden.dtype == torch.float32, K=top, BLOCK_M=BLOCK_M,
            BLOCK_V=max(BLOCK_V, top), BLOCK_H=BLOCK_H)
    return out
