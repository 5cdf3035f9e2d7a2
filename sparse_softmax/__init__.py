"""Sparse-softmax (Sun et al. 2021), AS-Softmax (Lv et al.) and the other softmax alternatives, in plain PyTorch.

The core needs neither fairseq nor Hugging Face: the losses (``losses``: each takes logits and targets;
``fused_output_loss`` takes the output layer's features and weight instead of the logits), the decoding masks
of the papers' top-k renormalised beam search (``decoding``), the training schedules (``schedules``: the
warm-ups, AS's δ annealing, AS-Speed's step rule), the classification metrics (``metrics``), the papers'
text scorers (``scoring``: BLEU, ROUGE, the PTB tokenizer) and what tells whether a Sparse-softmax run is
collapsing (``diagnostics``). Importing it imports nothing else and patches
nothing. Two front doors use it: ``user_dir``, the fairseq plugin, and ``sparse_softmax.hf``, the Hugging Face
adapters.

The names below are loaded on first use, so the scorers and the data prep, which import
``sparse_softmax.scoring`` and ``sparse_softmax.userinput``, start without importing torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "decoding": ["Support", "TokenSets", "kept_scores", "restrict", "source_vocab", "support"],
    "losses": ["LossResult", "am_softmax_loss", "as_multilabel_loss", "as_multilabel_masks", "as_softmax",
               "as_softmax_loss", "entmax15_loss", "fused_output_loss", "multilabel_categorical_crossentropy",
               "sm_taylor_softmax_loss", "soft_margin_softmax_loss", "softmax_loss", "sparse_softmax_loss",
               "sparsemax_loss", "taylor_expansion", "taylor_softmax_loss", "temperature_softmax_loss"],
    "schedules": ["as_delta", "in_warmup", "next_accumulation"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)

if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from .decoding import Support, TokenSets, kept_scores, restrict, source_vocab, support  # noqa: F401
    from .losses import *  # noqa: F401,F403
    from .schedules import as_delta, in_warmup, next_accumulation  # noqa: F401


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
