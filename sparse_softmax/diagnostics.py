"""Diagnostics of a Sparse-softmax run: whether training on with the loss would sharpen a model's logits or
flatten them (how sparse_softmax collapses when the model does not rank its targets high enough; docs/experiments.md,
"Why sparse_softmax collapses"). The criterion and ``TrainerLoss`` log ``flat_slope`` on a sample of each batch's
rows (``slope_rows``) and say ``handover_warning`` once when a softmax warm-up ends;
``experiments/sparse_collapse/sparse_collapse.py`` profiles checkpoints with ``scale_profile``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from .losses import sparse_softmax_loss
from .losses._common import check_range, prepare_rows


class ScaleProfile(NamedTuple):
    """The Sparse-softmax loss of some rows with their logits multiplied by a scale s; counted rows only."""

    loss: Tensor  # (N, S) nats: lse(s · topk(z)) - s · z_t at each scale (log k at s = 0)
    flat_slope: Tensor  # (N,) the loss's derivative in s at s = 0: mean(topk(z)) - z_t
    rank: Tensor  # (N,) how many classes score strictly above the target (0: it is the argmax)


def scale_profile(logits: Tensor, target: Tensor, k: int, scales: Tensor,
                  ignore_index: int | None = None) -> ScaleProfile:
    """How ``sparse_softmax_loss`` of ``logits`` changes with the logits' scale: why it can collapse.

    Multiplying every logit by s > 0 keeps each row's top k, so the loss ``lse(s·z_K) - s·z_t`` is a
    convex function of s that starts at ``log k`` for s -> 0, whatever the model, with slope
    ``mean(z_K) - z_t``. Where that slope is >= 0 on average over the data, i.e. the target scores no
    higher than the mean of the k largest logits, *flat logits are the loss's minimum over scale*: a
    model trained on with Sparse-softmax from there lowers its loss fastest by shrinking its logits
    (the norm of its output layer or of the features), and the loss plateaus near ``log k``, where the
    target's rank no longer matters. Plain softmax has the same form with ``log V`` and the mean over all
    V classes, which a target almost always beats: it never gains by flattening. A model fine-tuned from
    a pretrained language-model head ranks its targets high from the start; one trained from scratch, or
    with a fresh head, does not (docs/experiments.md, "Why sparse_softmax collapses").

    ``scales`` (S,) are the multipliers to evaluate; the loss is computed in float64.
    """
    z, z_t, top = _counted_top(logits, target, k, ignore_index)
    s = scales.to(top)
    loss = (s[None, :, None] * top[:, None, :]).logsumexp(dim=-1) - s[None, :] * z_t
    return ScaleProfile(loss, (top.mean(dim=-1, keepdim=True) - z_t).squeeze(1), (z > z_t).sum(dim=-1))


def flat_slope(logits: Tensor, target: Tensor, k: int, ignore_index: int | None = None) -> Tensor:
    """``scale_profile``'s flat slope alone, ``mean(topk(z)) - z_t`` per counted row in float64: what a training
    run can afford to log every batch (no scaled losses, no rank over all V classes)."""
    _, z_t, top = _counted_top(logits, target, k, ignore_index)
    return (top.mean(dim=-1, keepdim=True) - z_t).squeeze(1)


def handover_warning(logits: Tensor, target: Tensor, k: int, update: int) -> str | None:
    """What to tell the user when a softmax warm-up ends with a model that flat logits beat on the Sparse-softmax
    loss (``logits`` and ``target``: a sample of the first batch after it, counted rows only), or None.

    Flat logits score ``log k`` whatever the model knows; a model that scores more gains by flattening its logits
    as soon as the top k takes over (``scale_profile``: the loss is convex in the logits' scale), whatever its
    flat slope, and in every run measured that handed over such a model the valid cross-entropy jumped within a
    few dozen updates and stayed (docs/experiments.md, "Why sparse_softmax collapses"). What the jump costs
    depends on the decoding: plain beam search reads the flattened tail, a top-k mask only the ranking, which
    survived a long warm-up (MiniLM question generation after half the run of softmax) and not a short one. One
    line, said once, when it can still be acted on."""
    loss = float(sparse_softmax_loss(logits, target, k, reduction="mean"))
    if loss <= math.log(k):
        return None
    slope = float(flat_slope(logits, target, k).mean())
    return (f"sparse_softmax: the softmax warm-up hands over at update {update} a model that scores "
            f"{loss / math.log(2):.2f} bits on the Sparse-softmax loss (k = {k}), more than flat logits' "
            f"log2 {k} = {math.log2(k):.2f} (flat_slope {slope:+.2f}): training on flattens its logits and its "
            "nll_loss will rise, so plain beam search will read a flat tail. Decode it inside its top k "
            "(fairseq's --decoding-topk, generate()'s TopKRenormalise), where its ranking can hold (it did after "
            "half the run of softmax, not after 10 %), or train with a larger k, whose log k the model beats, or "
            "with cross_entropy or as_softmax (docs/criterions.md, 'Which regime')")


#: Rows a training run measures the flat slope on per batch (evenly spaced): a top k over a few hundred rows costs
#: nothing beside the batch's loss, and the log averages it over many batches.
SLOPE_ROWS = 256


def slope_rows(target: Tensor, ignore_index: int | None, limit: int = SLOPE_ROWS) -> Tensor:
    """Indices of up to ``limit`` evenly spaced counted rows of ``target (N,)``: the sample whose ``flat_slope`` a
    training loop logs (chosen before the logits, so a fused output layer forms them for these rows only)."""
    rows = torch.arange(target.size(0), device=target.device)
    if ignore_index is not None:
        rows = rows[target != ignore_index]
    return rows[:: max(1, rows.numel() // limit)][:limit]


def _counted_top(logits: Tensor, target: Tensor, k: int, ignore_index: int | None) -> tuple[Tensor, Tensor, Tensor]:
    """The counted rows' logits (their own dtype), target logits ``(N, 1)`` and top k (both float64: exact copies,
    so the N × V logits are never cast, which the criterion's every batch would pay for)."""
    rows = prepare_rows(logits, target, ignore_index, "none")
    check_range("k", k, 1, logits.shape[1])
    z = logits[rows.valid]
    z_t = z.gather(1, rows.target[rows.valid, None]).double()
    return z, z_t, z.topk(int(k), dim=-1, sorted=False).values.double()
