"""benchmarks/profile_train.py: fairseq-train with each update's time split into where it went."""
from __future__ import annotations

import json

from conftest import TRAIN_COMMON, run_script

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
    assert proc.stderr.splitlines()[-1] == ("profile_train.py: error: the run made 3 updates; --profile-skip 4 "
                                            "needs at least 6 (raise --max-update)")
