"""The loss math, as plain PyTorch functions usable without fairseq.

Every function takes logits ``(N, V)`` and integer targets ``(N,)`` (multi-label: multi-hot
``(N, V)``), ignores rows whose target equals ``ignore_index``, reduces with ``"sum"`` (default, as
fairseq criterions expect), ``"mean"`` (over non-ignored rows) or ``"none"``, and computes in float32
for half-precision inputs.
"""
from ._common import LossResult
from .as_softmax import as_softmax, as_softmax_loss
from .multilabel import as_multilabel_loss, as_multilabel_masks, multilabel_categorical_crossentropy
from .softmax_variants import am_softmax_loss, soft_margin_softmax_loss, softmax_loss, temperature_softmax_loss
from .output_layer import fused_output_loss
from .sparse_softmax import sparse_softmax_loss
from .sparsemax import entmax15_loss, sparsemax_loss
from .taylor import sm_taylor_softmax_loss, taylor_expansion, taylor_softmax_loss

__all__ = [
    "LossResult",
    "am_softmax_loss",
    "as_multilabel_loss",
    "as_multilabel_masks",
    "as_softmax",
    "as_softmax_loss",
    "entmax15_loss",
    "fused_output_loss",
    "multilabel_categorical_crossentropy",
    "soft_margin_softmax_loss",
    "sm_taylor_softmax_loss",
    "softmax_loss",
    "sparse_softmax_loss",
    "sparsemax_loss",
    "taylor_expansion",
    "taylor_softmax_loss",
    "temperature_softmax_loss",
]
