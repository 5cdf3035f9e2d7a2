"""The lanes' sweep of the Sparse-softmax row kernel (``experiments/kernels/lanes_sweep.py``, an alternative
outside the package until a GPU times it) against the PyTorch path, as test_sparse_softmax_triton.py checks the
product's sweep: in Triton's interpreter on the CPU, compiled on CUDA."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernel is decorated, i.e. at its import below
pytest.importorskip("triton", reason="Triton is not installed")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import lanes_sweep  # noqa: E402  (experiments/kernels: pyproject.toml's pytest pythonpath)
from sparse_softmax.losses import sparse_softmax_triton as kernels  # noqa: E402
from sparse_softmax.losses.sparse_softmax import sparse_softmax_chunk  # noqa: E402
from test_sparse_softmax_triton import (KERNEL_DEVICE, assert_reads_half_logits, assert_same_rows, dense,  # noqa: E402
                                        rows_of)

BY_LANES = lanes_sweep.sparse_softmax_chunk_by_lanes


@pytest.mark.parametrize("n, v, k", [(1, 2, 1), (6, 7, 3), (6, 7, 7), (9, 97, 10), (5, 300, 16), (4, 300, 17)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_lanes_sweep_matches_the_pytorch_rows(n, v, k, smoothing):
    z, target = rows_of(n, v)
    assert_same_rows(z, target, k, smoothing, BY_LANES)


@pytest.mark.parametrize("order", ["ascending", "descending", "random"])
def test_the_lanes_sweep_across_many_blocks(monkeypatch, order):
    """Small blocks, so a row spans many: every lane's two largest change with each block (ascending) or never
    after the first (descending)."""
    monkeypatch.setattr(kernels, "BLOCK", 16)
    z, target = rows_of(5, 16 * 9 + 5, seed=1)
    if order != "random":
        z = z.sort(dim=1, descending=order == "descending").values
    assert_same_rows(z, target, 10, 0.0, BY_LANES)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_lanes_sweep_reads_half_logits(dtype):
    assert_reads_half_logits(dtype, BY_LANES)


@triton.jit
def _no_sweep(z_row, V, K: tl.constexpr, BLOCK: tl.constexpr, INSERT_LIMIT: tl.constexpr):
    """In place of the merging sweep: a top K of nothing, so a row it served has the wrong pairs."""
    return tl.zeros([BLOCK], tl.float32), tl.zeros([BLOCK], tl.float32), tl.full([1, K], kernels.LOWEST, tl.int64)


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


@pytest.mark.skipif(KERNEL_DEVICE == "cuda", reason="swaps a kernel function, which only the interpreter allows")
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the NaN pairs of the rows it gave nothing
def test_lanes_alone_choose_the_top_k_unless_one_may_be_missing(monkeypatch):
    """The lanes' sweep with the merging sweep replaced by one that gives nothing: the rows whose top 10 lie
    in distinct lanes come out exact all the same, and the two that needed the merging sweep do not: it
    is taken exactly where the lanes may have missed a logit (with it, test_the_lanes_sweep_matches_the_pytorch_rows
    and the first assertion show those rows exact)."""
    monkeypatch.setattr(kernels, "BLOCK", 16)
    z, target = lane_rows(6, 16)
    assert_same_rows(z, target, 10, 0.0, lanes_sweep.sparse_softmax_chunk_by_lanes)
    monkeypatch.setattr(lanes_sweep, "_sweep_merging", _no_sweep)
    want = sparse_softmax_chunk(z.clone(), target, 10, 0.0, want_grad=True)
    got = lanes_sweep.sparse_softmax_chunk_by_lanes(z, target, 10, 0.0, want_grad=True)
    right = torch.isclose(dense(got.classes, got.grad, z.shape[1]), dense(want.classes, want.grad, z.shape[1]))
    assert right.all(dim=1).tolist() == [True, False, True, False, True, True]
