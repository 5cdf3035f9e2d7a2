"""The output layer and its loss in one pass: ``fused_output_loss(hidden, weight, target, loss)``.

A seq2seq model's output layer ``z = h·Wᵀ (+ b)`` over a large vocabulary is most of its training
cost: ``F.linear`` + a loss + backward computes the N×V logits, a dense N×V gradient G, and two more
products of the same size, ``G·W`` for the features and ``Gᵀ·h`` for the weight. The sparse losses
need little of that:

* sparse_softmax's G is non-zero on k+1 entries per row, so ``dL/dh = Σ_j g_j W_j`` and
  ``dL/dW_j += g_j h`` cost O(N·k·H) instead of O(N·V·H);
* as_softmax's G is zero on masked rows and non-zero only on the kept classes of a row whose target
  already has ``p_t > δ`` (at most ``1/(p_t - δ)`` of them); only rows that keep (nearly) every class
  take the dense products, so the backward gets cheaper as the model learns;
* cross_entropy is the dense baseline done the same way: it saves the N×V buffers, not time.

Rows are processed in blocks: a block's logits are computed (in the inputs' dtype, as the layer itself
would, then scored in float32), scored by the loss's own block function (``softmax_chunk``,
``sparse_softmax_chunk``, ``as_softmax_chunk``), and turned at once into the block's share of the
gradients of h, W and b; the N×V logits and gradient never exist. Rows whose target is
``ignore_index`` are dropped before any work. With reduction "sum" or "mean" the gradients are
computed in the forward pass and backward only scales them; with "none" backward runs the blocks
again, because each row's weight in the gradient is only known then.

On a GPU, sparse_softmax hands over only the k + 1 gradient pairs a row: blocks of logits computed by cuBLAS
are scored by Sparse-softmax's row kernel (``sparse_softmax_triton.py``), and Triton kernels
(``output_layer_triton.py``) turn the pairs of every row into the gradients of h and W. cross_entropy and
as_softmax keep the blocks there, in the inputs' dtype, scored whole by AS's row kernel (``as_softmax_triton.py``):
no copy to float32 and no small parts, which on a GPU cost more than the products.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import LossResult, check_range, check_reduction, compute_dtype, prepare_targets, row_weights
from .as_softmax import as_softmax_chunk
from .dispatch import TRITON, Tiles, check_impl, use_triton
from .softmax_variants import softmax_chunk
from .sparse_softmax import sparse_softmax_chunk

if TRITON:
    from .as_softmax_triton import as_softmax_rows_triton
    from .output_layer_triton import sparse_layer_backward_triton
    from .sparse_softmax_triton import empty_rows, sparse_softmax_chunk_triton

LOSSES = ("cross_entropy", "sparse_softmax", "as_softmax")
#: An AS row keeping more than this share of the classes takes the dense products: gathering and
#: scattering weight rows one by one costs more per class than the matrix products do.
_DENSE_SHARE = 1 / 16


class _Spec(NamedTuple):
    """The loss and how it runs, as ``fused_output_loss`` was asked."""

    loss: str
    k: int
    delta: float
    label_smoothing: float
    impl: str
    tiles: Tiles
    softcap: float | None


class _Scores(NamedTuple):
    """What one pass over the counted rows gives; the gradients are None when not asked for."""

    loss: Tensor  # (n,) unweighted losses of the counted rows
    nll: Tensor  # (n,) plain softmax cross-entropy
    masked: Tensor  # (n,) bool
    dense: Tensor  # (n,) bool: the gradient w.r.t. the row's logits is non-zero on every class
    grad_hidden: Tensor | None  # (N, H) for every row of hidden (0 on the others), in the compute dtype
    grad_weight: Tensor | None  # (V, H)
    grad_bias: Tensor | None  # (V,)


class _Gradients:
    """Accumulates the gradients of the weighted loss w.r.t. h, W and b, block by block."""

    #: Entries of a sparse logit gradient handled at once: each takes a weight row and a feature row.
    #: On a CPU few, to stay in cache; on a GPU as many as fit ``GPU_GATHER_BYTES`` of gathered rows, as
    #: one launch of each gather and scatter-add is worth more there than locality.
    SPARSE_ENTRIES = 2048
    GPU_GATHER_BYTES = 64 * 2**20

    def __init__(self, hidden: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype):
        self.weight, self.dtype = weight, dtype
        self.entries = self.SPARSE_ENTRIES
        if hidden.is_cuda:
            self.entries = max(self.entries, self.GPU_GATHER_BYTES // (hidden.shape[1] * dtype.itemsize))
        self.grad_hidden = torch.zeros(hidden.shape, dtype=dtype, device=hidden.device)
        self.grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device)
        self.grad_bias = None if bias is None else torch.zeros(weight.shape[0], dtype=dtype, device=weight.device)

    def dense(self, rows: Tensor, h: Tensor, grad: Tensor) -> None:
        """Rows ``rows`` of hidden, ``h (B, H)``, whose logit gradient ``grad (B, V)`` is dense: two matrix
        products, in the weight's dtype (as autograd through ``F.linear`` does them), summed in the
        compute dtype."""
        g = grad.to(self.weight.dtype)
        self.grad_hidden.index_copy_(0, rows, (g @ self.weight).to(self.dtype))
        if g.dtype == self.dtype:
            self.grad_weight.addmm_(g.t(), h)  # in place: no V×H temporary per block
        else:
            _add_half_product(self.grad_weight, g.t(), h)
        if self.grad_bias is not None:
            self.grad_bias.add_(grad.sum(dim=0, dtype=self.dtype))

    def live_rows(self, ids: Tensor, h: Tensor, grad: Tensor, live: Tensor) -> None:
        """The dense products of a block (rows ``ids`` of hidden, features ``h``, logit gradient ``grad``) for the
        rows where ``live`` (B,) holds only: every row as it is, or the live ones moved to the front of the
        block's own buffer (``_rows_to_front``)."""
        live = live.nonzero().squeeze(1)
        if live.numel() == ids.numel():
            self.dense(ids, h, grad)
        elif live.numel():
            self.dense(ids[live], h[live], _rows_to_front(grad, live))

    def block(self, ids: Tensor, h: Tensor, grad: Tensor, product_rows: list[Tensor],
              entries: list[tuple[Tensor, Tensor, Tensor]]) -> None:
        """A block's share: rows ``ids`` of hidden, their features ``h`` and logit gradient ``grad``; the
        block's rows that take the dense products and its sparse entries (rows of the block, classes,
        values)."""
        if product_rows:
            local = torch.cat(product_rows)
            if local.numel() == ids.numel():  # every row: the block as it is
                self.dense(ids, h, grad)
            elif local.numel():
                self.dense(ids[local], h[local], grad[local])
        if entries:
            self.sparse(ids, h, *(torch.cat(parts) for parts in zip(*entries)))

    def pairs(self, hidden: Tensor, rows: Tensor, classes: Tensor, values: Tensor, tiles: Tiles) -> None:
        """Rows ``rows`` of ``hidden`` whose logit gradient is given as (class, value) pairs, ``classes`` and
        ``values`` (n, P): their gradients by the sparse layer's backward kernels (GPU)."""
        sparse_layer_backward_triton(hidden, self.weight, rows, classes, values, self.grad_hidden, self.grad_weight,
                                     tiles)
        if self.grad_bias is not None:
            self.grad_bias.index_add_(0, classes.flatten(), values.flatten())

    def sparse(self, rows: Tensor, h: Tensor, entry_rows: Tensor, classes: Tensor, grad: Tensor) -> None:
        """Single entries ``grad`` of the logit gradient of the rows ``rows`` (features ``h (B, H)``), at
        (``entry_rows`` into them, ``classes``), all 1-D; repeated (row, class) pairs add up."""
        for start in range(0, grad.numel(), self.entries):
            part = slice(start, start + self.entries)
            r, c, g = entry_rows[part], classes[part], grad[part, None]
            self.grad_hidden.index_add_(0, rows[r], g * self.weight.index_select(0, c).to(self.dtype))
            self.grad_weight.index_add_(0, c, g * h.index_select(0, r).to(self.dtype))
            if self.grad_bias is not None:
                self.grad_bias.index_add_(0, c, grad[part])


@functools.cache
def mixed_addmm(device_type: str) -> bool:
    """Whether this torch's ``addmm`` adds a half-precision product to a float32 ``out`` on ``device_type`` in the
    product itself (its ``out_dtype`` overload, which newer versions have for CUDA): asked of torch's dispatcher."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("aten::addmm.dtype_out", device_type.upper())


def _add_half_product(out: Tensor, a: Tensor, b: Tensor) -> None:
    """``out += a @ b``, ``a`` and ``b`` half precision, ``out`` float32. Where torch can (``mixed_addmm``), the
    BLAS adds the product to ``out`` as it writes it, summing in float32 throughout: each block's weight gradient
    costs one read and one write of the float32 V×H sum. Otherwise the product is made in the inputs' dtype and
    converted as the add reads it (no float32 V×H temporary), which also moves the half-precision product twice."""
    if mixed_addmm(out.device.type):
        torch.addmm(out, a, b, out_dtype=out.dtype, out=out)
    else:
        out.add_(a @ b)


class _Part(NamedTuple):
    """A few rows of a block, scored; their logit gradient (weighted) is in the block's buffer."""

    loss: Tensor
    nll: Tensor
    masked: Tensor
    dense: Tensor  # bool: every class kept, the gradient is dense
    product_rows: Tensor | None  # rows (of the part) that take the dense products
    entries: tuple[Tensor, Tensor, Tensor] | None  # (rows of the part, classes, values) of a sparse gradient


def _score_part(z: Tensor, target: Tensor, row_weight: Tensor | None, spec: _Spec) -> _Part:
    """Score a part of a block with the loss's own block function; with ``row_weight``, weight its
    gradient and say which rows take the dense products and which entries are taken one by one."""
    b, v = z.shape
    want = row_weight is not None
    every, no_row = torch.ones(b, dtype=torch.bool, device=z.device), torch.zeros(b, dtype=torch.bool, device=z.device)
    if spec.loss == "cross_entropy":
        scored = softmax_chunk(z, target, spec.label_smoothing, want)
        part = _Part(scored.loss, scored.nll, no_row, every, None, None)
        if want:
            scored.grad.mul_(row_weight[:, None])
            part = part._replace(product_rows=torch.arange(b, device=z.device))
        return part
    if spec.loss == "sparse_softmax":
        scored = sparse_softmax_chunk(z, target, spec.k, spec.label_smoothing, want, spec.impl, spec.tiles)
        part = _Part(scored.loss, scored.nll, no_row, every if spec.k == v else no_row, None, None)
        if want:
            rows = torch.arange(b, device=z.device).repeat_interleave(spec.k + 1)
            values = scored.grad.mul_(row_weight[:, None]).flatten()
            part = part._replace(entries=(rows, scored.classes.flatten(), values))
        return part
    scored = as_softmax_chunk(z, target, spec.delta, want)
    part = _Part(scored.loss, scored.nll, scored.masked, scored.kept == v, None, None)
    if not want:
        return part
    grad = scored.grad.mul_(row_weight[:, None])
    wide = scored.kept > v * _DENSE_SHARE  # masked rows have no gradient, the others only their kept classes
    narrow = (~wide & ~scored.masked).nonzero().squeeze(1)
    entry, classes = (~scored.dropped[narrow]).nonzero(as_tuple=True)
    rows = narrow[entry]
    return part._replace(product_rows=wide.nonzero().squeeze(1), entries=(rows, classes, grad[rows, classes]))


def _score_rows(hidden: Tensor, weight: Tensor, bias: Tensor | None, rows: Tensor, target: Tensor,
                row_weight: Tensor | None, spec: _Spec) -> _Scores:
    """Score the counted ``rows`` of ``hidden (N, H)``; with ``row_weight`` also compute the gradients of
    ``Σ row_weight · loss``.

    The logits are computed a large block of rows at a time (a product's speed needs many rows), and
    scored in parts small enough to stay in cache through the loss's several passes over them.
    """
    if spec.loss == "sparse_softmax":
        if use_triton(hidden, spec.impl, spec.k, refused=_kernels_refuse(spec)):
            return _score_sparse_rows(hidden, weight, bias, rows, target, row_weight, spec)
    elif use_triton(hidden, spec.impl, refused=_kernels_refuse(spec)):
        return _score_rows_by_row_kernel(hidden, weight, bias, rows, target, row_weight, spec)
    n, v = rows.numel(), weight.shape[0]
    dtype = compute_dtype(hidden)
    loss = torch.empty(n, dtype=dtype, device=hidden.device)
    nll = torch.empty_like(loss)
    masked = torch.zeros(n, dtype=torch.bool, device=hidden.device)
    dense = torch.zeros_like(masked)
    grads = None if row_weight is None else _Gradients(hidden, weight, bias, dtype)
    part_rows = spec.tiles.rows(hidden.device, v, fused=False)
    slopes = None  # with a soft-cap and gradients: each block's dz_capped / dz, which the scoring overwrites
    for block, ids, h, z in _logit_blocks(hidden, weight, bias, rows, dtype, spec.tiles):
        if spec.softcap is not None:
            if grads is not None and slopes is None:
                slopes = torch.empty_like(z)
            slope = _soft_cap(z, spec.softcap, None if grads is None else slopes[: z.shape[0]])
        product_rows, entries = [], []
        for first in range(0, ids.numel(), part_rows):
            local = slice(first, first + part_rows)
            done = slice(block.start + first, block.start + first + z[local].shape[0])
            part = _score_part(z[local], target[done], None if grads is None else row_weight[done], spec)
            loss[done], nll[done], masked[done], dense[done] = part.loss, part.nll, part.masked, part.dense
            if part.product_rows is not None:
                product_rows.append(part.product_rows + first)
            if part.entries is not None:
                entries.append((part.entries[0] + first, *part.entries[1:]))
        if grads is not None:
            if spec.softcap is not None:
                _through_soft_cap(z, slope, product_rows, entries)
            grads.block(ids, h, z, product_rows, entries)
    return _scores(loss, nll, masked, dense, grads)


def _soft_cap(z: Tensor, cap: float, slope: Tensor | None) -> Tensor | None:
    """Caps the logits ``z`` in place, ``cap·tanh(z / cap)`` (Gemma 2's final soft-cap), and writes the cap's
    derivative ``1 − tanh²(z / cap)`` into ``slope`` (same shape), if given."""
    z.div_(cap).tanh_()
    if slope is not None:
        torch.mul(z, z, out=slope).neg_().add_(1)
    z.mul_(cap)
    return slope


def _through_soft_cap(grad: Tensor, slope: Tensor, product_rows: list[Tensor],
                      entries: list[tuple[Tensor, Tensor, Tensor]]) -> None:
    """A block's gradient w.r.t. the capped logits made the gradient w.r.t. the layer's logits, where it is
    used: the rows that take the dense products (``grad``) and the single entries (their values)."""
    for rows in product_rows:
        grad[rows] *= slope[rows]
    for rows, classes, values in entries:
        values.mul_(slope[rows, classes])


def _logit_blocks(hidden: Tensor, weight: Tensor, bias: Tensor | None, rows: Tensor, dtype: torch.dtype,
                  tiles: Tiles):
    """Each block of the counted ``rows``: (its slice of ``rows``, its rows of hidden, their features, their
    logits in ``dtype``), the logits written into one buffer reused by every block."""
    n, v = rows.numel(), weight.shape[0]
    step = tiles.rows(hidden.device, v, fused=True, width=hidden.shape[1])
    buffer = torch.empty(min(step, n), v, dtype=dtype, device=hidden.device)
    for start in range(0, n, step):
        ids = rows[start:start + step]
        h = hidden.index_select(0, ids)
        yield slice(start, start + ids.numel()), ids, h, _logits(h, weight, bias, buffer[: ids.numel()])


def _scores(loss: Tensor, nll: Tensor, masked: Tensor, dense: Tensor, grads: _Gradients | None) -> _Scores:
    if grads is None:
        return _Scores(loss, nll, masked, dense, None, None, None)
    return _Scores(loss, nll, masked, dense, grads.grad_hidden, grads.grad_weight, grads.grad_bias)


def _score_sparse_rows(hidden: Tensor, weight: Tensor, bias: Tensor | None, rows: Tensor, target: Tensor,
                       row_weight: Tensor | None, spec: _Spec) -> _Scores:
    """``_score_rows`` for sparse_softmax by the kernels: the gradient pairs of every counted row, a block of
    logits at a time, then the backward kernels' gathers and scatter-adds over all rows at once."""
    want = row_weight is not None
    scored = sparse_pairs_by_blocks(hidden, weight, bias, rows, target, spec.k, spec.label_smoothing, want,
                                    spec.tiles)
    n, v = rows.numel(), weight.shape[0]
    masked = torch.zeros(n, dtype=torch.bool, device=hidden.device)
    dense = masked if spec.k < v else ~masked
    grads = None
    if want:
        grads = _Gradients(hidden, weight, bias, compute_dtype(hidden))
        grads.pairs(hidden, rows, scored.classes, scored.grad.mul_(row_weight[:, None].to(scored.grad.dtype)),
                    spec.tiles)
    return _scores(scored.loss, scored.nll, masked, dense, grads)


def sparse_pairs_by_blocks(hidden: Tensor, weight: Tensor, bias: Tensor | None, rows: Tensor, target: Tensor,
                           k: int, label_smoothing: float, want_grad: bool, tiles: Tiles):
    """The gradient pairs of the GPU sparse_softmax layer: blocks of logits by cuBLAS, each scored by
    Sparse-softmax's row kernel. Returns ``SparseChunk`` fields for the counted ``rows`` (losses, nll, and with
    ``want_grad`` the k + 1 (class, value) pairs a row), in float32."""
    scored = empty_rows(rows.numel(), k, hidden.device, want_grad)
    for done, _, _, z in _logit_blocks(hidden, weight, bias, rows, hidden.dtype, tiles):
        block = sparse_softmax_chunk_triton(z, target[done], k, label_smoothing, want_grad, tiles)
        for whole, part in zip(scored, block):
            if part is not None:
                whole[done] = part
    return scored


def _kernels_refuse(spec: _Spec) -> str | None:
    """Why the kernels cannot compute this loss, or None. The AS row kernel scores as_softmax, and cross_entropy
    without label smoothing, which is AS-Softmax with δ = 1 (no class is ever dropped); no kernel caps logits."""
    if spec.softcap is not None:
        return "no kernel computes soft-capped logits"
    if spec.loss == "cross_entropy" and spec.label_smoothing:
        return "no kernel computes cross_entropy with label_smoothing"
    return None


def _score_rows_by_row_kernel(hidden: Tensor, weight: Tensor, bias: Tensor | None, rows: Tensor, target: Tensor,
                              row_weight: Tensor | None, spec: _Spec) -> _Scores:
    """``_score_rows`` on a GPU for cross_entropy and as_softmax: each block's logits in the inputs' dtype (as
    the layer's), scored whole by the AS row kernel, which writes the weighted gradient over them; then the
    two products for the rows that have a gradient (AS's masked rows have none), also for AS rows that keep
    few classes (which the CPU path gathers entry by entry)."""
    n = rows.numel()
    delta = 1.0 if spec.loss == "cross_entropy" else spec.delta
    want = row_weight is not None
    dtype = compute_dtype(hidden)
    loss = torch.empty(n, dtype=dtype, device=hidden.device)
    nll = torch.empty_like(loss)
    masked = torch.empty(n, dtype=torch.bool, device=hidden.device)
    dense = torch.empty_like(masked)
    grads = _Gradients(hidden, weight, bias, dtype) if want else None
    for done, ids, h, z in _logit_blocks(hidden, weight, bias, rows, hidden.dtype, spec.tiles):  # z: the logits,
        loss[done], nll[done], masked[done], dense[done], grad = as_softmax_rows_triton(  # then their gradient
            z, target[done], row_weight[done] if want else None, delta, want, in_place=True, tiles=spec.tiles)
        if want:
            grads.live_rows(ids, h, grad, ~masked[done])
    return _scores(loss, nll, masked, dense, grads)


def _rows_to_front(block: Tensor, rows: Tensor, parts: int = 8) -> Tensor:
    """``block[rows]`` (``rows`` ascending) as the first rows of ``block``, moved there in place an eighth at a
    time: a copy of the live rows beside the block would add up to the block's size again to the layer's peak
    memory. Row j's destination is j ≤ ``rows[j]``, so no part overwrites a row that a later part reads."""
    step = -(-rows.numel() // parts)
    for start in range(0, rows.numel(), step):
        part = rows[start:start + step]
        block[start:start + part.numel()] = block.index_select(0, part)
    return block[:rows.numel()]


def _logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> Tensor:
    """``F.linear(hidden, weight, bias)`` written into ``out`` (the compute dtype): directly when the
    dtypes agree, else computed in the inputs' dtype, as the layer itself would, then converted."""
    if hidden.dtype != out.dtype:
        return out.copy_(F.linear(hidden, weight, bias))
    if bias is None:
        return torch.mm(hidden, weight.t(), out=out)
    return torch.addmm(bias, hidden, weight.t(), out=out)


class _FusedOutputLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, rows, target, row_weight, spec: _Spec, per_row: bool):
        """(weighted loss, weighted row nll, masked, dense) of the counted ``rows`` of ``hidden``."""
        want = any(ctx.needs_input_grad[:3]) and not per_row
        scores = _score_rows(hidden, weight, bias, rows, target, row_weight if want else None, spec)
        ctx.spec, ctx.per_row, ctx.dtypes = spec, per_row, (hidden.dtype, weight.dtype)
        if per_row:  # backward needs each row's weight first: it scores the rows again
            ctx.save_for_backward(hidden, weight, bias, rows, target, row_weight)
        else:
            ctx.save_for_backward(scores.grad_hidden, scores.grad_weight, scores.grad_bias)
        loss = scores.loss * row_weight
        if per_row:
            loss = torch.zeros(hidden.shape[0], dtype=loss.dtype, device=loss.device).index_copy_(0, rows, loss)
        nll, masked, dense = scores.nll * row_weight, scores.masked, scores.dense
        ctx.mark_non_differentiable(nll, masked, dense)
        return (loss if per_row else loss.sum()), nll, masked, dense

    @staticmethod
    def backward(ctx, grad_loss: Tensor, *_unused):
        if ctx.per_row:
            hidden, weight, bias, rows, target, row_weight = ctx.saved_tensors
            scale = row_weight * grad_loss.index_select(0, rows).to(row_weight.dtype)
            scores = _score_rows(hidden, weight, bias, rows, target, scale, ctx.spec)
            grad_h, grad_w, grad_b = scores.grad_hidden, scores.grad_weight, scores.grad_bias
        else:
            grad_h, grad_w, grad_b = ctx.saved_tensors
            # The common case (loss.backward() on the summed loss) hands the gradients on as they are;
            # they are never modified in place, so repeated backward passes stay correct.
            if not (grad_loss.numel() == 1 and float(grad_loss) == 1.0):
                scale = grad_loss.to(grad_w.dtype)
                grad_h, grad_w = grad_h * scale, grad_w * scale
                grad_b = None if grad_b is None else grad_b * scale
        hidden_dtype, weight_dtype = ctx.dtypes
        return (grad_h.to(hidden_dtype), grad_w.to(weight_dtype), None if grad_b is None else grad_b.to(weight_dtype),
                None, None, None, None, None)


def _check_layer(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    shapes = f"{tuple(hidden.shape)} and {tuple(weight.shape)}"
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden must be (N, H) and weight (V, H), got {shapes}")
    if not hidden.is_floating_point() or hidden.dtype != weight.dtype:
        raise ValueError(f"hidden and weight must share one floating-point dtype, got {hidden.dtype} and "
                         f"{weight.dtype}")
    if bias is not None and (bias.shape != weight.shape[:1] or bias.dtype != weight.dtype):
        raise ValueError(f"bias must be ({weight.shape[0]},) of dtype {weight.dtype}, "
                         f"got {tuple(bias.shape)} of {bias.dtype}")


def fused_output_loss(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    loss: str,
    *,
    k: int = 10,
    delta: float = 0.3,
    label_smoothing: float = 0.0,
    bias: Tensor | None = None,
    softcap: float | None = None,
    ignore_index: int | None = None,
    reduction: str = "sum",
    impl: str = "auto",
    tiles: Tiles = Tiles(),
) -> LossResult:
    """``loss`` of the logits ``z = F.linear(hidden, weight, bias)`` without ever forming them (see the module).

    The result matches the unfused loss on ``z`` (on ``softcap·tanh(z / softcap)`` with a soft-cap): the loss, the
    plain nll, the masked and dense row counts; gradients reach hidden, weight and bias in their own dtypes, computed
    in float32 for half inputs (float64 in float64).

    Args:
        hidden: (N, H) the features the output layer reads.
        weight: (V, H) the layer's weight (an ``nn.Linear``'s, possibly tied to the embeddings), hidden's dtype.
        target: (N,) integer classes; rows equal to ``ignore_index`` are dropped before any work.
        loss: "cross_entropy" (label-smoothed as ``softmax_loss``), "sparse_softmax" (``k``, ``label_smoothing`` as
            ``sparse_softmax_loss``) or "as_softmax" (``delta``, no label smoothing).
        bias: (V,) or None.
        softcap: the logits' final soft-cap (Gemma 2's ``final_logit_softcapping``), > 0, or None. Sparse-softmax's
            top k is the same set before and after it: the cap keeps the logits' order.
        reduction: "sum", "mean" (over counted rows) or "none".
        impl: "auto", "torch" or "triton" (``dispatch.use_triton``). On a GPU, sparse_softmax's blocks are scored
            by its row kernel and its backward by the layer's kernels; as_softmax and cross_entropy without label
            smoothing by the AS row kernel.
        tiles: the sizes of the blocks of rows and of the kernels' tiles (``dispatch.Tiles``).

    Returns:
        ``LossResult``: the loss and nll (scalars, or (N,) with "none"), and the counts of masked and dense rows.
    """
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    _check_layer(hidden, weight, bias)
    check_reduction(reduction)
    v = weight.shape[0]
    if loss == "sparse_softmax":
        check_range("k", k, 1, v)
    if loss == "as_softmax":
        check_range("delta", delta, 0.0, 1.0)
        if label_smoothing:
            raise ValueError("as_softmax takes no label_smoothing")
    check_range("label_smoothing", label_smoothing, 0.0, 1.0)
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be > 0 or None, got {softcap!r}")
    check_impl(impl)
    prepared = prepare_targets(target, hidden.shape[0], v, ignore_index, f"hidden {tuple(hidden.shape)}")
    rows = prepared.valid.nonzero().squeeze(1)
    row_weight = row_weights(prepared.valid, reduction, compute_dtype(hidden)).index_select(0, rows)
    spec = _Spec(loss, int(k), float(delta), float(label_smoothing), impl, tiles,
                 None if softcap is None else float(softcap))
    target = prepared.target.index_select(0, rows)
    out, nll, masked, dense = _FusedOutputLayer.apply(hidden, weight, bias, rows, target, row_weight, spec,
                                                      reduction == "none")
    if reduction == "none":
        nll = torch.zeros(hidden.shape[0], dtype=nll.dtype, device=nll.device).index_copy_(0, rows, nll)
    else:
        nll = nll.sum()
    return LossResult(out, nll, masked.sum(), dense.sum())
