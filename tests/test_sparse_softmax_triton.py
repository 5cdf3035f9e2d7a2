"""The Triton kernel of Sparse-softmax (``sparse_softmax/losses/sparse_softmax_triton.py``) against the
PyTorch path, which test_losses.py checks against brute force: row losses, nll and the gradient's
k + 1 (class, value) pairs, then the loss and the fused output layer with the kernel in place of
``torch.topk``. Without CUDA the kernel runs in Triton's interpreter on the CPU (TRITON_INTERPRET=1, set by
conftest.py), so these tests run everywhere Triton is installed; with CUDA they also run compiled on the GPU."""
from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

from sparse_softmax.losses import fused_output_loss, sparse_softmax_loss  # noqa: E402
from sparse_softmax.losses import sparse_softmax_triton as kernels  # noqa: E402
from sparse_softmax.losses.dispatch import Tiles  # noqa: E402
from sparse_softmax.losses.sparse_softmax import _SparseRows, sparse_softmax_chunk  # noqa: E402

KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rows_of(n: int, v: int, seed: int = 0, scale: float = 3.0):
    """Random logits of both signs with some -inf entries, and random targets."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, v, generator=g) * scale
    z[::3, : max(1, v // 4)] = float("-inf")
    target = torch.randint(0, v, (n,), generator=g)
    target[::3] = v - 1  # a finite target on the rows with -inf entries
    return z, target


def dense(classes: torch.Tensor, grad: torch.Tensor, v: int) -> torch.Tensor:
    """The logit gradient the (class, value) pairs stand for (repeats add up)."""
    return torch.zeros(grad.shape[0], v, dtype=grad.dtype).scatter_add_(1, classes.cpu(), grad.cpu())


def assert_same_rows(z, target, k, smoothing, score=kernels.sparse_softmax_chunk_triton):
    """``score`` (the row kernel's launch, by default) gives the PyTorch path's losses, nll and pairs."""
    want = sparse_softmax_chunk(z.clone(), target, k, smoothing, want_grad=True)  # CPU: the PyTorch path
    got = score(z.to(KERNEL_DEVICE), target.to(KERNEL_DEVICE), k, smoothing, want_grad=True)
    torch.testing.assert_close(got.loss.cpu(), want.loss, msg="loss")
    torch.testing.assert_close(got.nll.cpu(), want.nll, msg="nll")
    assert got.classes.shape == got.grad.shape == (z.shape[0], k + 1)
    assert (got.classes[:, k].cpu() == target).all(), "the last pair is the target"
    torch.testing.assert_close(dense(got.classes, got.grad, z.shape[1]), dense(want.classes, want.grad, z.shape[1]),
                               msg="gradient")


@pytest.mark.parametrize("n, v, k", [(1, 2, 1), (6, 7, 3), (6, 7, 7), (9, 97, 10), (5, 300, 16), (4, 300, 17)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_kernel_matches_the_pytorch_rows(n, v, k, smoothing):
    z, target = rows_of(n, v)
    assert_same_rows(z, target, k, smoothing)


def swept_rows(n: int, **options):
    """The row kernel's launch for ``n`` rows with ``options``, and the (N,) tensor it sets to which rows the
    merging sweep swept again."""
    swept = torch.full((n,), -1, dtype=torch.int32, device=KERNEL_DEVICE)
    return functools.partial(kernels.sparse_softmax_chunk_triton, swept=swept, **options), swept


def sorted_rows(order: str, lanes: int):
    """Rows spanning many blocks of ``lanes``: ascending logits change every lane's two largest with each block,
    descending ones never after the first."""
    z, target = rows_of(5, lanes * 9 + 5, seed=1)
    return (z if order == "random" else z.sort(dim=1, descending=order == "descending").values), target


def top_three_in_one_lane(z: torch.Tensor, lanes: int) -> torch.Tensor:
    """``z`` with each row's three largest logits moved (by swaps) into the lane of its largest: that lane lets
    the third go, so only the merging sweep can find the top k."""
    z = z.clone()
    for row in z:
        top = row.topk(3).indices.tolist()
        slots = [top[0] % lanes + i * lanes for i in range(3)]
        values = row[top].clone()
        row[[c for c in top if c not in slots]] = row[[c for c in slots if c not in top]].clone()
        row[slots] = values
    return z


@pytest.mark.parametrize("order", ["ascending", "descending"])
def test_the_lanes_alone_across_many_blocks(order):
    """Small blocks, so that a row spans many; no lane holds three of a sorted row's top 10, so the lanes decide
    every row."""
    score, swept = swept_rows(5, tiles=Tiles(sparse_block=16))
    assert_same_rows(*sorted_rows(order, 16), 10, 0.0, score)
    assert swept.tolist() == [0] * 5


@pytest.mark.parametrize("order", ["ascending", "descending", "random"])
@pytest.mark.parametrize("insert_limit", [0, 4, 64])
def test_the_merging_sweep_across_many_blocks(order, insert_limit):
    """Rows that only the merging sweep can decide, spanning many blocks: ascending logits merge candidates at
    every block, descending ones at the first alone; they are merged by sorting (limit 0), by insertion (64: a
    block's every column) or by either."""
    z, target = sorted_rows(order, 16)
    score, swept = swept_rows(5, tiles=Tiles(sparse_block=16, insert_limit=insert_limit))
    assert_same_rows(top_three_in_one_lane(z, 16), target, 10, 0.0, score)
    assert swept.tolist() == [1] * 5


def test_the_merging_sweep_is_taken_exactly_where_the_lanes_may_miss():
    """Random rows whose top 10 lie in distinct lanes are decided by the lanes alone; the two that need the merging
    sweep (three of the top k in one lane; fewer than k finite logits) are swept again, and all come out exact."""
    g = torch.Generator().manual_seed(7)
    z = torch.randn(6, 64, generator=g)
    z[1, [5, 21, 53]] = torch.tensor([9.0, 8.0, 7.0])  # lane 5 of 16
    z[3] = float("-inf")
    z[3, 2] = 0.5
    target = torch.randint(0, 64, (6,), generator=g)
    target[3] = 2
    score, swept = swept_rows(6, tiles=Tiles(sparse_block=16))
    assert_same_rows(z, target, 10, 0.0, score)
    assert swept.tolist() == [0, 1, 0, 1, 0, 0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_reads_half_logits(dtype):
    """Half logits: float32 losses, and the PyTorch path's on the same logits in float32."""
    z, target = rows_of(6, 150, seed=2)
    z = z.to(dtype)
    want = sparse_softmax_chunk(z.float(), target, 10, 0.0, want_grad=True)
    got = kernels.sparse_softmax_chunk_triton(z.to(KERNEL_DEVICE), target.to(KERNEL_DEVICE), 10, 0.0, want_grad=True)
    assert got.loss.dtype == torch.float32
    torch.testing.assert_close(got.loss.cpu(), want.loss)
    torch.testing.assert_close(dense(got.classes, got.grad, 150), dense(want.classes, want.grad, 150))


def test_no_gradient_asked_for():
    z, target = rows_of(8, 60, seed=3)
    got = kernels.sparse_softmax_chunk_triton(z.to(KERNEL_DEVICE), target.to(KERNEL_DEVICE), 5, 0.0, want_grad=False)
    want = sparse_softmax_chunk(z.clone(), target, 5, 0.0, want_grad=False)
    assert got.classes is None and got.grad is None
    torch.testing.assert_close(got.loss.cpu(), want.loss)


def test_scattered_backward_gradchecks_in_float64():
    """The backward of ``_SparseRows`` (the pairs scattered into the logits' gradient), checked by finite
    differences with the PyTorch block scorer, which runs in float64."""
    z, target = rows_of(4, 9, seed=4, scale=1.0)
    z = z.double().nan_to_num(neginf=-5.0).requires_grad_(True)

    def score(logits, tgt, k, smoothing, want_grad):
        return sparse_softmax_chunk(logits.clone(), tgt, k, smoothing, want_grad)

    assert torch.autograd.gradcheck(lambda x: _SparseRows.apply(x, target, 3, 0.2, score), (z,))


@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_loss_with_the_kernel_matches_autograd_through_topk(reduction):
    z, target = (x.to(KERNEL_DEVICE) for x in rows_of(10, 50, seed=5))
    target[4] = -100
    weights = (torch.rand(10, generator=torch.Generator().manual_seed(0)) if reduction == "none"
               else torch.ones(())).to(KERNEL_DEVICE)
    results = []
    for impl in ("triton", "torch"):
        logits = z.clone().requires_grad_(True)
        loss = sparse_softmax_loss(logits, target, 6, ignore_index=-100, reduction=reduction, label_smoothing=0.1,
                                   impl=impl)
        (loss * weights).sum().backward()
        results.append((loss.detach(), logits.grad))
    (loss_k, grad_k), (loss_t, grad_t) = results
    torch.testing.assert_close(loss_k, loss_t)
    torch.testing.assert_close(grad_k, grad_t)
    assert (grad_k[4] == 0).all(), "an ignored row has no gradient"


def test_fused_output_layer_with_the_kernels():
    """The fused layer's kernel path (the row kernel's pairs, then the backward kernels of
    test_output_layer_triton.py) against its PyTorch blocks, at the default tiles."""
    g = torch.Generator().manual_seed(6)
    hidden, weight = torch.randn(12, 8, generator=g), torch.randn(40, 8, generator=g)
    hidden, weight, target = (x.to(KERNEL_DEVICE) for x in (hidden, weight, torch.randint(0, 40, (12,), generator=g)))
    results = []
    for impl in ("triton", "torch"):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        out = fused_output_loss(h, w, target, "sparse_softmax", k=5, impl=impl)
        out.loss.backward()
        results.append((out.loss.detach(), out.nll, h.grad, w.grad))
    for name, a, b in zip(("loss", "nll", "grad hidden", "grad weight"), *results):
        torch.testing.assert_close(a, b, msg=name)


@pytest.mark.parametrize("logits, k, why", [
    (torch.zeros(2, 300, dtype=torch.float64), 5, "float32/bfloat16/float16"),
    (torch.zeros(2, 300), 129, "at most k = 128"),
])
def test_impl_triton_says_why_it_cannot_run(logits, k, why):
    with pytest.raises(ValueError, match=f"impl='triton' cannot run here: .*{why}"):
        sparse_softmax_loss(logits, torch.zeros(2, dtype=torch.long), k, impl="triton")
    with pytest.raises(ValueError, match="impl must be one of"):
        sparse_softmax_loss(logits, torch.zeros(2, dtype=torch.long), 5, impl="cuda")
