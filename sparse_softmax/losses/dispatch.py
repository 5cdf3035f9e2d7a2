"""How a loss runs: on PyTorch or by its Triton kernel (``impl``), and the sizes it cuts its work into (``Tiles``).

The Triton kernels are the GPU paths: ``sparse_softmax_triton`` (Sparse-softmax rows), ``as_softmax_triton``
(AS-Softmax rows, and the fused layer's cross_entropy, AS with δ = 1) and ``output_layer_triton`` (the fused
Sparse-softmax layer's backward). Every loss that has one takes ``impl``: "auto" (the default) runs the kernel
where it serves the tensors, PyTorch elsewhere; "torch" always PyTorch; "triton" always the kernel, or an error
saying why it cannot (on the CPU it runs in Triton's interpreter, with ``TRITON_INTERPRET=1`` set before the
package is imported: the tests do that).
"""
from __future__ import annotations

import dataclasses
import importlib.util

import torch
from torch import Tensor

#: Whether Triton is installed (PyTorch's CUDA builds ship it; CPU builds need not): the one check the loss
#: modules import their kernels behind.
TRITON = importlib.util.find_spec("triton") is not None
IMPLS = ("auto", "torch", "triton")
#: The logits' dtypes the kernels take; they compute in float32, so float64 stays on PyTorch (for gradcheck).
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: The largest top k the Sparse-softmax row kernel keeps in registers; larger k stay on PyTorch.
MAX_K = 128


@dataclasses.dataclass(frozen=True)
class Tiles:
    """The sizes a loss cuts its work into. They change its speed and memory, never its result beyond the order
    of float sums. The defaults are the fastest of ``tools/kernel_tuning.py``'s on the GPUs in
    ``benchmarks/results/gpu_*.md``; tests make them small, so that a tiny case spans several blocks of each kind.

    Attributes:
        fused_elements: logits in a block of rows that ``fused_output_loss`` computes from the features at once
            (at least as many rows as the features have dimensions). None: 2^24 on a CPU, where each block's
            product reads the whole weight again, so a block takes enough rows to keep the product as fast as one
            over all rows; 2^28 on an accelerator, where fewer, larger blocks amortise launches and the V×H
            weight-gradient sum each block adds to.
        scored_elements: logits the PyTorch path scores at once (a part of a fused block, a block of
            ``as_softmax``'s rows). None: 2^20 on a CPU, to stay in cache through the loss's passes over them;
            2^24 on an accelerator.
        sparse_block, sparse_warps: the lanes of the Sparse-softmax row kernel (the logits a program loads at once),
            and its warps. Each lane holds six values through the sweep and the top k is then chosen among twice
            as many 64-bit keys, so it has fewer lanes than the AS kernel.
        insert_limit: in the row kernel's merging sweep (the rare rows the lanes cannot decide), the most
            candidates a row of a block may have for them to be inserted one by one into its running top k rather
            than sorted in.
        as_block, as_warps: logits a program of the AS row kernel loads at once, and its warps.
        backward_block_h: hidden units a program of the sparse layer's backward kernels takes.
        piece: the most pairs of one class that one program of the sorted (deterministic) weight gradient sums.
        piece_block: the pairs a program of the backward kernels loads at once.
    """

    fused_elements: int | None = None
    scored_elements: int | None = None
    sparse_block: int = 512
    sparse_warps: int = 2
    insert_limit: int = 4
    as_block: int = 2048
    as_warps: int = 4
    backward_block_h: int = 256
    piece: int = 256
    piece_block: int = 16

    def rows(self, device: torch.device, num_classes: int, fused: bool, width: int = 1) -> int:
        """How many rows of ``num_classes`` logits a block takes: ``fused_elements`` (``fused``) or
        ``scored_elements`` worth, at least ``width`` and 1."""
        cpu = device.type == "cpu"
        if fused:
            budget = self.fused_elements or (1 << 24 if cpu else 1 << 28)
        else:
            budget = self.scored_elements or (1 << 20 if cpu else 1 << 24)
        return max(width, budget // num_classes, 1)


def check_impl(impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def use_triton(tensor: Tensor, impl: str, k: int | None = None, refused: str | None = None) -> bool:
    """Whether a loss of ``tensor`` (logits, or the output layer's features) runs on its Triton kernel.

    Args:
        tensor: what the kernel would read.
        impl: "auto": where a kernel serves it (a CUDA tensor of ``KERNEL_DTYPES``, and ``k ≤ MAX_K`` for
            Sparse-softmax); "torch": never; "triton": always, or a ``ValueError`` saying why not.
        k: Sparse-softmax's top k, when the kernel is its row kernel.
        refused: why no kernel serves this loss's settings at all (e.g. a label smoothing the kernel lacks).

    Returns:
        True for the kernel's path, False for PyTorch's.
    """
    if impl == "torch":
        return False
    reason = refused
    if reason is None and not TRITON:
        reason = "Triton is not installed"
    if reason is None and tensor.dtype not in KERNEL_DTYPES:
        reason = f"the kernels take float32/bfloat16/float16 tensors, not {tensor.dtype}"
    if reason is None and k is not None and k > MAX_K:
        reason = f"the row kernel keeps at most k = {MAX_K}, not {k}"
    if impl == "triton" and reason is not None:
        raise ValueError(f"impl='triton' cannot run here: {reason}")
    return reason is None and (impl == "triton" or tensor.is_cuda)
