"""The papers' decoding for Hugging Face ``generate()``: ``LogitsProcessor``s over ``sparse_softmax.decoding``.

- ``TopKRenormalise(k)``: keep the k most probable next tokens and renormalise over them (Sun et al.: beam 5
  decodes with the top 5). The shift differs between hypotheses, so in beam search it re-ranks the beam; the
  processor must see log-probabilities, which beam search gives its processors (greedy search and sampling give
  logits, where only the ranking or the softmax of the result matters, and both come out right).
- ``SourceVocabularyMask(source_ids, pad_token_id, always_allowed=[eos])``: only tokens of each row's source (and
  ``always_allowed``), renormalised over them, for summarisation and question generation where the output copies
  the input.

Both together (mask first) keep the top k of the source's tokens, as the fairseq search does: renormalising over a
subset of a renormalised distribution is renormalising over that subset. The fairseq search chooses the kept
tokens on the model's own probabilities, before ``--min-len`` or n-gram blocking edit them; ``generate()`` applies
its own processors (``min_new_tokens``, ``no_repeat_ngram_size``, ...) before those passed in
``logits_processor=``, so with such options the kept tokens are chosen after the edits. Without them the beams
are the fairseq search's (``tests/test_hf_adapters.py`` checks it on the same scores).
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor
from transformers import LogitsProcessor

from ..decoding import TokenSets, restrict, source_vocab, support


class TopKRenormalise(LogitsProcessor):
    def __init__(self, k: int):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k = k

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        kept = support(scores, self.k)
        return scores if kept is None else restrict(scores, kept)


class SourceVocabularyMask(LogitsProcessor):
    """``source_ids`` ``(batch, src_len)``: the token ids ``generate()`` was given (an encoder-decoder's input, a
    decoder-only model's prompt); ``pad_token_id`` and ``never_allowed`` (e.g. a BOS the source starts with) are
    not taken from it. The decoder must share the source's vocabulary."""

    def __init__(self, source_ids: Tensor, pad_token_id: int, always_allowed: Iterable[int] = (),
                 never_allowed: Iterable[int] = ()):
        source = source_ids.clone()
        never = torch.tensor(sorted(set(never_allowed)), dtype=torch.long, device=source.device)
        source[torch.isin(source, never)] = pad_token_id
        self.source, self.pad, self.always = source, pad_token_id, sorted(set(always_allowed))
        self._allowed: TokenSets | None = None  # per source row, made at the first step (it needs V)

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if self._allowed is None:
            self._allowed = source_vocab(self.source.to(scores.device), scores.size(-1), self.pad, self.always)
        rows, sources = scores.size(0), self.source.size(0)
        if rows % sources:
            raise ValueError(f"{rows} rows of scores for {sources} sources: give the processor the batch generate() "
                             "was given")
        per_source = rows // sources  # beams (and returned sequences) of one source are adjacent rows
        allowed = TokenSets(*(t.repeat_interleave(per_source, dim=0) for t in self._allowed))
        return restrict(scores, support(scores, 0, allowed), allowed)
