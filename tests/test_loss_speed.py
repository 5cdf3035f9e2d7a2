"""benchmarks/loss_speed.py: its losses built and run once on the CPU, which a GPU run, rare and short, must not be
the first to do."""
from __future__ import annotations

import torch

import loss_speed  # benchmarks/: pyproject.toml's pytest pythonpath


def test_the_losses_are_built_and_run():
    assert list(loss_speed.LOSSES) == ["cross_entropy", "sparse_softmax(k=10)", "as_softmax(δ=0.3)"]
    logits, target = loss_speed.make_inputs(12, 50, "cpu", torch.float32)
    for fn in loss_speed.LOSSES.values():
        loss_speed.step(fn, logits, target)
        assert logits.grad is not None and torch.isfinite(logits.grad).all()
