#!/usr/bin/env python
"""``fairseq-train`` that also says where its updates' time goes.

A words-per-second figure cannot tell whether the GPU set the pace or waited: on an H100 every criterion of
``train_speed.py`` trained at the same speed, for updates whose arithmetic takes a few milliseconds. This runs
fairseq-train in this process with ``Trainer.train_step`` timed and, over ``--profile-updates`` updates after
``--profile-skip``, ``torch.profiler`` recording. Per update it reports the wall time from one step's start to the
next, the part outside ``train_step`` (making and moving batches, progress logging), the CPU time of the regions
fairseq marks inside it (``forward``, ``backward``, ``clip-grads``, ``optimizer``, ...) and the GPU's busy time:
the sum of its kernels' times. A GPU busy for a small part of the wall was waiting for the CPU, and the regions say
where the CPU was (on CUDA, the first region that reads a result, ``clip-grads``'s finiteness check, also holds the
wait for the GPU's queued work).

    python benchmarks/profile_train.py [--profile-skip 10] [--profile-updates 10] [--cudnn-attention] \
        FAIRSEQ-TRAIN-ARGS...

The run must make ``--profile-skip`` + ``--profile-updates`` + 1 updates (``--max-update``). On an H100 this is
what found the plugin's ``fairseq_compat`` fix 10: cuDNN attention planned anew for every batch shape;
``--cudnn-attention`` keeps it, to measure the fix.

The last line of the output is ``profile | {json}`` with those figures, for ``train_speed.py --profile``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import EventList
from fairseq.trainer import Trainer
from fairseq_cli import train

#: the regions fairseq's trainer and task mark with ``record_function`` in an update
REGIONS = ("forward", "backward", "reduce-grads", "multiply-grads", "clip-grads", "optimizer")


class UpdateClock:
    """Wraps ``Trainer.train_step``: step start and end times, and the profiler's schedule stepped per update."""

    def __init__(self, skip: int, updates: int):
        self.skip, self.updates = skip, updates
        self.starts: list[float] = []
        self.ends: list[float] = []
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(
            activities=activities, schedule=torch.profiler.schedule(wait=skip, warmup=0, active=updates, repeat=1))

    def wrap(self, train_step):
        def timed(trainer, *args, **kwargs):
            self.starts.append(time.perf_counter())
            output = train_step(trainer, *args, **kwargs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the step's work done, not just queued
            self.ends.append(time.perf_counter())
            self.profiler.step()
            return output
        return timed

    def report(self) -> dict:
        """Milliseconds per profiled update. The last profiled update's wall needs the next step's start, so the
        run must make one update more than the profiled ones."""
        first, last = self.skip, self.skip + self.updates
        if len(self.starts) <= last:
            raise ValueError(f"the run made {len(self.starts)} updates; --profile-skip {self.skip} and "
                             f"--profile-updates {self.updates} need at least {last + 1} (raise --max-update)")
        wall = (self.starts[last] - self.starts[first]) / self.updates
        in_step = sum(self.ends[i] - self.starts[i] for i in range(first, last)) / self.updates
        on_gpu = torch.cuda.is_available()
        regions, gpu_busy = split_events(self.profiler.events(), self.updates, on_gpu)
        operators = EventList([e for e in self.profiler.key_averages() if not e.is_user_annotation],
                              use_device="cuda" if on_gpu else None)  # the regions' ranges would top the table
        return {"updates": self.updates, "wall_ms": wall * 1e3, "outside_step_ms": (wall - in_step) * 1e3,
                "regions_ms": regions, "gpu_busy_ms": gpu_busy,
                "top_ops": operators.table(sort_by="self_device_time_total" if on_gpu else "self_cpu_time_total",
                                           row_limit=12, max_name_column_width=40)}


def split_events(events, updates: int, on_gpu: bool) -> tuple[dict[str, float], float | None]:
    """Milliseconds per update in fairseq's regions (CPU time) and of GPU work (None without a GPU).

    On CUDA the profiler records each ``record_function`` range twice: as a CPU event and as a GPU annotation
    that spans the kernels launched inside it (fairseq's ``train_step-N`` ranges too). The annotations are neither
    CPU time nor GPU work, and they overlap, so the regions count CPU events only and the GPU its kernels and
    copies only (an operator's device total would count its kernels again)."""
    regions: dict[str, float] = {}
    gpu_us = 0.0
    for event in events:
        if event.device_type == DeviceType.CPU:
            if event.name in REGIONS:
                regions[event.name] = regions.get(event.name, 0.0) + event.cpu_time_total / 1e3 / updates
        elif not event.is_user_annotation:
            gpu_us += event.device_time_total
    return regions, gpu_us / 1e3 / updates if on_gpu else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile-skip", type=int, default=10, help="updates before the profiled ones")
    parser.add_argument("--profile-updates", type=int, default=10, help="updates profiled")
    parser.add_argument("--cudnn-attention", action="store_true",
                        help="keep PyTorch's cuDNN attention, which the plugin turns off (user_dir/fairseq_compat.py "
                        "fix 10): to measure what that fix saves")
    args, fairseq_args = parser.parse_known_args()
    if args.profile_skip < 0 or args.profile_updates < 1:
        parser.error("--profile-skip must be >= 0 and --profile-updates >= 1")
    if args.cudnn_attention:
        from user_dir import fairseq_compat  # the same module fairseq imports for --user-dir, so applied once

        fairseq_compat.apply()
        torch.backends.cuda.enable_cudnn_sdp(True)
    clock = UpdateClock(args.profile_skip, args.profile_updates)
    Trainer.train_step = clock.wrap(Trainer.train_step)
    sys.argv = ["fairseq-train", *fairseq_args]
    with clock.profiler:
        train.cli_main()
    try:
        summary = clock.report()
    except ValueError as error:
        parser.exit(2, f"profile_train.py: error: {error}\n")
    print(summary.pop("top_ops"))
    gpu = "" if summary["gpu_busy_ms"] is None else f", GPU busy {summary['gpu_busy_ms']:.1f}"
    regions = ", ".join(f"{name} {ms:.1f}" for name, ms in summary["regions_ms"].items())
    print(f"per update (ms), over {summary['updates']}: wall {summary['wall_ms']:.1f}, outside train_step "
          f"{summary['outside_step_ms']:.1f}{gpu}; {regions}")
    print("profile | " + json.dumps(summary))


if __name__ == "__main__":
    main()
