"""The training schedules as Hugging Face ``TrainerCallback``s, for a ``TrainerLoss``.

- ``LossScheduleCallback(loss)``: gives the loss the update count and the run's length before each update (the
  warm-ups and δ annealing read them: a resumed run, whose ``global_step`` is restored, continues them) and adds
  ``as_delta`` and ``masked_ratio`` (the AS losses) or ``flat_slope`` (sparse_softmax: nats, positive while flat
  logits beat the model's on its loss, where a run collapses; docs/criterions.md) to each training record: to
  ``trainer.state.log_history`` (and ``trainer_state.json``) and to the printed line. (The reporting integrations,
  ``report_to``, see a record before the callbacks the Trainer was given, so not these.)
- ``ASSpeedCallback(loss)``: AS-Speed (Lv et al.): after each update the number of micro-batches to accumulate
  follows ``sparse_softmax.schedules.next_accumulation`` from the update's training rows and masked rows, summed
  over all processes first so every process accumulates alike.
"""
from __future__ import annotations

import torch
from torch import Tensor
from transformers import TrainerCallback

from ..schedules import next_accumulation
from .loss import AS_LOSSES, TrainerLoss


class _NewCounts:
    """The loss's totals gained since the last call."""

    def __init__(self, loss: TrainerLoss):
        self.loss, self.seen = loss, {}

    def __call__(self) -> dict[str, Tensor]:
        new = {key: value - self.seen.get(key, 0) for key, value in self.loss.totals.items()}
        self.seen = dict(self.loss.totals)
        return new


class LossScheduleCallback(TrainerCallback):
    def __init__(self, loss: TrainerLoss):
        self.loss, self.new_counts = loss, _NewCounts(loss)

    def on_step_begin(self, args, state, control, **kwargs):
        self.loss.update, self.loss.max_update = state.global_step, state.max_steps

    def on_log(self, args, state, control, logs=None, **kwargs):
        new = self.new_counts()
        rows, slope_rows = float(new.get("rows", 0)), float(new.get("slope_rows", 0))
        values = {}
        if rows:
            values.update(as_delta=round(float(new["delta_x_rows"]) / rows, 4),
                          masked_ratio=round(float(new["masked"]) / rows, 4))
        if slope_rows:
            values["flat_slope"] = round(float(new["slope_sum"]) / slope_rows, 4)
        _add_to_record(state, logs, values)


def _add_to_record(state, logs: dict | None, values: dict) -> None:
    """``values`` into the record being logged: into the history (and so ``trainer_state.json``) and into ``logs``,
    which the progress printer, added after the callbacks given to the Trainer, prints next."""
    if values and state.log_history:
        state.log_history[-1].update(values)
        if logs is not None:
            logs.update(values)


class ASSpeedCallback(TrainerCallback):
    """AS-Speed for an AS loss: ``lam`` is the paper's λ, ``max_steps`` the most micro-batches an update takes.

    The Trainer ends an update where the epoch's count of micro-batches reaches a multiple of
    ``args.gradient_accumulation_steps``, so a new count takes effect at the first update boundary that is a
    multiple of it (at most that many − 1 updates after the rule asks; at once at an epoch's start); every
    update in between keeps the count it had, so the updates stay whole. The micro-batches each update took are
    logged as ``accum_steps`` (in the history and the printed line).
    The Trainer's epoch still has the updates it planned at the start, and updates that find the epoch's data
    used up do nothing: with ``num_train_epochs`` the run takes fewer updates (AS-Speed's saving); with
    ``max_steps``, training ends after the epochs those steps planned. A resumed run starts again from
    ``gradient_accumulation_steps``.
    """

    def __init__(self, loss: TrainerLoss, lam: float = 1.0, max_steps: int = 8):
        if loss.name not in AS_LOSSES:
            raise ValueError(f"AS-Speed counts the samples AS masks: the loss must be one of {sorted(AS_LOSSES)}, "
                             f"not {loss.name}")
        if not lam > 0 or max_steps < 1:
            raise ValueError(f"lam must be > 0 and max_steps >= 1, got {lam} and {max_steps}")
        self.new_counts, self.lam, self.max_steps = _NewCounts(loss), lam, max_steps
        self.wanted = self.micro_batches = self.taken = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.wanted = args.gradient_accumulation_steps

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.micro_batches = 0
        args.gradient_accumulation_steps = self.wanted

    def on_step_begin(self, args, state, control, **kwargs):
        self.taken = 0

    def on_substep_end(self, args, state, control, **kwargs):
        self.micro_batches += 1
        self.taken += 1

    def on_step_end(self, args, state, control, **kwargs):
        self.micro_batches += 1
        self.taken += 1
        new = self.new_counts()
        counts = torch.tensor([float(new.get("rows", 0)), float(new.get("masked", 0))], dtype=torch.float64)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            nccl = torch.distributed.get_backend() == "nccl"  # NCCL reduces CUDA tensors only
            counts = counts.to(torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu")
            torch.distributed.all_reduce(counts)
        rows, masked = counts.tolist()
        self.wanted = next_accumulation(self.wanted, rows, masked, self.lam, self.max_steps)
        if self.micro_batches % self.wanted == 0:
            args.gradient_accumulation_steps = self.wanted

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.log_history and "loss" in state.log_history[-1]:
            _add_to_record(state, logs, {"accum_steps": self.taken})  # the micro-batches of the update just taken
