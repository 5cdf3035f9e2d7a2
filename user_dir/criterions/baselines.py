"""Criterions for the softmax alternatives the papers compare against; each wraps one loss function.

For seq2seq tasks fairseq's own ``cross_entropy`` and ``label_smoothed_cross_entropy`` do the same as
``softmax``; ``softmax`` exists because fairseq's criterions cannot score ``--task text_classification``.
"""

from dataclasses import dataclass, field

from fairseq.criterions import register_criterion
from fairseq.dataclass import ChoiceEnum

from ..losses import (
    am_softmax_loss,
    entmax15_loss,
    multilabel_categorical_crossentropy,
    sm_taylor_softmax_loss,
    soft_margin_softmax_loss,
    softmax_loss,
    sparsemax_loss,
    taylor_softmax_loss,
    temperature_softmax_loss,
)
from ..losses._common import compute_dtype
from ..losses.taylor import GRADIENTS
from .base import LossOutput, LossConfig, LossCriterion


def _margin_field(default: float):
    return field(default=default, metadata={"help": "margin m subtracted from the target score during training"})


def _order_field():
    return field(default=2, metadata={"help": "Taylor expansion order n (even, >= 2)"})


@dataclass
class SoftmaxConfig(LossConfig):
    label_smoothing: float = field(
        default=0.0,
        metadata={"help": "epsilon: (1 - eps) * CE + eps * mean over all classes of -log p (torch's label smoothing)"},
    )


@dataclass
class TemperatureConfig(LossConfig):
    softmax_temperature: float = field(default=1.0, metadata={"help": "train with CE(logits / T)"})


@dataclass
class SoftMarginConfig(LossConfig):
    softmax_margin: float = _margin_field(0.5)


@dataclass
class AMSoftmaxConfig(LossConfig):
    softmax_margin: float = _margin_field(0.35)


@dataclass
class TaylorConfig(LossConfig):
    taylor_order: int = _order_field()
    taylor_gradient: ChoiceEnum(GRADIENTS) = field(
        default="exact",
        metadata={"help": "'exact' (autograd) or 'inf' (the paper's p - y, the infinite-order gradient)"},
    )


@dataclass
class SMTaylorConfig(LossConfig):
    taylor_order: int = _order_field()
    softmax_margin: float = _margin_field(0.5)


@register_criterion("softmax", dataclass=SoftmaxConfig)
class SoftmaxCriterion(LossCriterion):
    """Plain softmax cross-entropy, optionally label-smoothed: the baseline every other loss is compared with."""

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0):
        super().__init__(task, sentence_avg, ignore_prefix_size)
        self.eps = label_smoothing

    def row_loss(self, batch, model, reduction):
        return LossOutput(softmax_loss(batch.logits, batch.target, batch.ignore_index, reduction, self.eps))


@register_criterion("temperature_softmax", dataclass=TemperatureConfig)
class TemperatureSoftmaxCriterion(LossCriterion):
    def __init__(self, task, sentence_avg, softmax_temperature, ignore_prefix_size=0):
        super().__init__(task, sentence_avg, ignore_prefix_size)
        self.temperature = softmax_temperature

    def row_loss(self, batch, model, reduction):
        return LossOutput(temperature_softmax_loss(batch.logits, batch.target, self.temperature, batch.ignore_index, reduction))


@register_criterion("soft_margin_softmax", dataclass=SoftMarginConfig)
class SoftMarginSoftmaxCriterion(LossCriterion):
    def __init__(self, task, sentence_avg, softmax_margin, ignore_prefix_size=0):
        super().__init__(task, sentence_avg, ignore_prefix_size)
        self.margin = softmax_margin

    def row_loss(self, batch, model, reduction):
        return LossOutput(soft_margin_softmax_loss(batch.logits, batch.target, self.margin, batch.ignore_index, reduction))


@register_criterion("am_softmax", dataclass=AMSoftmaxConfig)
class AMSoftmaxCriterion(LossCriterion):
    """Needs cosine logits ``s·cos`` (``--arch cosine_transformer*``, or ``--classifier cosine`` for
    classification); the scale s is the model's."""

    def __init__(self, task, sentence_avg, softmax_margin, ignore_prefix_size=0):
        super().__init__(task, sentence_avg, ignore_prefix_size)
        self.margin = softmax_margin

    def row_loss(self, batch, model, reduction):
        scale = batch.cosine_scale
        if scale is None:
            raise ValueError("--criterion am_softmax needs cosine logits: train with --arch cosine_transformer "
                             "(or cosine_transformer_tiny), or --classifier cosine with --task text_classification")
        cosine = batch.logits.to(compute_dtype(batch.logits)) / scale  # divide after the float32 cast, not in bf16
        loss = am_softmax_loss(cosine, batch.target, self.margin, scale, batch.ignore_index, reduction)
        return LossOutput(loss)


@register_criterion("taylor_softmax", dataclass=TaylorConfig)
class TaylorSoftmaxCriterion(LossCriterion):
    def __init__(self, task, sentence_avg, taylor_order, taylor_gradient, ignore_prefix_size=0):
        super().__init__(task, sentence_avg, ignore_prefix_size)
        self.order, self.gradient = taylor_order, taylor_gradient

    def row_loss(self, batch, model, reduction):
        return LossOutput(taylor_softmax_loss(batch.logits, batch.target, self.order, self.gradient, batch.ignore_index, reduction))


@register_criterion("sm_taylor_softmax", dataclass=SMTaylorConfig)
class SMTaylorSoftmaxCriterion(LossCriterion):
    def __init__(self, task, sentence_avg, taylor_order, softmax_margin, ignore_prefix_size=0):
        super().__init__(task, sentence_avg, ignore_prefix_size)
        self.order, self.margin = taylor_order, softmax_margin

    def row_loss(self, batch, model, reduction):
        return LossOutput(sm_taylor_softmax_loss(batch.logits, batch.target, self.order, self.margin, batch.ignore_index, reduction))


@register_criterion("sparsemax", dataclass=LossConfig)
class SparsemaxCriterion(LossCriterion):
    def row_loss(self, batch, model, reduction):
        return LossOutput(sparsemax_loss(batch.logits, batch.target, batch.ignore_index, reduction))


@register_criterion("entmax15", dataclass=LossConfig)
class Entmax15Criterion(LossCriterion):
    def row_loss(self, batch, model, reduction):
        return LossOutput(entmax15_loss(batch.logits, batch.target, batch.ignore_index, reduction))


@register_criterion("multilabel_softmax", dataclass=LossConfig)
class MultilabelSoftmaxCriterion(LossCriterion):
    """Su's multi-label categorical cross-entropy (needs ``--multi-label``); predict the classes scored > 0."""

    multi_label = True

    def row_loss(self, batch, model, reduction):
        return LossOutput(multilabel_categorical_crossentropy(batch.logits, batch.target, reduction))
