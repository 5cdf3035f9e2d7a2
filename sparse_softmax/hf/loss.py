"""Every loss of the project as Hugging Face ``Trainer``'s ``compute_loss_func``.

``Trainer(..., compute_loss_func=TrainerLoss("sparse_softmax", k=10))``: the Trainer takes the labels out of the
batch, runs the model and calls ``loss(outputs, labels, num_items_in_batch)``. The logits are
``outputs.logits``: ``(batch, length, V)`` with labels ``(batch, length)`` for seq2seq, causal LMs
(``causal_lm=True``: position i predicts label i + 1, as the models' own loss) and token classification;
``(batch, C)`` with labels ``(batch,)`` for sequence classification, or multi-hot ``(batch, C)`` for the
multi-label losses. Labels equal to ``ignore_index`` (-100, the padding the collators write) count nowhere.
With a ``compute_loss_func`` the Trainer gives the model no labels, so an encoder-decoder's batch must carry
``decoder_input_ids`` (``DataCollatorForSeq2Seq(tokenizer, model=model)`` makes them from the labels): BART, for
one, would otherwise feed its decoder the shifted source.

The Trainer counts the labelled items of the whole accumulated batch (``num_items_in_batch``) and takes a
loss divided by that count as already scaled for gradient accumulation, so the loss is the sum over the
micro-batch's rows divided by it — as its own cross-entropy does; without a count (evaluation), the mean
over the rows. For the multi-label losses an item is a row, not one of its C labels.

The schedules (``warmup_ratio``, ``anneal_ratio``) need the update count, which ``LossScheduleCallback``
(``sparse_softmax.hf.callbacks``) gives the loss. The AS losses also count the training rows they see and mask
(``totals``), which that callback logs and ``ASSpeedCallback`` steers by; sparse_softmax adds up the flat slope of
a sample of its rows there (``sparse_softmax.diagnostics.flat_slope``: positive while the run collapses), which the
callback logs too. Rows seen without gradients (evaluation) do not count.
"""
from __future__ import annotations

import inspect
import logging
from typing import Any, Callable

import torch
from torch import Tensor

from .. import losses
from ..diagnostics import flat_slope, handover_warning, slope_rows
from ..schedules import as_delta, check_as_schedule, in_warmup, warmup_end

logger = logging.getLogger(__name__)


def _as_softmax(logits, target, ignore_index, reduction, delta: float):
    return losses.as_softmax(logits, target, delta, ignore_index, reduction)


def _as_multilabel(logits, labels, ignore_index, reduction, delta: float):
    loss, n_masked = losses.as_multilabel_loss(logits, labels, delta, reduction, return_masked=True)
    return losses.LossResult(loss, loss.new_zeros(()), n_masked, n_masked.new_zeros(()))


def _multilabel(logits, labels, ignore_index, reduction):
    return losses.multilabel_categorical_crossentropy(logits, labels, reduction)


#: name (as the fairseq criterion) → the loss over 2-d logits: (logits, target, *, ignore_index, reduction, **options)
LOSSES: dict[str, Callable[..., Any]] = {
    "softmax": losses.softmax_loss,
    "sparse_softmax": losses.sparse_softmax_loss,
    "as_softmax": _as_softmax,
    "temperature_softmax": losses.temperature_softmax_loss,
    "soft_margin_softmax": losses.soft_margin_softmax_loss,
    "am_softmax": losses.am_softmax_loss,  # the logits must be cosines (a normalised head)
    "taylor_softmax": losses.taylor_softmax_loss,
    "sm_taylor_softmax": losses.sm_taylor_softmax_loss,
    "sparsemax": losses.sparsemax_loss,
    "entmax15": losses.entmax15_loss,
    "multilabel_softmax": _multilabel,
    "as_multilabel": _as_multilabel,
}
MULTI_LABEL = {"multilabel_softmax", "as_multilabel"}
WARMUP = {"sparse_softmax", "as_softmax", "as_multilabel"}  # the losses with a softmax warm-up
AS_LOSSES = {"as_softmax", "as_multilabel"}  # with a δ, which may also be annealed
DEFAULTS = {"sparse_softmax": {"k": 10}, "as_softmax": {"delta": 0.3}, "as_multilabel": {"delta": 0.3}}


def _options(function) -> set[str]:
    """The keyword options of a loss function (what follows logits, target, ignore_index and reduction)."""
    fixed = {"logits", "cosine", "target", "labels", "ignore_index", "reduction"}
    return {name for name in inspect.signature(function).parameters if name not in fixed}


#: option → (lowest, highest) it may take, where the loss has the option; what the fairseq criterions check
RANGES = {"k": (1, float("inf")), "delta": (0.0, 1.0), "label_smoothing": (0.0, 1.0), "warmup_ratio": (0.0, 1.0),
          "anneal_ratio": (0.0, 1.0), "anneal_from": (0.0, 1.0), "temperature": (0.0, float("inf")),
          "order": (1, float("inf"))}


def _check_values(name: str, function, values: dict) -> None:
    """Refuses, in one ``ValueError``, an option whose value is not of the type the loss function declares (a
    number for a float, a whole number for an int) or outside ``RANGES``."""
    declared = {key: parameter.annotation for key, parameter in inspect.signature(function).parameters.items()}
    for key, value in values.items():
        kind = declared.get(key, "float")  # the schedules' ratios are floats
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind == "int" and not (number and float(value).is_integer()):
            raise ValueError(f"{name}: {key} must be a whole number, got {value!r}")
        if kind == "float" and not number:
            raise ValueError(f"{name}: {key} must be a number, got {value!r}")
        low, high = RANGES.get(key, (-float("inf"), float("inf")))
        if number and not low <= value <= high:
            raise ValueError(f"{name}: {key} must be in [{low:g}, {high:g}], got {value!r}")


class TrainerLoss:
    """One loss of ``LOSSES`` with its options (e.g. ``k=10``; ``delta=0.3``), for ``Trainer(compute_loss_func=)``.

    ``warmup_ratio`` (sparse_softmax, the AS losses): plain softmax (δ = 1) for that first part of the training
    updates; ``anneal_ratio`` / ``anneal_from`` (the AS losses): δ falls from ``anneal_from`` to ``delta`` over
    that part (``sparse_softmax.schedules.as_delta``).
    """

    def __init__(self, name: str, *, causal_lm: bool = False, ignore_index: int = -100, warmup_ratio: float = 0.0,
                 anneal_ratio: float = 0.0, anneal_from: float = 1.0, **options):
        if name not in LOSSES:
            raise ValueError(f"unknown loss {name!r}; one of: {', '.join(LOSSES)}")
        unknown = set(options) - _options(LOSSES[name])
        if unknown:
            raise ValueError(f"{name} takes {sorted(_options(LOSSES[name])) or 'no options'}, "
                             f"not {sorted(unknown)}")
        if warmup_ratio and name not in WARMUP:
            raise ValueError(f"{name} has no warm-up (warmup_ratio): {', '.join(sorted(WARMUP))} have")
        if anneal_ratio and name not in AS_LOSSES:
            raise ValueError(f"{name} has no δ to anneal (anneal_ratio): {', '.join(sorted(AS_LOSSES))} have")
        options = {**DEFAULTS.get(name, {}), **options}
        _check_values(name, LOSSES[name], {**options, "warmup_ratio": warmup_ratio, "anneal_ratio": anneal_ratio,
                                           "anneal_from": anneal_from})
        if "k" in options:
            options["k"] = int(options["k"])
        check_as_schedule(options.get("delta", 1.0), warmup_ratio, anneal_ratio, anneal_from)
        self.name, self.causal_lm, self.ignore_index, self.options = name, causal_lm, ignore_index, options
        self.warmup_ratio, self.anneal_ratio, self.anneal_from = warmup_ratio, anneal_ratio, anneal_from
        self.update, self.max_update = 0, 0  # set by LossScheduleCallback before each update
        # since the start: training rows, masked rows, δ × rows (AS losses); flat slope sum and rows (sparse_softmax)
        self.totals: dict[str, Tensor] = {}
        self._warned = self._handed_over = False

    @property
    def delta(self) -> float:
        """The δ AS trains with at the current update."""
        return as_delta(self.options["delta"], self.update, self.max_update, self.warmup_ratio, self.anneal_ratio,
                        self.anneal_from)

    def __call__(self, outputs, labels: Tensor, num_items_in_batch: Tensor | int | None = None) -> Tensor:
        if labels is None:
            raise ValueError(f"{self.name}: the batch has no labels (the Trainer passes the 'labels' column)")
        if not self.causal_lm and type(outputs).__name__.startswith("CausalLM"):
            raise ValueError(f"{self.name}: these are a causal LM's outputs ({type(outputs).__name__}): pass "
                             "causal_lm=True, so that position i predicts token i + 1 as the model's own loss")
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        if self.name in MULTI_LABEL:
            logits, target = logits.reshape(-1, logits.size(-1)), labels.reshape(-1, logits.size(-1)).to(logits.device)
        else:
            if self.causal_lm:
                logits, labels = logits[..., :-1, :], labels[..., 1:]
            logits, target = logits.reshape(-1, logits.size(-1)), labels.reshape(-1).to(logits.device)
        total = self._loss(logits, target)
        if num_items_in_batch is None:
            return total / self._rows(target).clamp(min=1)
        if self.name in MULTI_LABEL:  # the Trainer counted every label of every row
            num_items_in_batch = num_items_in_batch / logits.size(-1)
        return total / num_items_in_batch

    def _loss(self, logits: Tensor, target: Tensor) -> Tensor:
        """The sum over the rows; records the counts."""
        name, options = self._scheduled(logits.size(-1))
        if self.name == "sparse_softmax" and torch.is_grad_enabled():
            self._watch_sparse(lambda rows: logits[rows], target, self.options["k"])
        out = LOSSES[name](logits, target, ignore_index=self.ignore_index, reduction="sum", **options)
        return self._recorded(name, options, target, out)

    def _scheduled(self, classes: int) -> tuple[str, dict]:
        """The loss and options to train with at this update, over ``classes`` classes: softmax in a warm-up, AS's
        current δ, and sparse_softmax's k at most the classes."""
        options, name = dict(self.options), self.name
        if (self.warmup_ratio or self.anneal_ratio) and not self.max_update:
            raise RuntimeError(f"{name}: a warm-up or annealing needs the update count: pass "
                               "callbacks=[LossScheduleCallback(loss)] to the Trainer")
        if name == "sparse_softmax":
            if options["k"] >= classes:
                self._say_once(f"sparse_softmax: k = {options['k']} >= {classes} classes keeps every class: "
                               "this trains plain softmax cross-entropy")
                options["k"] = classes
            if in_warmup(self.warmup_ratio, self.max_update, self.update):
                name, options = "softmax", {"label_smoothing": options.get("label_smoothing", 0.0)}
        elif name in AS_LOSSES:
            options["delta"] = self.delta
        return name, options

    def _recorded(self, name: str, options: dict, target: Tensor, out) -> Tensor:
        """The loss of ``out`` (a tensor, or an AS loss's ``LossResult``, whose training rows and masked rows are
        added to ``totals``)."""
        if name not in AS_LOSSES:
            return out
        if torch.is_grad_enabled():  # training; tensors, so no device synchronisation per micro-batch
            rows = self._rows(target)
            for key, value in (("rows", rows), ("masked", out.n_masked), ("delta_x_rows", rows * options["delta"])):
                self.totals[key] = self.totals.get(key, 0) + value
        return out.loss

    @torch.no_grad()
    def _watch_sparse(self, logits_of: Callable[[Tensor], Tensor], target: Tensor, k: int) -> None:
        """Adds the flat slope of a sample of the rows (``sparse_softmax.diagnostics.flat_slope``; ``logits_of(rows)``
        gives their logits), in the warm-up too: positive while flat logits beat the model's on the Sparse-softmax
        loss, where a run collapses; on the first update after the warm-up, warns if flat logits beat the model
        (``handover_warning``)."""
        rows = slope_rows(target, self.ignore_index)
        logits, target = logits_of(rows), target[rows]
        k = min(k, logits.size(-1))
        slope = flat_slope(logits, target, k)
        for key, value in (("slope_sum", slope.sum()), ("slope_rows", rows.new_tensor(len(rows)))):
            self.totals[key] = self.totals.get(key, 0) + value
        handover = self.warmup_ratio and self.update == warmup_end(self.warmup_ratio, self.max_update)
        if handover and not self._handed_over:
            self._handed_over = True
            message = handover_warning(logits, target, k, self.update)
            if message:
                logger.warning(message)

    def _rows(self, target: Tensor) -> Tensor:
        """The rows that count: every multi-label row; the others' rows whose label is not ``ignore_index``."""
        if self.name in MULTI_LABEL:
            return target.new_tensor(target.shape[0])
        return (target != self.ignore_index).sum()

    def _say_once(self, message: str) -> None:
        if not self._warned:
            logger.warning(message)
            self._warned = True
