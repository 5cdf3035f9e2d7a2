"""``--criterion sparse_softmax``: Sparse-softmax training (Sun et al. 2021)."""

from dataclasses import dataclass, field

from fairseq.criterions import register_criterion

from ..losses import sparse_softmax_loss
from ..options import at_least, in_range
from .base import FusedOutputConfig, LossCriterion, LossOutput


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


@register_criterion("sparse_softmax", dataclass=SparseSoftmaxConfig)
class SparseSoftmaxCriterion(LossCriterion):
    def same_as(self, num_classes):
        k = self.cfg.sparse_topk
        if k >= num_classes:
            return (f"--sparse-topk {k} >= {num_classes} classes: sparse_softmax keeps every class, "
                    "so it trains plain softmax cross-entropy")
        return None

    def row_loss(self, batch, model, reduction):
        k = min(self.cfg.sparse_topk, batch.num_classes)  # top-V of V classes is the full softmax, exactly
        eps = self.cfg.label_smoothing
        if batch.features is not None:
            out = self.fused_loss(batch, reduction, "sparse_softmax", k=k, label_smoothing=eps)
            return LossOutput(out.loss, out.nll)
        return LossOutput(sparse_softmax_loss(batch.logits, batch.target, k, batch.ignore_index, reduction, eps))
