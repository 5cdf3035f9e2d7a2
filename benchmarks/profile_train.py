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

    python benchmarks/profile_train.py [--profile-skip 10] [--profile-updates 10] FAIRSEQ-TRAIN-ARGS...

The last line of the output is ``profile | {json}`` with those figures, for ``train_speed.py --profile``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
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
        wall is taken over the updates that have one."""
        first, last = self.skip, min(self.skip + self.updates, len(self.starts) - 1)
        if last - first < 1:
            raise ValueError(f"the run made {len(self.starts)} updates; --profile-skip {self.skip} needs at "
                             f"least {self.skip + 2} (raise --max-update)")
        n = last - first
        wall = (self.starts[last] - self.starts[first]) / n
        in_step = sum(self.ends[i] - self.starts[i] for i in range(first, last)) / n
        events = self.profiler.key_averages()
        profiled = min(self.updates, len(self.starts) - self.skip)
        regions = {e.key: e.cpu_time_total / 1e3 / profiled for e in events if e.key in REGIONS}
        gpu_busy = None
        if torch.cuda.is_available():  # kernels and copies: an operator's device total counts its kernels again
            gpu_busy = sum(e.device_time_total for e in self.profiler.events()
                           if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3 / profiled
        return {"updates": n, "wall_ms": wall * 1e3, "outside_step_ms": (wall - in_step) * 1e3,
                "regions_ms": regions, "gpu_busy_ms": gpu_busy,
                "top_ops": events.table(sort_by="self_cpu_time_total" if gpu_busy is None else
                                        "self_device_time_total", row_limit=12, max_name_column_width=40)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile-skip", type=int, default=10, help="updates before the profiled ones")
    parser.add_argument("--profile-updates", type=int, default=10, help="updates profiled")
    args, fairseq_args = parser.parse_known_args()
    if args.profile_skip < 0 or args.profile_updates < 1:
        parser.error("--profile-skip must be >= 0 and --profile-updates >= 1")
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
