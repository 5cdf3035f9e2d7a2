"""Masked decoding: the next-token distribution restricted to a support set and renormalised.

Sparse-softmax decodes by keeping only the ``k`` most probable next tokens and renormalising
over them (Sun et al. 2021: beam 5 ⇒ top 5), optionally after restricting the vocabulary to the
tokens of the source sentence. For a step with model log-probabilities ``log p`` and support
``S`` (the top ``k`` among the allowed tokens; all allowed tokens when ``k`` is 0), a kept token
``y`` scores ``log p(y) - log p(S)``. The shift ``log p(S)`` differs between hypotheses, so the
renormalisation re-ranks the beam; it is not a monotone no-op.

Two stages, because fairseq's generator edits the scores between the model and the beam step
(``--min-len``, ``--max-len-a/b``, ``--prefix-size``, ``--no-repeat-ngram-size``, ``--unkpen``,
padding):

1. ``support`` reads the model's own log-probabilities (after ``--temperature``, before those
   edits) and returns the kept tokens with their probability mass.
2. ``restrict`` takes the edited scores the beam step receives and renormalises them over the
   support. The generator's edits therefore act on the masked distribution exactly as they act
   on the model's distribution in plain beam search, and a support of the whole vocabulary
   leaves the scores untouched (``k ≥ V`` is plain beam search, bit for bit).

Plain PyTorch; shapes are ``(..., V)`` with ``allowed`` broadcastable to them.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor


class Support(NamedTuple):
    keep: Tensor
    """bool ``(..., V)``: the tokens a masked decoder may choose from."""
    log_mass: Tensor
    """``(..., 1)``: log of the model probability of the kept tokens (0 where it is zero)."""


def support(model_lprobs: Tensor, k: int = 0, allowed: Tensor | None = None) -> Support | None:
    """The ``k`` most probable tokens among ``allowed`` (``k=0``: all of them); ``None`` when
    nothing is masked (no ``allowed`` mask and ``k`` is 0 or at least the vocabulary size)."""
    if k < 0:
        raise ValueError(f"k must be >= 0 (0 = no top-k mask), got {k}")
    vocab = model_lprobs.size(-1)
    top_k = 0 < k < vocab
    if allowed is None and not top_k:
        return None
    scores = model_lprobs if allowed is None else model_lprobs.masked_fill(~allowed, -math.inf)
    if top_k:
        values, indices = scores.topk(k, dim=-1)
        keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, indices, True)
        if allowed is not None:  # fewer than k allowed tokens: topk also returned disallowed ones
            keep &= allowed
    else:
        values, keep = scores, allowed.expand_as(scores)
    log_mass = values.logsumexp(dim=-1, keepdim=True)
    return Support(keep, log_mass.masked_fill(log_mass == -math.inf, 0.0))


def restrict(lprobs: Tensor, kept: Support, allowed: Tensor | None = None, fill: float = -math.inf) -> Tensor:
    """Beam-step scores: ``lprobs - log p(S)`` on the support, ``fill`` on the other tokens.

    ``lprobs`` are the scores after the generator's edits; a token it set to ``-inf`` stays
    ``-inf`` whatever ``fill`` is. ``fill=-inf`` means masked tokens are never generated; a large
    negative finite ``fill`` lets the beam fall back on them when fewer than ``2 × beam``
    candidates are kept, instead of carrying dead (``-inf``) hypotheses.

    A row whose kept tokens were all forbidden by the generator (EOS forced at the maximum
    length, a ``--prefix-size`` token, ``--min-len`` blocking a lone kept EOS, n-gram blocking)
    would have no finite candidate. The generator's constraint wins there: the row is
    renormalised over the allowed tokens the generator left, or, if none (a prefix token outside
    the source, an empty source under ``--min-len``), over every token it left.
    """
    finite = lprobs > -math.inf
    usable = kept.keep & finite
    stuck = ~usable.any(dim=-1)
    if stuck.any():
        rescue = finite[stuck]
        if allowed is not None:
            rescue_allowed = rescue & allowed.expand_as(finite)[stuck]
            rescue = torch.where(rescue_allowed.any(dim=-1, keepdim=True), rescue_allowed, rescue)
        usable[stuck] = rescue
    masked = lprobs.masked_fill(finite, fill)  # fill where the generator allows, -inf where not
    return torch.where(usable, lprobs - kept.log_mass, masked)


def source_vocab_mask(
    src_tokens: Tensor,
    vocab_size: int,
    pad: int,
    always_allowed: list[int] | tuple[int, ...] = (),
    src_to_tgt: Tensor | None = None,
) -> Tensor:
    """bool ``(batch, vocab_size)``: the target tokens that occur in each source sentence.

    ``src_to_tgt`` maps source-dictionary ids to target ids (``pad`` for a source symbol the
    target dictionary lacks); without it the dictionaries are taken to be the same.
    ``always_allowed`` (at least EOS, which the caller passes) is allowed in every row; padding
    never is.
    """
    ids = src_tokens if src_to_tgt is None else src_to_tgt[src_tokens]
    allowed = torch.zeros(src_tokens.size(0), vocab_size, dtype=torch.bool, device=src_tokens.device)
    allowed.scatter_(1, ids, True)
    allowed[:, pad] = False
    allowed[:, list(always_allowed)] = True
    return allowed
