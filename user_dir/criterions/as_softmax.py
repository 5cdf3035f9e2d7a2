"""``--criterion as_softmax`` / ``as_multilabel``: AS-Softmax training (Lv et al.) with the paper's δ warm-up,
for one label per row and for multi-label data (Su's loss restricted to the classes AS keeps)."""

from dataclasses import dataclass, field

from fairseq.criterions import register_criterion
from omegaconf import II

from ..fairseq_compat import num_updates
from ..losses import as_multilabel_loss, as_softmax
from .base import LossOutput, LossConfig, LossCriterion


@dataclass
class ASSoftmaxConfig(LossConfig):
    as_delta: float = field(
        default=0.3,
        metadata={"help": "drop class i from the softmax when p_target - p_i > delta (0 <= delta <= 1; 1 = plain softmax)"},
    )
    as_warmup_ratio: float = field(
        default=0.0,
        metadata={"help": "train with delta = 1 (plain softmax) for this fraction of --max-update first; "
                  "the update count comes from fairseq, so resuming from a checkpoint continues the schedule"},
    )
    max_update: int = II("optimization.max_update")


def warmup_delta(delta: float, warmup_ratio: float, max_update: int, update: int) -> float:
    """δ = 1 while ``update < warmup_ratio · max_update``, then the configured δ."""
    return 1.0 if update < warmup_ratio * max_update else delta


@register_criterion("as_softmax", dataclass=ASSoftmaxConfig)
class ASSoftmaxCriterion(LossCriterion):
    ratios = {"masked_ratio": ("n_masked", "n_rows"), "as_delta": ("delta_x_rows", "n_rows")}

    def __init__(self, task, sentence_avg, as_delta, as_warmup_ratio, max_update, ignore_prefix_size=0):
        super().__init__(task, sentence_avg, ignore_prefix_size)
        if not 0.0 <= as_delta <= 1.0:
            raise ValueError(f"--as-delta must be in [0, 1], got {as_delta}")
        if not 0.0 <= as_warmup_ratio < 1.0:
            raise ValueError(f"--as-warmup-ratio must be in [0, 1), got {as_warmup_ratio}")
        if as_warmup_ratio > 0 and not max_update:
            raise ValueError("--as-warmup-ratio is a fraction of --max-update: set --max-update")
        self.delta = as_delta
        self.warmup_ratio = as_warmup_ratio
        self.max_update = max_update or 0

    def current_delta(self, model) -> float:
        return warmup_delta(self.delta, self.warmup_ratio, self.max_update, num_updates(model))

    def row_loss(self, batch, model, reduction):
        delta = self.current_delta(model)
        out = as_softmax(batch.logits, batch.target, delta, batch.ignore_index, reduction)
        return LossOutput(out.loss, out.nll, {"n_masked": out.n_masked, "delta_x_rows": delta * batch.n_rows})


@register_criterion("as_multilabel", dataclass=ASSoftmaxConfig)
class ASMultilabelCriterion(ASSoftmaxCriterion):
    """Needs ``--multi-label``; a row is masked when AS keeps none of its classes (loss and gradient 0)."""

    multi_label = True

    def row_loss(self, batch, model, reduction):
        delta = self.current_delta(model)
        loss, n_masked = as_multilabel_loss(batch.logits, batch.target, delta, reduction, return_masked=True)
        return LossOutput(loss, None, {"n_masked": n_masked, "delta_x_rows": delta * batch.n_rows})
