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


class TokenSets(NamedTuple):
    """One set of token ids per row, as padded lists (kept small: a source's distinct tokens)."""

    ids: Tensor
    """long ``(..., S)``; padding entries hold the padding token, which fairseq never generates."""
    offset: Tensor
    """float ``(..., S)``: 0 on members, -inf on padding (added to scores gathered at ``ids``)."""


class Support(NamedTuple):
    """The tokens a masked decoder may choose from at one step, per row."""

    ids: Tensor
    offset: Tensor | None
    """as in ``TokenSets``; ``None`` when every entry is a kept token (a plain top-k)."""
    log_mass: Tensor
    """``(..., 1)``: log of the model probability of the kept tokens (0 where it is zero)."""


def support(model_lprobs: Tensor, k: int = 0, allowed: TokenSets | None = None) -> Support | None:
    """The ``k`` most probable tokens among ``allowed`` (``k=0``: all of them); ``None`` when
    nothing is masked (no ``allowed`` sets and ``k`` is 0 or at least the vocabulary size).

    Works on ``k`` or ``S`` entries per row, never on the whole vocabulary beyond one ``topk``.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0 (0 = no top-k mask), got {k}")
    if allowed is None:
        if not 0 < k < model_lprobs.size(-1):
            return None
        values, ids = model_lprobs.topk(k, dim=-1)
        offset = None
    else:
        shape = model_lprobs.shape[:-1] + allowed.ids.shape[-1:]
        ids, offset = allowed.ids.expand(shape), allowed.offset.expand(shape)
        values = model_lprobs.gather(-1, ids) + offset
        if 0 < k < ids.size(-1):
            values, positions = values.topk(k, dim=-1)
            ids, offset = ids.gather(-1, positions), offset.gather(-1, positions)
    log_mass = values.logsumexp(dim=-1, keepdim=True)
    return Support(ids, offset, log_mass.nan_to_num(neginf=0.0))


def kept_scores(lprobs: Tensor, kept: Support) -> Tensor:
    """``(..., S)``: the renormalised scores ``lprobs - log p(S)`` of the kept tokens (``-inf`` on padding)."""
    scores = lprobs.gather(-1, kept.ids) - kept.log_mass
    return scores if kept.offset is None else scores + kept.offset


def restrict(lprobs: Tensor, kept: Support, allowed: TokenSets | None = None, fill: float = -math.inf) -> Tensor:
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
    scores = kept_scores(lprobs, kept)
    if fill == -math.inf:
        out = torch.full_like(lprobs, -math.inf)
    else:
        out = lprobs.masked_fill(lprobs > -math.inf, fill)  # fill where the generator allows, -inf where not
    out.scatter_(-1, kept.ids, scores)
    stuck = (scores == -math.inf).all(dim=-1)
    if stuck.any():
        rows = lprobs[stuck]
        rescue = rows > -math.inf
        if allowed is not None:
            shape = kept.ids.shape[:-1] + allowed.ids.shape[-1:]
            ids, member = allowed.ids.expand(shape)[stuck], allowed.offset.expand(shape)[stuck] == 0
            in_set = torch.zeros_like(rescue).scatter_(-1, ids, member) & rescue
            rescue = torch.where(in_set.any(dim=-1, keepdim=True), in_set, rescue)
        out[stuck] = torch.where(rescue, rows - kept.log_mass[stuck], out[stuck])
    return out


def source_vocab(
    src_tokens: Tensor,
    vocab_size: int,
    pad: int,
    always_allowed: list[int] | tuple[int, ...] = (),
    src_to_tgt: Tensor | None = None,
) -> TokenSets:
    """The distinct target tokens of each source sentence ``(batch, src_len)``, plus ``always_allowed``
    (at least EOS, which the caller passes); never padding.

    ``src_to_tgt`` maps source-dictionary ids to target ids (``pad`` for a source symbol the
    target dictionary lacks); without it the dictionaries are taken to be the same.
    """
    ids = src_tokens if src_to_tgt is None else src_to_tgt[src_tokens]
    member = torch.zeros(src_tokens.size(0), vocab_size, dtype=torch.bool, device=src_tokens.device)
    member.scatter_(1, ids, True)
    member[:, pad] = False
    member[:, list(always_allowed)] = True
    counts = member.sum(dim=1)
    valid = torch.arange(int(counts.max()), device=member.device) < counts.unsqueeze(1)
    sets = torch.full(valid.shape, pad, dtype=torch.long, device=member.device)
    sets[valid] = member.nonzero()[:, 1]  # both row-major: each row's ids, ascending
    offset = torch.zeros(valid.shape, device=member.device).masked_fill_(~valid, -math.inf)
    return TokenSets(sets, offset)
