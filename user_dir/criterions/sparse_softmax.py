"""``--criterion sparse_softmax``: Sparse-softmax training (Sun et al. 2021), with an optional softmax warm-up."""

import logging
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq.criterions import register_criterion
from omegaconf import II

from sparse_softmax.diagnostics import flat_slope, handover_warning, slope_rows
from sparse_softmax.losses import softmax_loss, sparse_softmax_loss
from sparse_softmax.schedules import in_warmup, warmup_end

from ..fairseq_compat import num_updates
from ..options import at_least, in_range
from .base import FusedOutputConfig, LossCriterion, LossOutput, check_warmup

logger = logging.getLogger(__name__)


@dataclass
class SparseSoftmaxConfig(FusedOutputConfig):
    sparse_topk: int = field(
        default=10,
        metadata={"help": "normalise the softmax over the k largest logits only (SPACES default 10); "
                  "the target is not added to the support when it falls outside the top k; "
                  "k >= the number of classes (vocabulary size) is plain softmax, and a warning says so at start",
                  "check": at_least(1)},
    )
    label_smoothing: float = field(
        default=0.0,
        metadata={"help": "epsilon spread uniformly over the k kept classes (not the whole vocabulary, "
                  "whose classes outside the top k have probability 0)", "check": in_range(0, 1)},
    )
    sparse_warmup_ratio: float = field(
        default=0.0,
        metadata={"help": "train plain softmax cross-entropy over every class for this fraction of --max-update "
                  "first, then sparse_softmax (as AS-Softmax's delta = 1 warm-up): the top k only means something "
                  "once the model ranks the vocabulary (docs/criterions.md, 'Which regime', says when it is "
                  "enough); a warning at the switch says when flat logits beat the model it hands over. The update count comes from fairseq, so resuming from a checkpoint "
                  "continues the schedule",
                  "check": in_range(0, 1, high_open=True)},
    )
    max_update: int = II("optimization.max_update")


@register_criterion("sparse_softmax", dataclass=SparseSoftmaxConfig)
class SparseSoftmaxCriterion(LossCriterion):
    # sparse_warmup: the share of rows trained with plain softmax (1 during the warm-up, then 0);
    # flat_slope: mean(topk(z)) - z_t in nats, > 0 while the loss is lowest for flat logits (see slope_sample)
    ratios = {"sparse_warmup": ("n_warmup_rows", "n_rows"), "flat_slope": ("flat_slope_sum", "n_slope_rows")}

    def __init__(self, cfg: SparseSoftmaxConfig, task):
        super().__init__(cfg, task)
        check_warmup("--sparse-warmup-ratio", cfg.sparse_warmup_ratio, cfg.max_update)
        # the first update after the warm-up, whose model handover_warning judges (once)
        self.handover = warmup_end(cfg.sparse_warmup_ratio, cfg.max_update) if cfg.sparse_warmup_ratio else None

    def same_as(self, num_classes):
        k = self.cfg.sparse_topk
        if k >= num_classes:
            return (f"--sparse-topk {k} >= {num_classes} classes: sparse_softmax keeps every class, "
                    "so it trains plain softmax cross-entropy")
        return None

    def row_loss(self, batch, model, reduction):
        cfg = self.cfg
        update = num_updates(model)
        warm = in_warmup(cfg.sparse_warmup_ratio, cfg.max_update or 0, update)
        eps = cfg.label_smoothing  # over the k kept classes; in the warm-up all are kept: plain smoothing
        k = min(cfg.sparse_topk, batch.num_classes)  # top-V of V classes is the full softmax, exactly
        logits, target = slope_sample(batch)
        counts = {"n_warmup_rows": batch.n_rows if warm else batch.n_rows * 0,
                  "flat_slope_sum": flat_slope(logits, target, k).sum(), "n_slope_rows": target.new_tensor(len(target))}
        if model.training and update == self.handover:
            self.handover = None
            message = handover_warning(logits, target, k, update)
            if message:
                logger.warning(message)
        if batch.features is not None:
            out = (self.fused_loss(batch, reduction, "cross_entropy", label_smoothing=eps) if warm
                   else self.fused_loss(batch, reduction, "sparse_softmax", k=k, label_smoothing=eps))
            return LossOutput(out.loss, out.nll, counts)
        if warm:
            return LossOutput(softmax_loss(batch.logits, batch.target, batch.ignore_index, reduction, eps), None, counts)
        return LossOutput(sparse_softmax_loss(batch.logits, batch.target, k, batch.ignore_index, reduction, eps),
                          None, counts)


@torch.no_grad()
def slope_sample(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits and targets of up to 256 evenly spaced counted rows of the batch (``slope_rows``), detached.

    On them the criterion logs ``flat_slope``, ``mean(topk(z)) - z_t``: the derivative of the Sparse-softmax loss
    in a common scale of the logits as that scale goes to 0 (``sparse_softmax.diagnostics.flat_slope``). While it is
    positive on average, flat logits score ``log k``, lower than the model's own, and training on lowers the loss
    by flattening them: a run that collapses shows it positive while its loss falls to about log2 k bits. Logged
    in the softmax warm-up too, it tells when the model ranks its targets high enough for the top k to take over
    (docs/criterions.md); and on the first batch after the warm-up, ``handover_warning`` says whether it does."""
    rows = slope_rows(batch.target, batch.ignore_index)
    if batch.logits is not None:
        return batch.logits[rows].detach(), batch.target[rows]
    return F.linear(batch.features[rows], batch.projection.weight, batch.projection.bias), batch.target[rows]
