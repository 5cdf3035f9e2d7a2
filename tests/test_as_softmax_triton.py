"""The Triton kernel of AS-Softmax (``sparse_softmax/losses/as_softmax_triton.py``) against the PyTorch path,
which test_losses.py checks against brute force: row losses, nll, masked and dense flags and the
weighted gradient. Without CUDA the kernel runs in Triton's interpreter on the CPU (TRITON_INTERPRET=1, set by
conftest.py), so these tests run everywhere Triton is installed; with CUDA they also run compiled on the GPU."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

from sparse_softmax.losses import as_softmax_loss, fused_output_loss  # noqa: E402
from sparse_softmax.losses.as_softmax import as_softmax_rows  # noqa: E402
from sparse_softmax.losses.as_softmax_triton import as_softmax_rows_triton  # noqa: E402
from sparse_softmax.losses.dispatch import Tiles  # noqa: E402
from test_fused_output_layer import IGNORE, Allocations, as_mix  # noqa: E402

KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def mixed_rows(n: int, v: int, seed: int = 0):
    """Logits whose rows at δ = 0.3 are masked (target far ahead), sparse (target and one rival near 1/2)
    and dense (flat), with some -inf entries and weights including 0 (ignored rows)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, v, generator=g)
    target = torch.randint(0, v, (n,), generator=g)
    rows = torch.arange(n)
    z[rows % 3 == 0, :] *= 0.1  # dense
    z[rows[rows % 3 == 1], target[rows % 3 == 1]] += 30.0  # masked
    sparse = rows[rows % 3 == 2]
    z[sparse, target[sparse]] += 12.0
    z[sparse, (target[sparse] + 1) % v] += 12.0
    z[::7, (target[::7] + 2) % v] = float("-inf")
    weight = torch.rand(n, generator=g) + 0.5
    weight[n // 2] = 0.0
    return z, target, weight


# V below, within and across the default blocks
@pytest.mark.parametrize("n, v", [(1, 7), (40, 97), (33, 5000), (9, Tiles().as_block + 3)])
@pytest.mark.parametrize("delta", [0.0, 0.3, 1.0])
def test_kernel_matches_the_pytorch_rows(n, v, delta):
    z, target, weight = mixed_rows(n, v)
    want = as_softmax_rows(z.clone(), target, weight, delta, want_grad=True)  # CPU: the PyTorch path
    got = as_softmax_rows_triton(z.to(KERNEL_DEVICE), target.to(KERNEL_DEVICE), weight.to(KERNEL_DEVICE),
                                 delta, want_grad=True)
    names = ("loss", "nll", "masked", "dense", "grad")
    for name, a, b in zip(names, got, want):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-6, msg=name)
    if delta == 0.3 and n > 3:
        assert got[2].any() and got[3].any() and not (got[2] | got[3]).all(), "masked, sparse and dense rows"
        assert (got[4][got[2]] == 0).all(), "masked rows have exactly zero gradient"


def test_no_gradient_asked_for():
    z, target, weight = mixed_rows(12, 300, seed=1)
    loss, nll, masked, dense, grad = as_softmax_rows_triton(z.to(KERNEL_DEVICE), target.to(KERNEL_DEVICE),
                                                            weight.to(KERNEL_DEVICE), 0.3, want_grad=False)
    want = as_softmax_rows(z, target, weight, 0.3, want_grad=False)
    assert grad is None
    torch.testing.assert_close(loss.cpu(), want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_are_scored_in_float32(dtype):
    z, target, weight = mixed_rows(20, 1000, seed=2)
    z = z.to(dtype)
    got = as_softmax_rows_triton(z.to(KERNEL_DEVICE), target.to(KERNEL_DEVICE), weight.to(KERNEL_DEVICE),
                                 0.3, want_grad=True)
    want = as_softmax_rows(z, target, weight, 0.3, want_grad=True)  # float32 scoring of the same half logits
    torch.testing.assert_close(got[0].cpu(), want[0], rtol=1e-5, atol=1e-5)
    assert got[4].dtype == dtype
    torch.testing.assert_close(got[4].cpu(), want[4].to(dtype), rtol=0, atol=torch.finfo(dtype).eps)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_as_softmax_takes_the_kernel_on_cuda_and_agrees_with_the_cpu():
    z, target, _ = mixed_rows(64, 3000, seed=3)
    target[3] = -100
    cpu = z.clone().requires_grad_(True)
    gpu = z.cuda().requires_grad_(True)
    for logits in (cpu, gpu):
        (as_softmax_loss(logits, target.to(logits.device), 0.3, ignore_index=-100, reduction="mean") * 1.7).backward()
    torch.testing.assert_close(gpu.grad.cpu(), cpu.grad, rtol=1e-5, atol=1e-7)


def test_in_place_writes_the_gradient_over_the_logits():
    z, target, weight = mixed_rows(15, 700, seed=4)
    want = as_softmax_rows(z.clone(), target, weight, 0.3, want_grad=True)
    z = z.to(KERNEL_DEVICE)
    got = as_softmax_rows_triton(z, target.to(KERNEL_DEVICE), weight.to(KERNEL_DEVICE), 0.3, want_grad=True,
                                 in_place=True)
    assert got[4].data_ptr() == z.data_ptr()
    torch.testing.assert_close(z.cpu(), want[4], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="contiguous rows"):
        columns = torch.zeros(700, dtype=torch.long, device=KERNEL_DEVICE)
        as_softmax_rows_triton(z.t(), columns, torch.ones(700, device=KERNEL_DEVICE), 0.3, want_grad=True,
                               in_place=True)


def masked_and_sparse_layer(bias: bool, n: int = 40, h: int = 16, v: int = 300):
    """(hidden, weight, target, bias or None) of a layer whose rows at δ = 0.3 are masked (the target far ahead),
    sparse (two classes near 1/2) or dense, a third each."""
    g = torch.Generator().manual_seed(5)
    weight = torch.nn.functional.normalize(torch.randn(v, h, generator=g), dim=1)
    target = torch.randint(0, v, (n,), generator=g)
    hidden = torch.randn(n, h, generator=g)
    hidden[::3] = 25 * weight[target[::3]]  # the target far ahead: masked at δ = 0.3
    hidden[1::3] = 25 * (weight[target[1::3]] + weight[(target[1::3] + 1) % v])  # two classes near 1/2: sparse
    b = torch.randn(v, generator=g) if bias else None
    return hidden, weight, target, b


@pytest.mark.parametrize("loss, reduction, bias", [
    ("cross_entropy", "sum", False), ("cross_entropy", "none", True), ("as_softmax", "mean", True),
    ("as_softmax", "none", False),
])
def test_fused_output_loss_by_the_row_kernel_matches_the_blocks(loss, reduction, bias):
    """``fused_output_loss`` on a GPU: cross_entropy (as AS with δ = 1) and as_softmax blocks scored by the
    kernel, against the CPU's block path, with ignored rows, masked and sparse rows (AS) and small blocks."""
    hidden, weight, target, b = masked_and_sparse_layer(bias)
    n, v = target.numel(), weight.shape[0]
    target[[4, 20]] = -100
    row_scale = torch.rand(n, generator=torch.Generator().manual_seed(6)) if reduction == "none" else torch.ones(())
    tiles = Tiles(fused_elements=12 * v)  # fused blocks of H = 16 rows
    results = []
    for impl in ("triton", "torch"):
        inputs = [x if x is None else x.to(KERNEL_DEVICE, copy=True).requires_grad_(True)  # own .grad a path
                  for x in (hidden, weight, b)]
        out = fused_output_loss(inputs[0], inputs[1], target.to(KERNEL_DEVICE), loss, delta=0.3, bias=inputs[2],
                                ignore_index=-100, reduction=reduction, impl=impl, tiles=tiles)
        (out.loss * row_scale.to(KERNEL_DEVICE)).sum().backward()
        results.append([out.loss.detach(), out.nll, out.n_masked, out.n_dense]
                       + [x.grad for x in inputs if x is not None])
    if loss == "as_softmax":
        assert 0 < int(results[0][2]) < n - 2, "masked rows and unmasked rows"
        assert int(results[0][3]) < n - 2 - int(results[0][2]), "rows that keep a few classes"
    for name, a, b_ in zip(("loss", "nll", "masked", "dense", "grad hidden", "grad weight", "grad bias"), *results):
        torch.testing.assert_close(a, b_, rtol=1e-5, atol=1e-5, msg=name)


def test_masked_rows_take_the_products_without_a_copy_of_the_block():
    """A block whose AS rows are partly masked takes its two products on the live rows only; their gradient
    reaches them moved to the front of the block's own buffer, never copied out whole beside it, which
    would add up to a block's size to the layer's peak memory. Checked as the tensors of V columns made:
    the block of logits, then nothing over an eighth of its rows."""
    n, h, v = 64, 8, 2000
    hidden, weight, target = as_mix(n, h, v, dtype=torch.float32, seed=3, device=KERNEL_DEVICE)
    with Allocations() as tracker:
        out = fused_output_loss(hidden, weight.requires_grad_(True), target, "as_softmax", delta=0.2,
                                ignore_index=IGNORE, impl="triton", tiles=Tiles(fused_elements=n * v))  # one block
    counted = n - 1  # as_mix ignores one row
    assert 0 < int(out.n_masked) < counted // 2, "masked rows, and more live ones"
    rows = [shape[0] for _, shape in tracker.made if len(shape) == 2 and shape[1] == v]
    assert rows[0] == counted, "the block of logits comes first"
    assert max(rows[1:], default=0) <= -(-(counted - int(out.n_masked)) // 8), f"V-wide tensors of {rows} rows"
