"""The lanes' sweep of the Sparse-softmax row kernel (``experiments/kernels/lanes_sweep.py``, an alternative
outside the package until a GPU times it) against the PyTorch path, as test_sparse_softmax_triton.py checks the
product's sweep: in Triton's interpreter on the CPU (TRITON_INTERPRET=1, set by conftest.py), compiled on CUDA."""
from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

import lanes_sweep  # noqa: E402  (experiments/kernels: pyproject.toml's pytest pythonpath)
from sparse_softmax.losses.dispatch import Tiles  # noqa: E402
from test_sparse_softmax_triton import KERNEL_DEVICE, assert_reads_half_logits, assert_same_rows, rows_of  # noqa: E402

BY_LANES = lanes_sweep.sparse_softmax_chunk_by_lanes
SMALL_BLOCKS = Tiles(sparse_block=16)


@pytest.mark.parametrize("n, v, k", [(1, 2, 1), (6, 7, 3), (6, 7, 7), (9, 97, 10), (5, 300, 16), (4, 300, 17)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_lanes_sweep_matches_the_pytorch_rows(n, v, k, smoothing):
    z, target = rows_of(n, v)
    assert_same_rows(z, target, k, smoothing, BY_LANES)


@pytest.mark.parametrize("order", ["ascending", "descending", "random"])
def test_the_lanes_sweep_across_many_blocks(order):
    """Small blocks, so a row spans many: every lane's two largest change with each block (ascending) or never
    after the first (descending)."""
    z, target = rows_of(5, 16 * 9 + 5, seed=1)
    if order != "random":
        z = z.sort(dim=1, descending=order == "descending").values
    assert_same_rows(z, target, 10, 0.0, functools.partial(BY_LANES, tiles=SMALL_BLOCKS))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_lanes_sweep_reads_half_logits(dtype):
    assert_reads_half_logits(dtype, BY_LANES)


def lane_rows(n: int, lanes: int):
    """Random rows of 4 lanes' width in which row 1 has its top three in lane 5, and row 3 a single finite
    logit (both need the merging sweep); no lane of the other rows holds three of their top 10."""
    g = torch.Generator().manual_seed(7)
    z = torch.randn(n, 4 * lanes, generator=g)
    z[1, [5, 5 + lanes, 5 + 3 * lanes]] = torch.tensor([9.0, 8.0, 7.0])
    z[3] = float("-inf")
    z[3, 2] = 0.5
    target = torch.randint(0, 4 * lanes, (n,), generator=g)
    target[3] = 2
    return z, target


def test_the_merging_sweep_is_taken_exactly_where_the_lanes_may_miss():
    """Rows whose top 10 lie in distinct lanes are chosen by the lanes alone; the two that need the merging sweep
    (three of the top k in one lane; fewer than k finite logits) are swept again, and all come out exact."""
    z, target = lane_rows(6, 16)
    swept = torch.full((6,), -1, dtype=torch.int32, device=KERNEL_DEVICE)
    assert_same_rows(z, target, 10, 0.0, functools.partial(BY_LANES, tiles=SMALL_BLOCKS, swept=swept))
    assert swept.tolist() == [0, 1, 0, 1, 0, 0]
