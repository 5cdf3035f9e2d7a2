"""AS rows that keep few classes handing their gradient over as pairs (``experiments/kernels/as_pairs.py``, an
alternative outside the package until a GPU times it): the kernel against the PyTorch path, and the fused layer
with it against the product's block path. In Triton's interpreter on the CPU (TRITON_INTERPRET=1, set by
conftest.py), compiled on CUDA."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

import as_pairs  # noqa: E402  (experiments/kernels: pyproject.toml's pytest pythonpath)
from sparse_softmax.losses import fused_output_loss  # noqa: E402
from sparse_softmax.losses.as_softmax import as_softmax_chunk, as_softmax_rows  # noqa: E402
from sparse_softmax.losses.dispatch import Tiles  # noqa: E402
from test_as_softmax_triton import KERNEL_DEVICE, masked_and_sparse_layer, mixed_rows  # noqa: E402


@pytest.mark.parametrize("cap", [1, 2, 5])
def test_rows_keeping_few_classes_write_their_gradient_as_pairs(cap):
    """A row that keeps 2 to ``cap`` classes writes its kept classes (in column order) and their
    gradient values there instead of its gradient row; the others write their gradient rows as before; every
    row's kept count is written. Against the PyTorch path's gradient and kept counts."""
    z, target, weight = mixed_rows(30, 300, seed=6)  # masked rows keep 1 class, sparse ones 2, dense ones more
    want = as_softmax_rows(z.clone(), target, weight, 0.3, want_grad=True)
    kept = as_softmax_chunk(z.clone(), target, 0.3, want_grad=False).kept
    pairs = as_pairs.KeptPairs.empty(30, cap, KERNEL_DEVICE)
    buffer = z.to(KERNEL_DEVICE)
    got = as_pairs.as_softmax_rows_pairs_triton(buffer, target.to(KERNEL_DEVICE), weight.to(KERNEL_DEVICE), 0.3, pairs)
    for name, a, b in zip(("loss", "nll", "masked", "dense"), got, want):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-6, msg=name)
    assert (pairs.kept.cpu() == kept).all(), "kept counts"
    written = (kept > 1) & (kept <= cap)
    assert written.any() == (cap > 1), "rows that keep two classes are written as pairs when cap allows"
    for row in range(30):
        if kept[row] > cap:
            torch.testing.assert_close(buffer[row].cpu(), want[4][row], rtol=1e-5, atol=1e-6)
        elif written[row]:
            columns = want[4][row].nonzero().squeeze(1)
            assert pairs.classes[row, :kept[row]].cpu().tolist() == columns.tolist(), f"row {row}'s classes"
            torch.testing.assert_close(pairs.values[row, :kept[row]].cpu(), want[4][row, columns], rtol=1e-5,
                                       atol=1e-6)



@pytest.mark.parametrize("bias", [False, True])
def test_the_fused_layer_with_pairs_matches_the_blocks(bias):
    """The loss and gradients of the fused as_softmax with its few-class rows as pairs (backward kernels) and the
    others by the products, against ``fused_output_loss``'s block path on the CPU: masked, sparse and dense rows,
    small blocks, the hidden units in two parts."""
    hidden, weight, target, b = masked_and_sparse_layer(bias)
    n, v = target.numel(), weight.shape[0]
    tiles = Tiles(fused_elements=12 * v, backward_block_h=8)  # fused blocks of H = 16 rows
    inputs = [x if x is None else x.clone().requires_grad_(True) for x in (hidden, weight, b)]
    want = fused_output_loss(inputs[0], inputs[1], target, "as_softmax", delta=0.3, bias=inputs[2], impl="torch",
                             tiles=tiles)
    want.loss.backward()
    assert 0 < int(want.n_masked) < n and int(want.n_dense) < n - int(want.n_masked), "masked, sparse, dense"
    got = as_pairs.fused_as_softmax_by_pairs(*(x if x is None else x.to(KERNEL_DEVICE) for x in (hidden, weight)),
                                             target.to(KERNEL_DEVICE), 0.3, 4,
                                             bias=None if b is None else b.to(KERNEL_DEVICE), tiles=tiles)
    names = ("loss", "grad hidden", "grad weight", "grad bias")
    for name, a, b_ in zip(names, got, [want.loss, *(x.grad for x in inputs if x is not None)]):
        torch.testing.assert_close(a.cpu(), b_.detach(), rtol=1e-5, atol=1e-5, msg=name)
