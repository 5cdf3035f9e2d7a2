"""AS-Speed (Lv et al.): adaptive gradient accumulation driven by the share of masked samples.

AS-Softmax gives a sample whose target already beats every other class by δ zero loss and zero
gradient. As training goes on more samples are masked and an update carries fewer useful ones, so
AS-Speed accumulates more micro-batches per update: after each update,

    steps ← min(max_steps, prev + 1, max(prev, round(λ · N_all / (N_all − N_masked))))

counting N_all rows and N_masked fully masked rows over that update's micro-batches on *all*
data-parallel workers (the counts are all-reduced, so every worker takes the same number of
micro-batches and the updates stay in lock-step). ``round`` rounds halves up; an update whose rows
were all masked asks for ``prev + 1``. The rule is ``sparse_softmax.schedules.next_accumulation``.

How it hooks into fairseq's training loop (``fairseq_cli/train.py`` groups ``--update-freq``
micro-batches per update with ``iterators.GroupedIterator``, a count fixed per epoch):

1. ``ASSpeedTask.get_batch_iterator`` wraps the *training* ``EpochBatchIterator`` in
   ``AdaptiveEpochIterator``: its epochs carry the schedule, and its ``state_dict`` — which fairseq
   saves in every checkpoint as ``train_iterator`` and restores on ``--restore-file`` — carries the
   step count, so a resumed run continues with the steps it had.
2. ``install()`` replaces ``iterators.GroupedIterator`` (looked up by train.py at call time) by a
   function that returns fairseq's own class for every iterable except those epochs, which it groups
   with ``AdaptiveGroupedIterator``: each update takes ``schedule.steps`` micro-batches.
3. ``ASSpeedTask.train_step`` adds each micro-batch's ``n_rows`` / ``n_masked`` (logged by the AS
   criterions) to the window and logs ``accum_steps``; ``ASSpeedTask.optimizer_step``, which the
   trainer calls once per update on every worker, closes the window (all-reduce, then the rule).

fairseq still divides the summed gradient by the summed sample size of the update, so a longer
update is an average over more samples, not a larger step.
"""

import logging
import math
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.data import iterators
from fairseq.dataclass import FairseqDataclass
from fairseq.distributed import utils as distributed_utils
from fairseq.logging import metrics
from omegaconf import II

from sparse_softmax.schedules import next_accumulation

from .options import UsageError, at_least, positive

logger = logging.getLogger(__name__)


@dataclass
class ASSpeedConfig(FairseqDataclass):
    """Task options; mixed into the configs of the tasks that support AS-Speed."""

    as_speed: bool = field(
        default=False,
        metadata={"help": "AS-Speed: raise the number of accumulated micro-batches per update (starting at "
                  "--update-freq) as AS-Softmax masks more samples; needs --criterion as_softmax or as_multilabel"},
    )
    as_speed_lambda: float = field(
        default=1.0,
        metadata={"help": "AS-Speed lambda: accumulate round(lambda * N / (N - N_masked)) micro-batches "
                  "(never fewer than before, at most one more per update)", "check": positive()},
    )
    as_speed_max_steps: int = field(
        default=4, metadata={"help": "AS-Speed: never accumulate more micro-batches than this per update "
                             "(= --update-freq: the steps never change, and a warning says so)", "check": at_least(1)}
    )
    update_freq: List[int] = II("optimization.update_freq")  # the first update's steps
    train_subset: str = II("dataset.train_subset")  # the split whose batches are grouped
    skip_remainder_batch: bool = II("optimization.skip_remainder_batch")  # refused: AS-Speed groups batches itself


class AccumulationSchedule:
    """The step count and the counts of the update in progress."""

    def __init__(self, steps: int, lam: float, max_steps: int):
        if not lam > 0:
            raise UsageError(f"--as-speed-lambda must be > 0, got {lam}")
        if not 1 <= steps <= max_steps:
            raise UsageError(f"--as-speed-max-steps ({max_steps}) must be >= --update-freq ({steps}) >= 1")
        if steps == max_steps:
            logger.warning(f"--as-speed-max-steps {max_steps} = --update-freq: AS-Speed can never change the "
                           "number of micro-batches, so training is plain gradient accumulation")
        self.steps, self.lam, self.max_steps = steps, lam, max_steps
        self.window = torch.zeros(2, dtype=torch.float64)  # rows, masked rows (this worker)
        self.warned_rise = False

    def record(self, logging_output: dict[str, Any]) -> None:
        if "n_masked" not in logging_output:
            raise ValueError("--as-speed counts masked samples: train with --criterion as_softmax or as_multilabel")
        counts = torch.stack([torch.as_tensor(logging_output[k], dtype=torch.float64) for k in ("n_rows", "n_masked")])
        self.window = self.window.to(counts.device) + counts

    def end_window(self) -> int:
        """Close the update's window: sum its counts over the data-parallel workers and apply the rule."""
        counts = self.window
        if distributed_utils.get_data_parallel_world_size() > 1:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else counts.device
            counts = distributed_utils.all_reduce_dict(
                {"counts": counts}, device=device, group=distributed_utils.get_data_parallel_group()
            )["counts"]
        n_rows, n_masked = counts.tolist()
        prev, self.steps = self.steps, next_accumulation(self.steps, n_rows, n_masked, self.lam, self.max_steps)
        self.window = torch.zeros_like(self.window)
        if self.steps > prev and not self.warned_rise:
            self._warn_rise(prev)
        return self.steps

    def _warn_rise(self, prev: int) -> None:
        """fairseq counts --max-update and the learning-rate schedules in updates, and an update now holds
        more data: a decay sized as epochs x batches would be unfinished at --max-epoch, silently."""
        self.warned_rise = True
        logger.warning(f"AS-Speed: {self.steps} micro-batches per update from now on (was {prev}), and more if more "
                       "samples get masked; --max-update and learning-rate schedules counted in updates "
                       "(--warmup-updates, --total-num-update) now advance less per epoch, so one sized for "
                       "--max-epoch will not reach its end")

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = int(state["steps"])


class AdaptiveGroupedIterator:
    """Groups an epoch's micro-batches into updates of ``schedule.steps`` each (the last may be shorter).

    Its length, which progress bars show, is an estimate at the current step count.
    """

    def __init__(self, batches, schedule: AccumulationSchedule):
        self.batches, self.schedule = batches, schedule
        self.n = math.ceil(batches.n / schedule.steps)  # updates done in this epoch (resumed runs: estimated)

    def __len__(self) -> int:
        return self.n + math.ceil((len(self.batches) - self.batches.n) / self.schedule.steps)

    def __iter__(self):
        return self

    def has_next(self) -> bool:
        return self.batches.has_next()

    def __next__(self) -> list:
        if not self.has_next():
            raise StopIteration
        group = []
        while len(group) < self.schedule.steps and self.batches.has_next():
            group.append(next(self.batches))
        self.n += 1
        return group


class AdaptiveEpochIterator:
    """fairseq's ``EpochBatchIterator`` whose epochs are grouped by the schedule and whose checkpointed
    state includes it; everything else is delegated."""

    def __init__(self, epoch_iterator, schedule: AccumulationSchedule):
        self._inner, self.schedule = epoch_iterator, schedule

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def __len__(self) -> int:
        return len(self._inner)

    def next_epoch_itr(self, *args, **kwargs):
        batches = self._inner.next_epoch_itr(*args, **kwargs)
        batches.accumulation_schedule = self.schedule
        return batches

    def state_dict(self) -> dict[str, Any]:
        return {**self._inner.state_dict(), "as_speed": self.schedule.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "as_speed" in state:
            self.schedule.load_state_dict(state["as_speed"])
        self._inner.load_state_dict(state)


_FAIRSEQ_GROUPED_ITERATOR = iterators.GroupedIterator


def _grouped_iterator(iterable, chunk_size, skip_remainder_batch=False):
    """fairseq's grouping, except for AS-Speed epochs (the task refuses --skip-remainder-batch with them)."""
    schedule = getattr(iterable, "accumulation_schedule", None)
    if schedule is None:
        return _FAIRSEQ_GROUPED_ITERATOR(iterable, chunk_size, skip_remainder_batch=skip_remainder_batch)
    return AdaptiveGroupedIterator(iterable, schedule)


def install() -> None:
    """Let AS-Speed epochs group their own batches in fairseq's training loop; idempotent."""
    iterators.GroupedIterator = _grouped_iterator


class ASSpeedTask:
    """Mix-in for a fairseq task whose config includes ``ASSpeedConfig``: put it first among the task's bases."""

    def __init__(self, cfg, *args, **kwargs):
        super().__init__(cfg, *args, **kwargs)
        self.accumulation = None
        if getattr(cfg, "as_speed", False):  # configs stored in older checkpoints lack the field
            if cfg.skip_remainder_batch:
                raise UsageError("--as-speed groups batches itself: --skip-remainder-batch is not supported with it")
            self.accumulation = AccumulationSchedule(cfg.update_freq[0], cfg.as_speed_lambda, cfg.as_speed_max_steps)
            install()

    def build_criterion(self, cfg, *args, **kwargs):
        criterion = super().build_criterion(cfg, *args, **kwargs)
        if self.accumulation is not None and not getattr(criterion, "counts_masked_rows", False):
            raise UsageError("--as-speed counts masked samples: train with --criterion as_softmax or as_multilabel")
        return criterion

    def get_batch_iterator(self, dataset, *args, **kwargs):
        epoch_iterator = super().get_batch_iterator(dataset, *args, **kwargs)
        if self.accumulation is None or dataset is not self.datasets.get(self.cfg.train_subset):
            return epoch_iterator
        return AdaptiveEpochIterator(epoch_iterator, self.accumulation)

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        loss, sample_size, logging_output = super().train_step(sample, model, criterion, optimizer, update_num,
                                                                ignore_grad)
        if self.accumulation is not None:
            if not ignore_grad:  # fairseq's padding dummy batches do not count
                self.accumulation.record(logging_output)
            metrics.log_scalar("accum_steps", self.accumulation.steps, weight=0, round=0)
        return loss, sample_size, logging_output

    def optimizer_step(self, optimizer, model, update_num):
        super().optimizer_step(optimizer, model, update_num)
        if self.accumulation is not None:
            self.accumulation.end_window()
