"""benchmarks/profile_train.py: fairseq-train with each update's time split into where it went."""
from __future__ import annotations

import json

import pytest
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from conftest import TRAIN_COMMON, run_script
from profile_train import split_events

RUN = ("--arch", "transformer_tiny", "--criterion", "sparse_softmax", "--disable-validation", "--no-save")


def test_the_profiled_updates_split_into_fairseqs_regions(toy_data):
    proc = run_script("benchmarks/profile_train.py", "--profile-skip", "2", "--profile-updates", "3", toy_data,
                      *TRAIN_COMMON, *RUN, "--max-update", "6")
    profile = json.loads(proc.stdout.rsplit("profile | ", 1)[1])
    assert profile["updates"] == 3 and profile["gpu_busy_ms"] is None
    regions = profile["regions_ms"]
    assert {"forward", "backward", "clip-grads", "optimizer"} <= regions.keys()
    assert min(regions["forward"], regions["backward"], regions["optimizer"]) > 0
    in_step = profile["wall_ms"] - profile["outside_step_ms"]
    assert 0 < sum(regions.values()) <= in_step + 1.0, "the regions lie inside train_step"
    assert 0 <= profile["outside_step_ms"] < profile["wall_ms"]


def test_too_short_a_run_is_a_usage_error(toy_data):
    proc = run_script("benchmarks/profile_train.py", "--profile-skip", "4", toy_data, *TRAIN_COMMON, *RUN,
                      "--max-update", "3", check=False)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == ("profile_train.py: error: the run made 3 updates; --profile-skip 4 and "
                                            "--profile-updates 10 need at least 15 (raise --max-update)")


def _event(name, start_us, end_us, device=DeviceType.CPU, annotation=False):
    return FunctionEvent(0, name, 0, start_us, end_us, device_type=device, is_user_annotation=annotation,
                         use_device="cuda")


def test_cuda_annotations_count_neither_as_cpu_time_nor_as_gpu_work():
    """On CUDA a record_function range is also a GPU annotation spanning its kernels, with no CPU time: it must not
    replace the region's CPU time or add to the GPU's busy time (two updates here)."""
    events = [_event("forward", 0, 300), _event("forward", 0, 900, DeviceType.CUDA, annotation=True),
              _event("train_step-10", 0, 2000, DeviceType.CUDA, annotation=True),
              _event("volta_gemm", 100, 140, DeviceType.CUDA), _event("Memcpy HtoD", 150, 170, DeviceType.CUDA),
              _event("forward", 1000, 1500), _event("optimizer", 1600, 1800),
              _event("aten::mm", 1000, 1100)]
    regions, gpu_busy = split_events(events, updates=2, on_gpu=True)
    assert regions == pytest.approx({"forward": (0.3 + 0.5) / 2, "optimizer": 0.2 / 2})
    assert gpu_busy == pytest.approx((0.04 + 0.02) / 2)
    assert split_events(events, updates=2, on_gpu=False)[1] is None
