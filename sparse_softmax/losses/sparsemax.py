"""Sparsemax and 1.5-entmax losses (Fenchel-Young losses, Peters et al. 2019) via the entmax package."""
from __future__ import annotations

import entmax
from torch import Tensor

from ._common import compute_dtype, prepare_rows, reduce_rows


def _fenchel_young(fn, logits: Tensor, target: Tensor, ignore_index: int | None, reduction: str) -> Tensor:
    rows = prepare_rows(logits, target, ignore_index, reduction)
    return reduce_rows(fn(logits.to(compute_dtype(logits)), rows.target), rows.valid, reduction)


def sparsemax_loss(logits: Tensor, target: Tensor, ignore_index: int | None = None, reduction: str = "sum") -> Tensor:
    """Sparsemax loss: the Fenchel-Young loss whose prediction map is sparsemax (α = 2)."""
    return _fenchel_young(entmax.sparsemax_loss, logits, target, ignore_index, reduction)


def entmax15_loss(logits: Tensor, target: Tensor, ignore_index: int | None = None, reduction: str = "sum") -> Tensor:
    """1.5-entmax loss: the Fenchel-Young loss whose prediction map is entmax with α = 1.5."""
    return _fenchel_young(entmax.entmax15_loss, logits, target, ignore_index, reduction)
