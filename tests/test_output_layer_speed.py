"""benchmarks/output_layer_speed.py: the table and plot on the CPU, end to end; and every variant of its GPU table
built and run once through the kernels (on the CPU in Triton's interpreter: what is checked is that each is built,
named and runs, which a GPU run, rare and short, must not be the first to find)."""
from __future__ import annotations

import re

import pytest
import torch

from conftest import run_script, skip_in_fast_tier

pytest.importorskip("triton", reason="Triton is not installed")
import output_layer_speed  # noqa: E402


def test_the_gpu_table_builds_and_runs_every_variant():
    skip_in_fast_tier("every variant of the GPU benchmark")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    steps = output_layer_speed.variants(24, 8, 60, device, torch.float32, impl="triton")
    names = list(steps)
    k, delta = output_layer_speed.K, output_layer_speed.DELTA
    assert names[0] == "baseline: F.linear + F.cross_entropy"
    assert f"sparse_softmax k={k}, fused, deterministic (weight gradient by sorting)" in names
    for share in output_layer_speed.DENSE_SHARES:
        name = f"as_softmax δ={delta}, fused, {share:.0%} dense"
        assert name in names
    for name, (step, _) in steps.items():
        step()


def test_the_cpu_table_and_plot(tmp_path):
    out = tmp_path / "speed"
    run_script("benchmarks/output_layer_speed.py", "--cases", "24x8x60", "--repeats", "1", "--out", out)
    table = (tmp_path / "speed.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| N=24 H=8 V=60 \| (.+?) \| ([\d.]+) \| ([\d.]+) \|", table, flags=re.M)
    assert rows[0][0] == "baseline: F.linear + F.cross_entropy" and float(rows[0][2]) == 1.0
    assert len(rows) == len(output_layer_speed.variants(24, 8, 60, "cpu", torch.float32))
    assert (tmp_path / "speed.png").stat().st_size > 0
