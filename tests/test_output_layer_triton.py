"""The GPU Sparse-softmax output layer (``fused_output_loss`` with blocks of logits scored by the row kernel, then
the backward kernels of ``sparse_softmax/losses/output_layer_triton.py``) against the block path of
test_fused_output_layer.py, and the backward kernels against a float64 gather and scatter of the gradient pairs.
Without CUDA the kernels run in Triton's interpreter on the CPU (TRITON_INTERPRET=1, set by conftest.py), with
tiles made small so that rows, hidden units and the vocabulary each span several; with CUDA they also run
compiled."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

from measure import deterministic_algorithms as deterministic  # noqa: E402
from sparse_softmax.losses import fused_output_loss  # noqa: E402
from sparse_softmax.losses import output_layer_triton as kernels  # noqa: E402
from sparse_softmax.losses.dispatch import Tiles  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def layer(n: int, h: int, v: int, seed: int = 0, bias: bool = False):
    g = torch.Generator().manual_seed(seed)
    hidden, weight = torch.randn(n, h, generator=g), torch.randn(v, h, generator=g) / h**0.5
    return hidden, weight, (torch.randn(v, generator=g) if bias else None), torch.randint(0, v, (n,), generator=g)


@pytest.mark.parametrize("reduction, bias, by_sorting", [
    # the interpreter's row kernel is slow: a case for each way the weight's gradient is summed
    pytest.param("sum", False, False, id="sum-atomic adds"),
    pytest.param("mean", True, False, id="mean-bias-atomic adds"),
    pytest.param("none", True, True, id="none-bias-sorted weight gradient"),
])
def test_fused_output_loss_by_the_kernels_matches_the_blocks(reduction, bias, by_sorting):
    """The kernels' gradient pairs, from blocks of logits scored by the row kernel (several blocks, several sweeps
    of a row), then the backward kernels (the weight's gradient by atomic adds, or by sorting under deterministic
    algorithms), against the CPU's block path."""
    # blocks of H = 24 rows, rows loaded 32 logits at a time, the frequent classes' pairs in several pieces
    tiles = Tiles(fused_elements=24 * 70, sparse_block=32, piece=8)
    hidden, weight, b, target = (x if x is None else x.to(DEVICE) for x in layer(30, 24, 70, seed=2, bias=bias))
    target[[3, 17]] = -100
    row_scale = (torch.rand(30, generator=torch.Generator().manual_seed(5)) if reduction == "none"
                 else torch.ones(())).to(DEVICE)
    results = []
    for impl in ("triton", "torch"):
        inputs = [x if x is None else x.clone().requires_grad_(True) for x in (hidden, weight, b)]
        with deterministic(by_sorting and impl == "triton"):
            out = fused_output_loss(inputs[0], inputs[1], target, "sparse_softmax", k=7, bias=inputs[2],
                                    ignore_index=-100, reduction=reduction, label_smoothing=0.1, impl=impl,
                                    tiles=tiles)
            (out.loss * row_scale).sum().backward()
        results.append([out.loss.detach(), out.nll, out.n_dense, out.n_masked] + [x.grad for x in inputs if x is not None])
    for name, a, b_ in zip(("loss", "nll", "dense", "masked", "grad hidden", "grad weight", "grad bias"), *results):
        torch.testing.assert_close(a, b_, msg=name)
    assert (results[0][4][[3, 17]] == 0).all(), "ignored rows have no gradient"


def gradient_pairs(n: int, pairs: int, v: int, seed: int = 0):
    """k + 1 = ``pairs`` (class, value) pairs a row, as the forward hands them over: classes that recur across
    rows (class 3 in every row, classes below 8 in most) and within one (the target among the top k)."""
    g = torch.Generator().manual_seed(seed)
    classes = torch.randint(0, v, (n, pairs), generator=g)
    classes[:, 0] = 3
    classes[:, 1] = torch.randint(0, 8, (n,), generator=g)
    classes[::3, -1] = classes[::3, 2]
    return classes, torch.randn(n, pairs, generator=g)


@pytest.mark.parametrize("piece", [4, 5, 1024])
@pytest.mark.parametrize("by_sorting", [False, True], ids=["atomic", "sorted"])
def test_backward_kernels_add_the_pairs_gradients(piece, by_sorting):
    """dL/dh and dL/dW from the pairs against a float64 gather and scatter of them, added to what the
    gradients held; by sorting with classes in several pieces (of 4 and 5 pairs, with a remainder) and in one."""
    n, pairs, h, v = 30, 6, 40, 50
    hidden, weight, _, _ = layer(n + 5, h, v, seed=3)
    g = torch.Generator().manual_seed(4)
    rows = torch.randperm(n + 5, generator=g)[:n]
    classes, grad = gradient_pairs(n, pairs, v)
    grad_hidden, grad_weight = torch.randn(n + 5, h, generator=g), torch.randn(v, h, generator=g)
    want_hidden = grad_hidden.double().index_add(
        0, rows, (grad[:, :, None].double() * weight.double()[classes]).sum(dim=1))
    want_weight = grad_weight.double().index_add(0, classes.flatten(), (
        grad[:, :, None].double() * hidden.double()[rows, None, :]).flatten(0, 1))
    want_hidden[rows] -= grad_hidden.double()[rows]  # a counted row's gradient is stored, not added
    on = [x.to(DEVICE) for x in (hidden, weight, rows, classes, grad, grad_hidden, grad_weight)]
    with deterministic(by_sorting):
        kernels.sparse_layer_backward_triton(*on, tiles=Tiles(piece=piece, backward_block_h=16, piece_block=4))
    torch.testing.assert_close(on[5].cpu(), want_hidden.float(), msg="grad hidden")
    torch.testing.assert_close(on[6].cpu(), want_weight.float(), msg="grad weight")


def test_deterministic_algorithms_sort_the_weight_gradient(monkeypatch):
    """Under ``torch.use_deterministic_algorithms(True)`` the weight's gradient is summed by sorting (atomic adds in
    the GPU's order are not deterministic), to the same sums. The sorted sum is watched, not replaced."""
    calls = []
    sort = kernels.sorted_weight_gradient
    monkeypatch.setattr(kernels, "sorted_weight_gradient", lambda *args: calls.append(args) or sort(*args))
    hidden, weight, _, _ = (x.to(DEVICE) if x is not None else x for x in layer(4, 16, 20))
    classes, grad = (x.to(DEVICE) for x in gradient_pairs(4, 3, 20))
    rows = torch.arange(4, device=DEVICE)

    def backward() -> torch.Tensor:
        grad_weight = torch.zeros_like(weight)
        kernels.sparse_layer_backward_triton(hidden, weight, rows, classes, grad, torch.zeros_like(hidden),
                                             grad_weight)
        return grad_weight

    by_atomics = backward()
    assert not calls, "atomic adds by default"
    with deterministic(True):
        by_sorting = backward()
    assert len(calls) == 1, "sorted under deterministic algorithms"
    torch.testing.assert_close(by_sorting, by_atomics)
