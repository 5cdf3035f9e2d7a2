"""Fixes to fairseq behaviour the plugin depends on, applied once when fairseq imports the user dir.

1. Checkpoints on torch >= 2.6. ``torch.load`` now defaults to ``weights_only=True``, which refuses
   the argparse/omegaconf objects every fairseq checkpoint pickles ("Unsupported global"). fairseq
   imports ``--user-dir`` before it loads any checkpoint, so we wrap its one loader,
   ``checkpoint_utils.load_checkpoint_to_cpu``, to load with ``weights_only=False``: fairseq
   checkpoints are pickles by design and the user names them with ``--path``/``--restore-file``.
   Other ``torch.load`` calls keep torch's safe default.
2. The silent drop of the last partial batch. ``data_utils.batch_by_size`` discards the final
   batch when ``--required-batch-size-multiple`` (default 8) does not divide it, although its own
   docstring allows a smaller last batch: a 30-line test set gives 24 hypotheses with
   ``--batch-size 16``, and training loses the tail of every epoch. Batches are consecutive runs of
   the ordered indices, so the dropped ones are exactly the tail; we put it back as a last batch.
3. The update counter on models. fairseq passes the update number to ``model.set_num_updates`` at
   every training step and after loading a checkpoint, but stores it nowhere; we keep it as
   ``model.num_updates`` so criterions with schedules (AS-Softmax warm-up) read it with any task
   and resume correctly.
4. ``--no-repeat-ngram-size`` without fairseq's CUDA extension: its Python fallback reads the whole
   token buffer, whose tail is padding, and blocks nothing (fairseq issue #4709); we hand it the
   tokens generated so far.
5. User mistakes found after argument parsing (a symbol missing from the dictionary, options that do
   not go together) raise ``user_dir.options.UsageError``; in the fairseq command-line tools it is
   printed as ``fairseq-train: error: <message>`` with exit status 2, like argparse's own errors,
   instead of a traceback. So is a missing batch size, which fairseq-train and fairseq-validate only
   assert; and the ``--save-dir`` fairseq-train made before a refusal is removed again if it is empty.
6. ``--bf16`` on GPUs (and CPUs). fairseq's argument parsing turns ``--bf16`` into ``--tpu`` (it was
   written for TPUs), so on any other machine the trainer asks torch_xla for a device and dies. Its
   bf16 training itself is device-agnostic (model in bfloat16, fp32 master weights, no loss scaling),
   so we keep ``--tpu`` only where the command line asked for it, before fairseq's launcher
   (``distributed_utils.call_main``) chooses how to start the workers.
7. A resumed run's batches. fairseq makes a training set's batches once and keeps them for every epoch, but it
   orders the examples (ties among equal lengths) with a seed plus the epoch it makes them in: epoch 1 in a run
   from scratch, the checkpoint's epoch in a resumed one, which so trains on other batches from then on. Where
   fairseq keeps them, we make them as at epoch 1, so a resumed run is the run that would have run (dropout is
   seeded by the update number already).
8. A clean exit while batches are being made. fairseq makes batches in a daemon thread
   (``iterators.BackgroundConsumer``, ``--data-buffer-size`` ahead); a run that stops mid-epoch
   (``--max-update``, a refused option) leaves it working. If it is inside a torch operation when the
   interpreter shuts down, that operation's return to Python ends the thread by unwinding through C++
   code that may not be unwound, and the whole process aborts ("terminate called without an active
   exception", status 134) after a finished training. At exit we tell those threads to stop after the
   batch in hand and wait for them.
9. A clean exit after distributed training. fairseq never destroys its process groups, so gloo's worker
   threads live into interpreter shutdown; one still freeing a finished collective (whose tensors need the
   interpreter lock) then aborts the process the same way (a rank of a finished two-process run exits with
   SIGABRT, now and then, on a loaded machine). Destroying the groups does not end those threads; freeing a group
   does. At exit we destroy the groups, drop fairseq's own reference to its group of all ranks and collect the
   trainer's reference cycles while the interpreter is whole, so the group's destructor joins its threads.
10. Attention on GPUs whose PyTorch prefers cuDNN's (Hopper, torch 2.11). cuDNN builds an execution graph for
   every new shape of query, key and value, and fairseq's batches come in many shapes (``--max-tokens`` batches
   of every length; a decoding step's key length grows by one), so a small model's updates spend most of their
   time building graphs (benchmarks/results/gpu_h100.md). We turn the cuDNN backend of
   ``scaled_dot_product_attention`` off, so PyTorch picks flash or memory-efficient attention, which need no
   graph per shape. Same attention; a CPU has no cuDNN backend to turn off.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from fairseq import checkpoint_utils
from fairseq.data import data_utils, iterators
from fairseq.distributed import utils as distributed_utils
from fairseq.models import BaseFairseqModel
from fairseq.tasks import FairseqTask
from fairseq.ngram_repeat_block import NGramRepeatBlock

from .options import UsageError, report_error

_APPLIED = "_sparse_softmax_plugin_patched"


def _load_checkpoint_with_pickles(load_checkpoint_to_cpu):
    @functools.wraps(load_checkpoint_to_cpu)
    def wrapper(*args, **kwargs):
        safe_load = torch.load
        torch.load = functools.partial(safe_load, weights_only=False)
        try:
            return load_checkpoint_to_cpu(*args, **kwargs)
        finally:
            torch.load = safe_load

    return wrapper


def _batch_by_size_keeping_tail(batch_by_size):
    @functools.wraps(batch_by_size)
    def wrapper(indices, *args, **kwargs):
        if not isinstance(indices, np.ndarray):  # may be a one-shot iterator: materialise it once
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        batches = batch_by_size(indices, *args, **kwargs)
        if kwargs.get("fixed_shapes") is not None:
            return batches
        batched = sum(len(b) for b in batches)
        if batched < len(indices):
            batches = list(batches) + [indices[batched:]]
        return batches

    return wrapper


def _set_num_updates_recording(set_num_updates):
    @functools.wraps(set_num_updates)
    def wrapper(self, num_updates):
        self.num_updates = num_updates
        set_num_updates(self, num_updates)

    return wrapper


def _no_repeat_ngram_on_generated(no_repeat_ngram):
    @functools.wraps(no_repeat_ngram)
    def wrapper(self, tokens, lprobs, bsz: int, beam_size: int, step: int):
        return no_repeat_ngram(self, tokens[:, : step + 1], lprobs, bsz, beam_size, step)

    return wrapper


#: The fairseq tools whose ``main`` runs after the plugin is imported (during argument parsing).
_CLI_MODULES = ("fairseq_cli.train", "fairseq_cli.generate", "fairseq_cli.interactive", "fairseq_cli.validate")
_BATCH_SIZE_REQUIRED = ("fairseq_cli.train", "fairseq_cli.validate")  # generate and interactive have defaults


def _usage_error_exits(main, batch_size_required: bool):
    @functools.wraps(main)  # same name and module: fairseq's spawn pickles it by reference
    def wrapper(cfg, *args, **kwargs):
        made = _folders_to_be_made(cfg)
        try:
            if batch_size_required:
                _check_batch_size(cfg)
                _check_fused_sharding(cfg)
            return main(cfg, *args, **kwargs)
        except UsageError as err:
            report_error(str(err))
            for folder in made:  # fairseq-train made them before the refusal: leave no trace of the run
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
            raise SystemExit(2) from None

    return wrapper


def _folders_to_be_made(cfg) -> list[Path]:
    """The ``--save-dir`` of a fairseq-train config and those of its parents that do not exist yet, deepest first."""
    save_dir = getattr(getattr(cfg, "checkpoint", None), "save_dir", None)
    if save_dir is None:
        return []
    path = Path(save_dir).absolute()
    return [folder for folder in (path, *path.parents) if not folder.exists()]


def _check_batch_size(cfg) -> None:
    dataset = getattr(cfg, "dataset", None)
    if dataset is not None and dataset.max_tokens is None and dataset.batch_size is None:
        raise UsageError("--batch-size or --max-tokens: give one (the sentences or the tokens a batch holds)")


def _batches_made_as_at_epoch_1(get_batch_iterator):
    @functools.wraps(get_batch_iterator)
    def wrapper(self, dataset, *args, epoch=1, **kwargs):
        rebuilt = getattr(getattr(self, "cfg", None), "rebuild_batches", False)  # made again at every epoch
        kept = (not kwargs.get("disable_iterator_cache") and not kwargs.get("update_epoch_batch_itr")
                and not rebuilt and self.can_reuse_epoch_itr(dataset))
        if not kept or epoch == 1 or dataset in self.dataset_to_epoch_iter:
            return get_batch_iterator(self, dataset, *args, epoch=epoch, **kwargs)
        iterator = get_batch_iterator(self, dataset, *args, epoch=1, **kwargs)
        iterator.epoch = epoch  # what the iterator and the data would have been made with
        dataset.set_epoch(epoch)
        return iterator

    return wrapper


def _bf16_without_tpu(call_main):
    @functools.wraps(call_main)
    def wrapper(cfg, main, **kwargs):
        if cfg.common.bf16 and cfg.common.tpu and "--tpu" not in sys.argv[1:]:
            cfg.common.tpu = False
        return call_main(cfg, main, **kwargs)

    return wrapper


class _BatchThread(iterators.BackgroundConsumer):
    """fairseq's background batch maker, which stops taking batches from its source once told to."""

    stopping = threading.Event()

    def __init__(self, batches, source, *args, **kwargs):
        super().__init__(batches, self._until_stopping(source), *args, **kwargs)

    @classmethod
    def _until_stopping(cls, source):
        for batch in source:
            if cls.stopping.is_set():
                return
            yield batch

    @classmethod
    def stop_all(cls, wait: float = 30.0) -> None:
        """Stop every batch thread and wait (up to ``wait`` seconds in all) until it has ended: registered
        with ``atexit``, which runs before the interpreter starts to shut down. The threads' queued batches
        are thrown away, so that a thread blocked on a full queue can put its end-of-data mark."""
        cls.stopping.set()
        deadline = time.monotonic() + wait
        for thread in threading.enumerate():
            while isinstance(thread, cls) and thread.is_alive() and time.monotonic() < deadline:
                with contextlib.suppress(queue.Empty):
                    while True:
                        thread._queue.get_nowait()
                thread.join(0.01)


def _destroy_process_groups() -> None:
    """Registered with ``atexit``: tear down the process groups and join their worker threads (fix 9).

    ``destroy_process_group`` only unregisters a group: its gloo threads end when the group object is freed. fairseq
    keeps its group of all ranks (every collective of a training, and the barrier after it) on
    ``get_global_group``, and the trainer and model that also hold it are in reference cycles; so we drop that
    reference and collect the cycles, and the group's destructor, which releases the interpreter lock, waits for
    its threads. The default group may outlive this (``torch.distributed.nn.functional``, once imported, holds it
    as a default argument), but fairseq runs no collective on it after setting up on a CPU."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    torch.distributed.destroy_process_group()
    with contextlib.suppress(AttributeError):
        del distributed_utils.get_global_group._global_group
    gc.collect()


def _check_fused_sharding(cfg) -> None:
    """fairseq shards a model with fairscale's FullyShardedDataParallel, which this install does not have and the
    fused output layer is not tested under: refuse the pair before fairseq wraps the model, not with its traceback."""
    distributed, criterion = getattr(cfg, "distributed_training", None), getattr(cfg, "criterion", None)
    if (getattr(distributed, "ddp_backend", None) == "fully_sharded"
            and getattr(criterion, "fused_output_layer", False)):
        raise UsageError("--fused-output-layer trains with --ddp-backend c10d, legacy_ddp or no_c10d, not "
                         "fully_sharded (fairscale's sharding, which it is not tested under): the "
                         "Hugging Face FusedTrainerLoss trains sharded, under FSDP2 or ZeRO-3")


def _cli_modules():
    """The fairseq tool modules already imported (the console scripts import theirs before the plugin), with
    their names."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)  # python -m fairseq_cli.train runs the tool as __main__
    if spec is not None and spec.name in _CLI_MODULES:
        yield spec.name, main
    yield from ((name, sys.modules[name]) for name in _CLI_MODULES if name in sys.modules)


def apply() -> None:
    """Install the fixes; idempotent."""
    if getattr(checkpoint_utils, _APPLIED, False):
        return
    checkpoint_utils.load_checkpoint_to_cpu = _load_checkpoint_with_pickles(checkpoint_utils.load_checkpoint_to_cpu)
    data_utils.batch_by_size = _batch_by_size_keeping_tail(data_utils.batch_by_size)
    BaseFairseqModel.set_num_updates = _set_num_updates_recording(BaseFairseqModel.set_num_updates)
    NGramRepeatBlock._no_repeat_ngram = _no_repeat_ngram_on_generated(NGramRepeatBlock._no_repeat_ngram)
    distributed_utils.call_main = _bf16_without_tpu(distributed_utils.call_main)
    FairseqTask.get_batch_iterator = _batches_made_as_at_epoch_1(FairseqTask.get_batch_iterator)
    iterators.BackgroundConsumer = _BatchThread  # BufferedIterator looks the class up when it starts one
    atexit.register(_BatchThread.stop_all)
    atexit.register(_destroy_process_groups)
    torch.backends.cuda.enable_cudnn_sdp(False)
    for name, module in _cli_modules():
        module.main = _usage_error_exits(module.main, name in _BATCH_SIZE_REQUIRED)
    setattr(checkpoint_utils, _APPLIED, True)


def num_updates(model) -> int:
    """The update number fairseq last passed to ``model.set_num_updates`` (0 before training)."""
    return int(getattr(model, "num_updates", 0) or 0)
