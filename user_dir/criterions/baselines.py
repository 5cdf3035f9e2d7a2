"""Criterions for the softmax alternatives the papers compare against; each wraps one loss function.

For seq2seq tasks fairseq's own ``cross_entropy`` and ``label_smoothed_cross_entropy`` do the same as
``softmax``; ``softmax`` exists because fairseq's criterions cannot score ``--task text_classification``.
"""

from dataclasses import dataclass, field

from fairseq.criterions import register_criterion
from fairseq.dataclass import ChoiceEnum

from sparse_softmax.losses import (
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
from sparse_softmax.losses._common import compute_dtype
from sparse_softmax.losses.taylor import GRADIENTS

from ..options import UsageError, at_least, even_at_least_2, in_range, positive
from .base import FusedOutputConfig, LossConfig, LossCriterion, LossOutput


def _margin_field(default: float):
    return field(default=default, metadata={"help": "margin m subtracted from the target score during training",
                                            "check": at_least(0)})


def _order_field():
    return field(default=2, metadata={"help": "Taylor expansion order n (even, >= 2)", "check": even_at_least_2})


@dataclass
class SoftmaxConfig(FusedOutputConfig):
    label_smoothing: float = field(
        default=0.0,
        metadata={"help": "epsilon: (1 - eps) * CE + eps * mean over all classes of -log p (torch's label smoothing)",
                  "check": in_range(0, 1)},
    )


@dataclass
class TemperatureConfig(LossConfig):
    softmax_temperature: float = field(
        default=1.0,
        metadata={"help": "train with CE(logits / T); T = 1 is plain softmax, and a warning says so at start",
                  "check": positive()},
    )


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

    def row_loss(self, batch, model, reduction):
        eps = self.cfg.label_smoothing
        if batch.features is not None:
            out = self.fused_loss(batch, reduction, "cross_entropy", label_smoothing=eps)
            return LossOutput(out.loss, out.nll)
        return LossOutput(softmax_loss(batch.logits, batch.target, batch.ignore_index, reduction, eps))


@register_criterion("temperature_softmax", dataclass=TemperatureConfig)
class TemperatureSoftmaxCriterion(LossCriterion):
    def same_as(self, num_classes):
        if self.cfg.softmax_temperature == 1:
            return "--softmax-temperature 1: temperature_softmax trains plain softmax cross-entropy"
        return None

    def row_loss(self, batch, model, reduction):
        loss = temperature_softmax_loss(batch.logits, batch.target, self.cfg.softmax_temperature,
                                        batch.ignore_index, reduction)
        return LossOutput(loss)


@register_criterion("soft_margin_softmax", dataclass=SoftMarginConfig)
class SoftMarginSoftmaxCriterion(LossCriterion):
    def same_as(self, num_classes):
        if self.cfg.softmax_margin == 0:
            return "--softmax-margin 0: soft_margin_softmax trains plain softmax cross-entropy"
        return None

    def row_loss(self, batch, model, reduction):
        loss = soft_margin_softmax_loss(batch.logits, batch.target, self.cfg.softmax_margin, batch.ignore_index,
                                        reduction)
        return LossOutput(loss)


@register_criterion("am_softmax", dataclass=AMSoftmaxConfig)
class AMSoftmaxCriterion(LossCriterion):
    """Needs cosine logits ``s·cos`` (``--arch cosine_transformer*``, or ``--classifier cosine`` for
    classification); the scale s is the model's."""

    def row_loss(self, batch, model, reduction):
        scale = batch.cosine_scale
        if scale is None:
            raise UsageError("--criterion am_softmax needs cosine logits: train with --arch cosine_transformer "
                             "(or cosine_transformer_tiny), or --classifier cosine with --task text_classification")
        cosine = batch.logits.to(compute_dtype(batch.logits)) / scale  # divide after the float32 cast, not in bf16
        loss = am_softmax_loss(cosine, batch.target, self.cfg.softmax_margin, scale, batch.ignore_index, reduction)
        return LossOutput(loss)


@register_criterion("taylor_softmax", dataclass=TaylorConfig)
class TaylorSoftmaxCriterion(LossCriterion):
    def row_loss(self, batch, model, reduction):
        cfg = self.cfg
        loss = taylor_softmax_loss(batch.logits, batch.target, cfg.taylor_order, cfg.taylor_gradient,
                                   batch.ignore_index, reduction)
        return LossOutput(loss)


@register_criterion("sm_taylor_softmax", dataclass=SMTaylorConfig)
class SMTaylorSoftmaxCriterion(LossCriterion):
    def same_as(self, num_classes):
        if self.cfg.softmax_margin == 0:
            return "--softmax-margin 0: sm_taylor_softmax trains taylor_softmax (exact gradient)"
        return None

    def row_loss(self, batch, model, reduction):
        cfg = self.cfg
        loss = sm_taylor_softmax_loss(batch.logits, batch.target, cfg.taylor_order, cfg.softmax_margin,
                                      batch.ignore_index, reduction)
        return LossOutput(loss)


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
