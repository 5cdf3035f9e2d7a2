"""Criterions for the softmax alternatives the papers compare against; each wraps one loss function.

Label smoothing is fairseq's own ``label_smoothed_cross_entropy`` and plain softmax is
``cross_entropy``: the plugin does not duplicate them.
"""

from dataclasses import dataclass, field

from fairseq.criterions import register_criterion
from fairseq.dataclass import ChoiceEnum

from ..losses import (
    am_softmax_loss,
    entmax15_loss,
    sm_taylor_softmax_loss,
    soft_margin_softmax_loss,
    sparsemax_loss,
    taylor_softmax_loss,
    temperature_softmax_loss,
)
from ..losses._common import compute_dtype
from ..losses.taylor import GRADIENTS
from .base import TokenLoss, TokenLossConfig, TokenLossCriterion


def _margin_field(default: float):
    return field(default=default, metadata={"help": "margin m subtracted from the target score during training"})


def _order_field():
    return field(default=2, metadata={"help": "Taylor expansion order n (even, >= 2)"})


@dataclass
class TemperatureConfig(TokenLossConfig):
    softmax_temperature: float = field(default=1.0, metadata={"help": "train with CE(logits / T)"})


@dataclass
class SoftMarginConfig(TokenLossConfig):
    softmax_margin: float = _margin_field(0.5)


@dataclass
class AMSoftmaxConfig(TokenLossConfig):
    softmax_margin: float = _margin_field(0.35)


@dataclass
class TaylorConfig(TokenLossConfig):
    taylor_order: int = _order_field()
    taylor_gradient: ChoiceEnum(GRADIENTS) = field(
        default="exact",
        metadata={"help": "'exact' (autograd) or 'inf' (the paper's p - y, the infinite-order gradient)"},
    )


@dataclass
class SMTaylorConfig(TokenLossConfig):
    taylor_order: int = _order_field()
    softmax_margin: float = _margin_field(0.5)


@register_criterion("temperature_softmax", dataclass=TemperatureConfig)
class TemperatureSoftmaxCriterion(TokenLossCriterion):
    def __init__(self, task, sentence_avg, softmax_temperature, ignore_prefix_size=0):
        super().__init__(task, sentence_avg, ignore_prefix_size)
        self.temperature = softmax_temperature

    def token_loss(self, logits, target, model, reduction):
        return TokenLoss(temperature_softmax_loss(logits, target, self.temperature, self.padding_idx, reduction))


@register_criterion("soft_margin_softmax", dataclass=SoftMarginConfig)
class SoftMarginSoftmaxCriterion(TokenLossCriterion):
    def __init__(self, task, sentence_avg, softmax_margin, ignore_prefix_size=0):
        super().__init__(task, sentence_avg, ignore_prefix_size)
        self.margin = softmax_margin

    def token_loss(self, logits, target, model, reduction):
        return TokenLoss(soft_margin_softmax_loss(logits, target, self.margin, self.padding_idx, reduction))


@register_criterion("am_softmax", dataclass=AMSoftmaxConfig)
class AMSoftmaxCriterion(TokenLossCriterion):
    """Needs ``--arch cosine_transformer*``, whose logits are ``s·cos``; the scale s is the model's."""

    def __init__(self, task, sentence_avg, softmax_margin, ignore_prefix_size=0):
        super().__init__(task, sentence_avg, ignore_prefix_size)
        self.margin = softmax_margin

    def token_loss(self, logits, target, model, reduction):
        scale = getattr(model.decoder, "cosine_scale", None)
        if scale is None:
            raise ValueError("--criterion am_softmax needs cosine logits: train with --arch cosine_transformer "
                             "(or cosine_transformer_tiny)")
        cosine = logits.to(compute_dtype(logits)) / scale  # divide after the float32 cast, not in bf16
        loss = am_softmax_loss(cosine, target, self.margin, scale, self.padding_idx, reduction)
        return TokenLoss(loss)


@register_criterion("taylor_softmax", dataclass=TaylorConfig)
class TaylorSoftmaxCriterion(TokenLossCriterion):
    def __init__(self, task, sentence_avg, taylor_order, taylor_gradient, ignore_prefix_size=0):
        super().__init__(task, sentence_avg, ignore_prefix_size)
        self.order, self.gradient = taylor_order, taylor_gradient

    def token_loss(self, logits, target, model, reduction):
        return TokenLoss(taylor_softmax_loss(logits, target, self.order, self.gradient, self.padding_idx, reduction))


@register_criterion("sm_taylor_softmax", dataclass=SMTaylorConfig)
class SMTaylorSoftmaxCriterion(TokenLossCriterion):
    def __init__(self, task, sentence_avg, taylor_order, softmax_margin, ignore_prefix_size=0):
        super().__init__(task, sentence_avg, ignore_prefix_size)
        self.order, self.margin = taylor_order, softmax_margin

    def token_loss(self, logits, target, model, reduction):
        return TokenLoss(sm_taylor_softmax_loss(logits, target, self.order, self.margin, self.padding_idx, reduction))


@register_criterion("sparsemax", dataclass=TokenLossConfig)
class SparsemaxCriterion(TokenLossCriterion):
    def token_loss(self, logits, target, model, reduction):
        return TokenLoss(sparsemax_loss(logits, target, self.padding_idx, reduction))


@register_criterion("entmax15", dataclass=TokenLossConfig)
class Entmax15Criterion(TokenLossCriterion):
    def token_loss(self, logits, target, model, reduction):
        return TokenLoss(entmax15_loss(logits, target, self.padding_idx, reduction))
