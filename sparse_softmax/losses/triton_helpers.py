"""Triton helpers that several kernels share (the row kernels of ``sparse_softmax_triton`` and
``as_softmax_triton``)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def online_lse(lane_max, lane_sum, z):
    """The lanes' running maxima and sums of exp(z - maximum) after the block ``z`` (online softmax)."""
    new_max = tl.maximum(lane_max, z)
    shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # lanes with nothing finite yet
    return new_max, lane_sum * tl.exp(lane_max - shift) + tl.exp(z - shift)
