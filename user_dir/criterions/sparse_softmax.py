"""``--criterion sparse_softmax``: Sparse-softmax training (Sun et al. 2021)."""

from dataclasses import dataclass, field

from fairseq.criterions import register_criterion

from ..losses import sparse_softmax_loss
from .base import LossOutput, LossConfig, LossCriterion


@dataclass
class SparseSoftmaxConfig(LossConfig):
    sparse_topk: int = field(
        default=10,
        metadata={"help": "normalise the softmax over the k largest logits only (SPACES default 10); "
                  "the target is not added to the support when it falls outside the top k; "
                  "k >= vocabulary size is plain softmax"},
    )
    label_smoothing: float = field(
        default=0.0,
        metadata={"help": "epsilon spread uniformly over the k kept classes (not the whole vocabulary, "
                  "whose classes outside the top k have probability 0)"},
    )


@register_criterion("sparse_softmax", dataclass=SparseSoftmaxConfig)
class SparseSoftmaxCriterion(LossCriterion):
    def __init__(self, task, sentence_avg, sparse_topk, label_smoothing, ignore_prefix_size=0):
        super().__init__(task, sentence_avg, ignore_prefix_size)
        if sparse_topk < 1:
            raise ValueError(f"--sparse-topk must be >= 1, got {sparse_topk}")
        self.k = sparse_topk
        self.eps = label_smoothing

    def row_loss(self, batch, model, reduction):
        k = min(self.k, batch.logits.size(-1))  # top-V of V classes is the full softmax, exactly
        loss = sparse_softmax_loss(batch.logits, batch.target, k, batch.ignore_index, reduction, self.eps)
        return LossOutput(loss)
