"""Sparse-softmax rows as one Triton kernel: the GPU path of ``sparse_softmax_chunk``.

On a GPU ``torch.topk`` dominates the PyTorch path (69 % of its time on an H100 at V = 128k, bf16: a
top 10 of 128k columns by radix passes costs more than all of ``F.cross_entropy``). Here one program
scores one row in a single sweep over its logits, in float32 registers: a block of columns at a time
it updates the running maximum and Σ exp (for the plain nll, as the AS kernel does) and merges the
block's top K into the row's running top K. Only a block whose largest logit beats the running K-th
is merged, which after the first blocks is rare (about K·ln(V / BLOCK) merges a row on random logits).

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

from .sparse_softmax import SparseChunk

#: Logits per load: half the AS kernel's, since each block's top K is a sort network over 64-bit keys
#: held in registers. Not yet tuned on a GPU.
BLOCK = 2048
#: Largest top k the kernel keeps in registers (K: k rounded up to a power of two, at least 2); larger
#: k stay on the PyTorch path.
MAX_K = 128
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


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
def _finish_rows(best, z_t, nll, rows, in_rows, target, k, smoothing, loss_ptr, nll_ptr, classes_ptr, grad_ptr,
                 WANT_GRAD: tl.constexpr, K: tl.constexpr):
    """Store the losses and nll of ``rows`` (M,) from their top K keys ``best`` (M, K, largest first) and
    target logits ``z_t``, and with ``WANT_GRAD`` their gradient pairs: p_j - ε/k on the top k (p: the
    softmax over them), then ε - 1 at the target. Both kernels end here."""
    values, classes = _unkey(best)
    first_k = tl.arange(0, K)[None, :] < k
    values = tl.where(first_k, values, float("-inf"))
    largest = tl.max(values, axis=1)
    lse = tl.log(tl.sum(tl.exp(values - largest[:, None]), axis=1)) + largest
    loss = lse - z_t
    if smoothing > 0:
        mean = tl.sum(tl.where(first_k, values, 0.0), axis=1) / k
        loss = (1.0 - smoothing) * loss + smoothing * (lse - mean)
    tl.store(loss_ptr + rows, loss, mask=in_rows)
    tl.store(nll_ptr + rows, nll, mask=in_rows)
    if WANT_GRAD:
        out = rows[:, None] * (k + 1) + tl.arange(0, K)[None, :]
        keep = in_rows[:, None] & first_k
        tl.store(classes_ptr + out, classes, mask=keep)
        tl.store(grad_ptr + out, tl.exp(values - lse[:, None]) - smoothing / k, mask=keep)
        tl.store(classes_ptr + rows * (k + 1) + k, target.to(tl.int64), mask=in_rows)
        tl.store(grad_ptr + rows * (k + 1) + k, tl.zeros_like(loss) + (smoothing - 1.0), mask=in_rows)


@triton.jit
def _sparse_softmax_row(z_ptr, z_stride, target_ptr, k, smoothing, loss_ptr, nll_ptr, classes_ptr, grad_ptr, V,
                        WANT_GRAD: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) + tl.arange(0, 1)  # the row, as a block of one for _finish_rows
    z_row = z_ptr + tl.program_id(0).to(tl.int64) * z_stride
    target = tl.load(target_ptr + row)
    z_t = tl.load(z_row + target).to(tl.float32)
    cols = tl.arange(0, BLOCK)
    lowest = -0x7FFFFFFFFFFFFFFF - 1  # below every key (a -inf logit's key included)

    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_sum = tl.zeros([BLOCK], tl.float32)
    best = tl.full([K], lowest, tl.int64)
    kth = lowest  # the running K-th key: a block below it cannot change the top K
    for start in tl.range(0, V, BLOCK):
        inside = start + cols < V
        z = tl.load(z_row + start + cols, mask=inside, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(lane_max, z)
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # lanes with nothing finite yet
        lane_sum = lane_sum * tl.exp(lane_max - shift) + tl.exp(z - shift)
        lane_max = new_max
        keys = tl.where(inside, _keys(z, start + cols), lowest)
        if tl.max(keys, axis=0) > kth:
            best = tl.topk(tl.reshape(tl.join(best, tl.topk(keys, K)), [2 * K]), K)
            kth = tl.min(best, axis=0)
    top = tl.max(lane_max, axis=0)
    nll = tl.log(tl.sum(lane_sum * tl.exp(lane_max - top), axis=0)) + top - z_t
    _finish_rows(tl.reshape(best, [1, K]), z_t, nll, row, row >= 0, target, k, smoothing, loss_ptr, nll_ptr,
                 classes_ptr, grad_ptr, WANT_GRAD, K)


def top_width(k: int) -> int:
    """K, the top k's width in registers: k rounded up to a power of two, at least 2 (``tl.topk``'s)."""
    return max(2, triton.next_power_of_2(k))


def empty_rows(n: int, k: int, device: torch.device, want_grad: bool) -> tuple[SparseChunk, tuple[Tensor, Tensor]]:
    """The outputs of ``n`` scored rows (float32 losses and nll; with ``want_grad`` the k + 1 pairs a row),
    and the pair buffers to hand a kernel, for which any tensor stands in when no gradient is asked for."""
    loss = torch.empty(n, dtype=torch.float32, device=device)
    out = SparseChunk(loss, torch.empty_like(loss),
                      torch.empty(n, k + 1, dtype=torch.int64, device=device) if want_grad else None,
                      torch.empty(n, k + 1, dtype=torch.float32, device=device) if want_grad else None)
    return out, (loss if out.classes is None else out.classes, loss if out.grad is None else out.grad)


def sparse_softmax_chunk_triton(z: Tensor, target: Tensor, k: int, label_smoothing: float, want_grad: bool):
    """``sparse_softmax_chunk`` for float32/16 logits on a GPU (or the CPU under ``TRITON_INTERPRET=1``),
    with ``k ≤ MAX_K``; ``z`` is only read. Returns the same fields, the losses and gradient in float32."""
    n, v = z.shape
    if z.stride(1) != 1:
        z = z.contiguous()
    out, (classes, grad) = empty_rows(n, k, z.device, want_grad)
    top = top_width(k)  # a block must hold at least K columns for its top K
    if n:
        _sparse_softmax_row[(n,)](z, z.stride(0), target, k, float(label_smoothing), out.loss, out.nll, classes, grad,
                                  v, WANT_GRAD=want_grad, K=top, BLOCK=max(top, min(BLOCK, triton.next_power_of_2(v))))
    return out
