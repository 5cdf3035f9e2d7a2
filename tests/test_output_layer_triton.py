"""The on-chip Sparse-softmax output layer (``sparse_softmax/losses/output_layer_triton.py``) against
``F.linear`` + the PyTorch block scorer (which test_losses.py checks against brute force), and
``fused_output_loss`` with the GPU kernels (the on-chip forward, or logit blocks and the row kernel; the
backward kernel) against the block path of test_fused_output_layer.py. Without CUDA the kernel
runs in Triton's interpreter on the CPU (TRITON_INTERPRET=1), with tiles made small so that rows, hidden
units and the vocabulary each span several; with CUDA it also runs compiled, at its own tile sizes."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernel is decorated, i.e. at its import below
pytest.importorskip("triton", reason="Triton is not installed")

from sparse_softmax.losses import _common, fused_output_loss, output_layer  # noqa: E402
from sparse_softmax.losses import output_layer_triton as kernels  # noqa: E402
from sparse_softmax.losses import sparse_softmax_triton as row_kernel  # noqa: E402
from sparse_softmax.losses.sparse_softmax import sparse_softmax_chunk  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    if DEVICE == "cpu":  # the interpreter: small tiles, so that every dimension spans several
        monkeypatch.setattr(kernels, "BLOCK_M", 16)
        monkeypatch.setattr(kernels, "BLOCK_V", 32)
        monkeypatch.setattr(kernels, "BLOCK_H", 16)


def layer(n: int, h: int, v: int, seed: int = 0, bias: bool = False):
    g = torch.Generator().manual_seed(seed)
    hidden, weight = torch.randn(n, h, generator=g), torch.randn(v, h, generator=g) / h**0.5
    return hidden, weight, (torch.randn(v, generator=g) if bias else None), torch.randint(0, v, (n,), generator=g)


def assert_scores_like_the_blocks(hidden, weight, bias, rows, target, k, smoothing):
    logits = F.linear(hidden[rows], weight, bias).float()  # rounded to the inputs' dtype, as the layer's
    want = sparse_softmax_chunk(logits, target, k, smoothing, want_grad=True)
    on = [x if x is None else x.to(DEVICE) for x in (hidden, weight, bias, rows, target)]
    got = kernels.sparse_output_layer_triton(*on, k, smoothing, want_grad=True)
    torch.testing.assert_close(got.loss.cpu(), want.loss, msg="loss")
    torch.testing.assert_close(got.nll.cpu(), want.nll, msg="nll")
    assert (got.classes[:, k].cpu() == target).all(), "the last pair is the target"
    assert_same_top_k(logits, got.classes[:, :k].cpu(), got.grad.cpu(), want.grad, k)


def assert_same_top_k(logits, classes, grad, want_grad, k):
    """The pairs name a top k of each row of ``logits`` (k distinct classes, none below the row's k-th
    logit) and carry the gradient values of the reference's pairs. Half-precision logits tie often, and
    which of tied classes a top k takes is the one thing the kernel and ``torch.topk`` may choose apart."""
    assert (classes.sort(dim=1).values.diff(dim=1) > 0).all(), "k distinct classes a row"
    kth = logits.topk(k, dim=1).values[:, -1:]
    assert (logits.gather(1, classes) >= kth).all(), "a class below the row's k-th logit"
    torch.testing.assert_close(grad.sort(dim=1).values, want_grad.sort(dim=1).values, msg="gradient")


@pytest.mark.parametrize("n, h, v, k, bias, smoothing", [
    (1, 16, 2, 1, False, 0.0), (20, 24, 100, 10, False, 0.0), (20, 24, 100, 10, True, 0.1),
    (33, 40, 70, 16, False, 0.0), (7, 16, 33, 33, True, 0.1),
])
def test_kernel_scores_like_linear_then_the_block_scorer(n, h, v, k, bias, smoothing):
    hidden, weight, b, target = layer(n + 3, h, v, bias=bias)
    rows = torch.arange(n) + 3  # a subset of the features' rows, as fused_output_loss passes the counted ones
    assert_scores_like_the_blocks(hidden, weight, b, rows, target[:n], k, smoothing)


@pytest.mark.parametrize("order", ["ascending", "descending", "random"])
@pytest.mark.parametrize("insert_limit", [0, 64])
def test_every_tile_merged_or_none_after_the_first(monkeypatch, order, insert_limit):
    """Logits that grow (fall) along the vocabulary for every row: each tile beats the running top k
    (is merged), or none after the first does (every later tile skipped); the candidates merged by
    sorting (limit 0) or one by one (64: a tile's every column)."""
    monkeypatch.setattr(kernels, "INSERT_LIMIT", insert_limit)
    n, h, v = 18, 16, 150
    direction = F.normalize(torch.randn(h), dim=0)
    steps = {"ascending": torch.linspace(-3, 3, v), "descending": torch.linspace(3, -3, v),
             "random": torch.randn(v)}[order]
    weight = steps[:, None] * direction[None, :] + 0.01 * torch.randn(v, h)
    hidden = direction[None, :] * torch.rand(n, 1) * 4 + 0.01 * torch.randn(n, h)
    assert_scores_like_the_blocks(hidden, weight, None, torch.arange(n), torch.randint(0, v, (n,)), 10, 0.0)


@pytest.mark.parametrize("dtype", [
    torch.float16,
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
        DEVICE == "cpu", reason="Triton's interpreter multiplies bf16 tiles as their raw bits (tl.dot off by 1e10)")),
])
def test_half_logits_are_rounded_as_the_layers(dtype):
    hidden, weight, _, target = layer(20, 32, 64, seed=1)
    hidden, weight = hidden.to(dtype), weight.to(dtype)
    assert_scores_like_the_blocks(hidden, weight, None, torch.arange(20), target, 10, 0.0)


@pytest.fixture
def sparse_kernels(monkeypatch):
    """``fused_output_loss`` takes the kernels' path for sparse_softmax on any device."""
    monkeypatch.setattr(output_layer, "_sparse_kernels", lambda hidden, k: kernels if k <= kernels.MAX_K else None)


@pytest.mark.parametrize("on_chip, reduction, bias, by_sorting", [
    pytest.param(True, "sum", False, False, id="on chip-sum"),
    pytest.param(True, "mean", True, False, id="on chip-mean-bias"),
    pytest.param(True, "none", True, False, id="on chip-none-bias"),
    pytest.param(True, "sum", False, True, id="on chip-sum-sorted weight gradient"),
    # the interpreter's row kernel is slow: one case for what differs, the forward
    pytest.param(False, "mean", True, False, id="logit blocks-mean-bias"),
])
def test_fused_output_loss_by_the_kernels_matches_the_blocks(sparse_kernels, monkeypatch, on_chip, reduction, bias,
                                                             by_sorting):
    """The kernels' gradient pairs, from the on-chip forward or from blocks of logits scored by the row kernel
    (several blocks, several sweeps of a row), then the backward kernels (the weight's gradient by atomic adds
    or by sorting), against the CPU's block path."""
    monkeypatch.setattr(output_layer, "SPARSE_ON_CHIP", on_chip)
    monkeypatch.setattr(kernels, "SORTED_WEIGHT_GRADIENT", by_sorting)
    monkeypatch.setattr(kernels, "PIECE", 8)  # the frequent classes' pairs in several pieces
    monkeypatch.setitem(_common._CHUNK_ELEMENTS, ("cpu", True), 24 * 70)  # blocks of H = 24 rows on the CPU
    monkeypatch.setitem(_common._ACCELERATOR_CHUNK_ELEMENTS, True, 24 * 70)  # and on CUDA
    monkeypatch.setattr(row_kernel, "BLOCK", 32)
    hidden, weight, b, target = (x if x is None else x.to(DEVICE) for x in layer(30, 24, 70, seed=2, bias=bias))
    target[[3, 17]] = -100
    row_scale = (torch.rand(30) if reduction == "none" else torch.ones(())).to(DEVICE)
    results = []
    for path in ("kernels", "blocks"):
        if path == "blocks":
            monkeypatch.setattr(output_layer, "_sparse_kernels", lambda hidden, k: None)
        inputs = [x if x is None else x.clone().requires_grad_(True) for x in (hidden, weight, b)]
        out = fused_output_loss(inputs[0], inputs[1], target, "sparse_softmax", k=7, bias=inputs[2],
                                ignore_index=-100, reduction=reduction, label_smoothing=0.1)
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
@pytest.mark.parametrize("counted", [False, True], ids=["every pair", "counted pairs"])
def test_backward_kernels_add_the_pairs_gradients(monkeypatch, piece, by_sorting, counted):
    """dL/dh and dL/dW from the pairs against a float64 gather and scatter of them, added to what the
    gradients held; by sorting with classes in several pieces (PIECE 4 and 5, with a remainder) and in one;
    every pair of a row, or (AS-Softmax's rows) only a row's first few, the rest holding values that count."""
    monkeypatch.setattr(kernels, "SORTED_WEIGHT_GRADIENT", by_sorting)
    monkeypatch.setattr(kernels, "PIECE", piece)
    monkeypatch.setattr(kernels, "BACKWARD_BLOCK_H", 16)
    monkeypatch.setattr(kernels, "PIECE_BLOCK", 4)
    n, pairs, h, v = 30, 6, 40, 50
    hidden, weight, _, _ = layer(n + 5, h, v, seed=3)
    rows = torch.randperm(n + 5)[:n]
    classes, grad = gradient_pairs(n, pairs, v)
    counts = torch.randint(1, pairs + 1, (n,)) if counted else torch.full((n,), pairs)
    given = (torch.arange(pairs) < counts[:, None]).double()
    grad_hidden, grad_weight = torch.randn(n + 5, h), torch.randn(v, h)
    want_hidden = grad_hidden.double().index_add(
        0, rows, (given[:, :, None] * grad[:, :, None].double() * weight.double()[classes]).sum(dim=1))
    want_weight = grad_weight.double().index_add(0, classes.flatten(), (
        given[:, :, None] * grad[:, :, None].double() * hidden.double()[rows, None, :]).flatten(0, 1))
    want_hidden[rows] -= grad_hidden.double()[rows]  # a counted row's gradient is stored, not added
    on = [x.to(DEVICE) for x in (hidden, weight, rows, classes, grad, grad_hidden, grad_weight)]
    kernels.sparse_layer_backward_triton(*on, counts=counts.to(DEVICE) if counted else None)
    torch.testing.assert_close(on[5].cpu(), want_hidden.float(), msg="grad hidden")
    torch.testing.assert_close(on[6].cpu(), want_weight.float(), msg="grad weight")


def test_deterministic_algorithms_sort_the_weight_gradient(monkeypatch):
    """Under ``torch.use_deterministic_algorithms(True)`` the weight's gradient is summed by sorting even with
    ``SORTED_WEIGHT_GRADIENT`` off: atomic adds in the GPU's order are not deterministic."""
    calls = []
    monkeypatch.setattr(kernels, "sorted_weight_gradient", lambda *args: calls.append(args))
    hidden, weight, _, _ = (x.to(DEVICE) if x is not None else x for x in layer(4, 16, 20))
    classes, grad = (x.to(DEVICE) for x in gradient_pairs(4, 3, 20))
    rows = torch.arange(4, device=DEVICE)
    backward = lambda: kernels.sparse_layer_backward_triton(  # noqa: E731
        hidden, weight, rows, classes, grad, torch.zeros_like(hidden), torch.zeros_like(weight))
    backward()
    assert not calls, "atomic adds by default"
    torch.use_deterministic_algorithms(True)
    try:
        backward()
    finally:
        torch.use_deterministic_algorithms(False)
    assert len(calls) == 1, "sorted under deterministic algorithms"
