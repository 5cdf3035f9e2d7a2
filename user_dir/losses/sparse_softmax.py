"""Sparse-softmax (Sun et al. 2021): cross-entropy normalised over the k largest logits only."""
from __future__ import annotations

from torch import Tensor

from ._common import check_range, compute_dtype, prepare_rows, reduce_rows


def sparse_softmax_loss(
    logits: Tensor,
    target: Tensor,
    k: int,
    ignore_index: int | None = None,
    reduction: str = "sum",
    label_smoothing: float = 0.0,
) -> Tensor:
    """``logsumexp(topk(z, k)) - z_t`` per row (SPACES semantics).

    The target is *not* added to the support when it falls outside the top-k: the loss then stays
    positive and pushes z_t up and the top-k logits down. Only the k selected logits and z_t receive
    gradient, so no dense softmax is ever formed.

    ``label_smoothing`` ε spreads ε of the target mass uniformly over the k kept classes:
    ``(1-ε)·(lse_k - z_t) + ε·(lse_k - mean(topk(z)))``. fairseq's ``-Σ_V log p`` smoothing would be
    +∞ here, because every class outside the support has probability 0.
    """
    rows = prepare_rows(logits, target, ignore_index, reduction)
    check_range("k", k, 1, logits.shape[1])
    check_range("label_smoothing", label_smoothing, 0.0, 1.0)
    dtype = compute_dtype(logits)
    top = logits.topk(int(k), dim=-1, sorted=False).values.to(dtype)
    lse = top.logsumexp(dim=-1)
    z_t = logits.gather(1, rows.target[:, None]).squeeze(1).to(dtype)
    loss = lse - z_t
    if label_smoothing > 0:
        loss = (1.0 - label_smoothing) * loss + label_smoothing * (lse - top.mean(dim=-1))
    return reduce_rows(loss, rows.valid, reduction)
