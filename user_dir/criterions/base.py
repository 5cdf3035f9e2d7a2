"""The shared shell of every criterion: fairseq bookkeeping around a loss function.

A criterion scores *rows*: one row per target token for a seq2seq task, one per example (or per
labelled token) for ``--task text_classification``. Where the rows come from is the task's business:
a task that defines ``loss_batch(model, sample) -> LossBatch`` supplies them (logits, targets, what to
ignore, extra counts to log); otherwise they are the decoder logits and targets of a seq2seq sample.
Subclasses implement ``row_loss(batch, model, reduction)`` with a function from ``sparse_softmax.losses``; this
class reports a plain softmax ``nll_loss`` of the same logits (so runs compare with ``cross_entropy``
and ``label_smoothed_cross_entropy``), and aggregates the logs.

A criterion is built from its config dataclass whole (``__init__(cfg, task)``), whose fields declare
their help and value checks (``user_dir.options``); a setting that makes the loss another, simpler
method (``--sparse-topk`` at least the number of classes is plain softmax) is announced in one
warning line at start (``same_as``).

With ``--fused-output-layer`` (softmax, sparse_softmax, as_softmax) a seq2seq batch carries the
decoder's features and its output projection instead of logits, and the criterion scores them with
``sparse_softmax.fused_output_loss``: the same loss and logs, without the N×V logits and with a
sparse backward where the loss's gradient is sparse.
"""

import logging
import math
from dataclasses import dataclass, field
from typing import Dict, NamedTuple, Optional

import torch
from fairseq.criterions import FairseqCriterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics
from fairseq.models.transformer import TransformerDecoderBase
from omegaconf import II
from torch import Tensor, nn

from sparse_softmax.losses import LossResult, fused_output_loss, softmax_loss

from ..options import CheckedArgs, UsageError, at_least, validate

logger = logging.getLogger(__name__)


@dataclass
class LossConfig(FairseqDataclass):
    sentence_avg: bool = II("optimization.sentence_avg")
    ignore_prefix_size: int = field(
        default=0, metadata={"help": "ignore the first N target tokens (e.g. a language tag)", "check": at_least(0)}
    )


@dataclass
class FusedOutputConfig(LossConfig):
    """The config of the criterions that can score a decoder's features directly."""

    fused_output_layer: bool = field(
        default=False,
        metadata={"help": "compute the output layer and the loss together from the decoder's features, block "
                  "by block (on a GPU by Triton kernels): the N x V logits and their gradient are never formed, "
                  "sparse_softmax's backward touches k + 1 classes a row and as_softmax's skips the masked rows. "
                  "Same loss, logs and checkpoints; for seq2seq models "
                  "whose output layer is a plain linear projection (not --task text_classification)"},
    )


class LossBatch(NamedTuple):
    """The rows a criterion scores, as the task prepares them."""

    logits: Optional[Tensor]  # (N, V) raw scores (None when the criterion scores features itself)
    target: Tensor  # (N,) class indices, or (N, V) multi-hot for multi-label tasks
    ignore_index: Optional[int]  # target value of rows that do not count (padding)
    n_rows: Tensor  # rows that count
    sample_size: int | Tensor  # what the summed loss is divided by (fairseq's sample_size)
    cosine_scale: Optional[float] = None  # s when the logits are s·cos (AM-softmax), else None
    logging: Optional[Dict[str, Tensor]] = None  # summable counts the task logs (e.g. per-class hits)
    features: Optional[Tensor] = None  # (N, H) decoder features, with --fused-output-layer
    projection: Optional[nn.Linear] = None  # the decoder's output layer, with --fused-output-layer

    @property
    def num_classes(self) -> int:
        return self.logits.size(-1) if self.logits is not None else self.projection.out_features


class LossOutput(NamedTuple):
    loss: Tensor  # summed over the rows that count (per row when reduce=False)
    nll: Optional[Tensor] = None  # plain CE of the same logits, if the loss computed it anyway
    counts: Optional[Dict[str, Tensor]] = None  # extra summable counts to log (e.g. masked rows)


class LossCriterion(CheckedArgs, FairseqCriterion):
    # Logged ratios: metric name -> (numerator count, denominator count), both in logging outputs.
    ratios: dict[str, tuple[str, str]] = {}
    #: True for losses over multi-hot label sets; the task and the criterion must agree.
    multi_label = False

    def __init__(self, cfg: LossConfig, task):
        super().__init__(task)
        validate(cfg, getattr(type(self), "__dataclass"))
        self.cfg = cfg
        self.sentence_avg = cfg.sentence_avg
        self.ignore_prefix_size = cfg.ignore_prefix_size
        self.fused = bool(getattr(cfg, "fused_output_layer", False))
        if self.fused and getattr(task, "loss_batch", None) is not None:
            raise UsageError("--fused-output-layer scores a seq2seq decoder's features against its output projection; "
                             f"--task {task.cfg._name} scores classification heads over a few classes instead")
        task_multi_label = bool(getattr(getattr(task, "cfg", None), "multi_label", False))
        if task_multi_label != self.multi_label:
            name = self.__class__.__name__
            raise UsageError(
                f"{name} is a {'multi' if self.multi_label else 'single'}-label loss but the task is "
                f"{'multi' if task_multi_label else 'single'}-label: use "
                + ("--criterion multilabel_softmax or as_multilabel" if task_multi_label
                   else "a single-label criterion (cross-entropy, sparse_softmax, as_softmax, ...)")
            )
        classes = getattr(task, "num_classes", None) or len(task.target_dictionary)
        same = self.same_as(classes)
        if same:
            logger.warning(same)

    def same_as(self, num_classes: int) -> str | None:
        """If the options make this loss another, simpler method for ``num_classes`` classes, a sentence
        saying so (logged once at start); else None."""
        return None

    def row_loss(self, batch: LossBatch, model, reduction: str) -> LossOutput:
        raise NotImplementedError

    def loss_batch(self, model, sample) -> LossBatch:
        task_batch = getattr(self.task, "loss_batch", None)
        if task_batch is not None:
            return task_batch(model, sample)
        return self.seq2seq_batch(model, sample)

    def seq2seq_batch(self, model, sample) -> LossBatch:
        """Every non-padding target token of a seq2seq sample is a row, scored by the decoder's logits
        (with --fused-output-layer: by its features and output projection)."""
        decoder = getattr(model, "decoder", None)
        if getattr(decoder, "adaptive_softmax", None) is not None:
            raise UsageError(f"criterion {self.__class__.__name__} needs full logits; "
                             "--adaptive-softmax-cutoff is not supported")
        if self.fused:
            check_plain_output_layer(decoder)
        scores = model(**sample["net_input"], features_only=self.fused)[0]
        target = model.get_targets(sample, None)
        if self.ignore_prefix_size > 0:
            scores = scores[:, self.ignore_prefix_size :, :]
            target = target[:, self.ignore_prefix_size :]
        target = target.reshape(-1)
        scores = scores.reshape(-1, scores.size(-1))
        return LossBatch(
            logits=None if self.fused else scores,
            target=target,
            ignore_index=self.padding_idx,
            n_rows=(target != self.padding_idx).sum(),
            sample_size=sample["target"].size(0) if self.sentence_avg else sample["ntokens"],
            cosine_scale=getattr(decoder, "cosine_scale", None),
            features=scores if self.fused else None,
            projection=decoder.output_projection if self.fused else None,
        )

    def fused_loss(self, batch: LossBatch, reduction: str, loss: str, **options) -> LossResult:
        """``loss`` of the batch's features through its output projection (``--fused-output-layer``)."""
        projection = batch.projection
        return fused_output_loss(batch.features, projection.weight, batch.target, loss, bias=projection.bias,
                                 ignore_index=batch.ignore_index, reduction=reduction, **options)

    def forward(self, model, sample, reduce: bool = True):
        batch = self.loss_batch(model, sample)
        reduction = "sum" if reduce else "none"
        out = self.row_loss(batch, model, reduction)
        nll = out.nll
        if nll is None and not self.multi_label:
            with torch.no_grad():
                nll = softmax_loss(batch.logits, batch.target, batch.ignore_index, reduction)
        logging_output = {
            "loss": out.loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["nsentences"] if "nsentences" in sample else sample["target"].size(0),
            "sample_size": batch.sample_size,
            "n_rows": batch.n_rows,
        }
        if nll is not None:
            logging_output["nll_loss"] = nll.data
        for key, value in {**(out.counts or {}), **(batch.logging or {})}.items():
            logging_output[key] = value.data if torch.is_tensor(value) else value
        return out.loss, batch.sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        def total(key):
            return sum(float(log.get(key, 0)) for log in logging_outputs)

        sample_size, rows = total("sample_size"), total("n_rows")
        metrics.log_scalar("loss", total("loss") / max(sample_size, 1) / math.log(2), sample_size, round=3)
        if any("nll_loss" in log for log in logging_outputs):
            metrics.log_scalar("nll_loss", total("nll_loss") / max(rows, 1) / math.log(2), rows, round=3)
            metrics.log_derived("ppl", lambda meters: 2 ** meters["nll_loss"].avg)
        for name, (num, den) in cls.ratios.items():
            metrics.log_scalar(name, total(num) / max(total(den), 1), total(den), round=4)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


def check_warmup(option: str, ratio: float, max_update: int | None) -> None:
    if ratio > 0 and not max_update:
        raise UsageError(f"{option} is a fraction of --max-update: set --max-update")


def check_plain_output_layer(decoder) -> None:
    """--fused-output-layer computes ``F.linear(features, output_projection)`` itself: refuse a decoder
    whose logits come out any other way."""
    name = type(decoder).__name__
    if getattr(decoder, "logits_are_output_projection", False):  # a plugin decoder that promises it
        return
    if not isinstance(decoder, TransformerDecoderBase):
        problem = "is not a fairseq transformer decoder"
    elif type(decoder).output_layer is not TransformerDecoderBase.output_layer:
        problem = "computes its logits in its own output_layer (e.g. cosine logits for am_softmax)"
    elif not isinstance(getattr(decoder, "output_projection", None), nn.Linear):
        problem = "has no linear output_projection"
    else:
        return
    raise UsageError(f"--fused-output-layer needs a decoder whose logits are its plain linear output_projection; "
                     f"{name} {problem}")
