"""``--criterion as_softmax`` / ``as_multilabel``: AS-Softmax training (Lv et al.) with the paper's δ warm-up or
the published code's δ annealing, for one label per row and for multi-label data (Su's loss restricted to the
classes AS keeps)."""

from dataclasses import dataclass, field

from fairseq.criterions import register_criterion
from omegaconf import II

from sparse_softmax.losses import as_multilabel_loss, as_softmax
from sparse_softmax.schedules import as_delta, check_as_schedule

from ..fairseq_compat import num_updates
from ..options import UsageError, in_range
from .base import FusedOutputConfig, LossCriterion, LossOutput, check_warmup


@dataclass
class ASSoftmaxConfig(FusedOutputConfig):
    as_delta: float = field(
        default=0.3,
        metadata={"help": "drop class i from the softmax when p_target - p_i > delta (0 <= delta <= 1; "
                  "1 = plain softmax, and a warning says so at start)", "check": in_range(0, 1)},
    )
    as_warmup_ratio: float = field(
        default=0.0,
        metadata={"help": "train with delta = 1 (plain softmax) for this fraction of --max-update first; "
                  "the update count comes from fairseq, so resuming from a checkpoint continues the schedule",
                  "check": in_range(0, 1, high_open=True)},
    )
    as_anneal_ratio: float = field(
        default=0.0,
        metadata={"help": "instead of a warm-up, lower delta linearly from --as-anneal-from to --as-delta over this "
                  "fraction of --max-update (the published AS code's annealing: 1.0 to a minimum of 0.1), then keep "
                  "--as-delta", "check": in_range(0, 1)},
    )
    as_anneal_from: float = field(
        default=1.0,
        metadata={"help": "the delta --as-anneal-ratio starts from (at least --as-delta)", "check": in_range(0, 1)},
    )
    max_update: int = II("optimization.max_update")


@register_criterion("as_softmax", dataclass=ASSoftmaxConfig)
class ASSoftmaxCriterion(LossCriterion):
    # dense_ratio: rows that keep every class (their gradient is dense; only those take the full
    # products of the output layer's backward with --fused-output-layer)
    ratios = {"masked_ratio": ("n_masked", "n_rows"), "dense_ratio": ("n_dense", "n_rows"),
              "as_delta": ("delta_x_rows", "n_rows")}
    counts_masked_rows = True  # logs n_masked, which AS-Speed reads

    def __init__(self, cfg: ASSoftmaxConfig, task):
        super().__init__(cfg, task)
        check_warmup("--as-warmup-ratio", cfg.as_warmup_ratio, cfg.max_update)
        check_warmup("--as-anneal-ratio", cfg.as_anneal_ratio, cfg.max_update)
        try:
            check_as_schedule(cfg.as_delta, cfg.as_warmup_ratio, cfg.as_anneal_ratio, cfg.as_anneal_from,
                              name=lambda keyword: "--as-" + keyword.replace("_", "-"))
        except ValueError as err:
            raise UsageError(str(err)) from None

    def same_as(self, num_classes):
        if self.cfg.as_delta == 1:
            return "--as-delta 1: AS-Softmax keeps every class, so it trains plain softmax cross-entropy"
        return None

    def current_delta(self, model) -> float:
        cfg = self.cfg
        return as_delta(cfg.as_delta, num_updates(model), cfg.max_update or 0, cfg.as_warmup_ratio,
                        cfg.as_anneal_ratio, cfg.as_anneal_from)

    def row_loss(self, batch, model, reduction):
        delta = self.current_delta(model)
        if batch.features is not None:
            out = self.fused_loss(batch, reduction, "as_softmax", delta=delta)
        else:
            out = as_softmax(batch.logits, batch.target, delta, batch.ignore_index, reduction)
        counts = {"n_masked": out.n_masked, "n_dense": out.n_dense, "delta_x_rows": delta * batch.n_rows}
        return LossOutput(out.loss, out.nll, counts)


@register_criterion("as_multilabel", dataclass=ASSoftmaxConfig)
class ASMultilabelCriterion(ASSoftmaxCriterion):
    """Needs ``--multi-label``; a row is masked when AS keeps none of its classes (loss and gradient 0)."""

    multi_label = True
    ratios = {name: counts for name, counts in ASSoftmaxCriterion.ratios.items() if name != "dense_ratio"}

    def same_as(self, num_classes):
        if self.cfg.as_delta == 1:
            return "--as-delta 1: AS-Softmax keeps every class, so it trains Su's multi-label loss (multilabel_softmax)"
        return None

    def row_loss(self, batch, model, reduction):
        delta = self.current_delta(model)
        loss, n_masked = as_multilabel_loss(batch.logits, batch.target, delta, reduction, return_masked=True)
        return LossOutput(loss, None, {"n_masked": n_masked, "delta_x_rows": delta * batch.n_rows})
