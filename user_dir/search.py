"""Masked beam search: fairseq's beam step over the top-k / source-vocabulary masked distribution.

``MaskedBeamSearch`` is a ``fairseq.search.BeamSearch`` whose ``step`` renormalises the scores
over a support set (``user_dir.masked_decoding``) before the usual beam step.
``install`` puts it into a ``SequenceGenerator`` and lets it see the model's own log-probabilities
at every step: the generator edits the scores (length limits, prefix, n-gram blocking, unknown
penalty) before calling ``step``, and the support has to be chosen on the model's distribution,
not on the edited one, for those options to compose with the mask (see ``masked_decoding``).
"""
import math
from typing import Optional

import torch
from fairseq.search import BeamSearch
from torch import Tensor

from .masked_decoding import Support, TokenSets, restrict, support


class MaskedBeamSearch(BeamSearch):
    """Beam search over the model's next-token distribution restricted to its ``topk`` most
    probable tokens (0: no top-k mask) among the allowed ones (the source-vocabulary mask set per
    batch with ``set_allowed``), renormalised; masked tokens score ``fill``."""

    def __init__(self, tgt_dict, topk: int = 0, fill: float = -math.inf, source_vocab_mask: bool = False):
        super().__init__(tgt_dict)
        self.topk = topk
        self.fill = fill
        self.source_vocab_mask = source_vocab_mask
        self._next_allowed: Optional[TokenSets] = None
        self._allowed: Optional[TokenSets] = None  # one set per sentence of the batch
        self._sentences: Optional[Tensor] = None  # batch rows of the sentences still being decoded
        self._beam_size = 1
        self._support: Optional[Support] = None

    def set_allowed(self, allowed: TokenSets) -> None:
        """The allowed tokens (one set per sentence) of the batch about to be generated."""
        self._next_allowed = allowed

    def init_constraints(self, batch_constraints: Optional[Tensor], beam_size: int):
        """Called by the generator at the start of every batch: take that batch's mask."""
        super().init_constraints(batch_constraints, beam_size)
        self._beam_size = beam_size
        self._allowed, self._next_allowed = self._next_allowed, None
        if self.source_vocab_mask and self._allowed is None:
            raise RuntimeError(
                "--source-vocab-mask: no source mask was set for this batch; generate through the "
                "task's inference_step (fairseq-generate / fairseq-interactive do)"
            )
        self._sentences = (
            None if self._allowed is None else torch.arange(len(self._allowed.ids), device=self._allowed.ids.device)
        )
        self._support = None

    def prune_sentences(self, batch_idxs: Tensor):
        """Called by the generator when finished sentences leave the batch."""
        super().prune_sentences(batch_idxs)
        if self._sentences is not None:
            self._sentences = self._sentences[batch_idxs]

    def _allowed_rows(self) -> Optional[TokenSets]:
        """Sets of the sentences still decoded, shaped (sentences, 1, S) to broadcast over beams."""
        if self._allowed is None:
            return None
        return TokenSets(*(t[self._sentences].unsqueeze(1) for t in self._allowed))

    def observe(self, model_lprobs: Tensor) -> None:
        """Choose the support from the model's log-probabilities ``(sentences × beam, V)``."""
        vocab = model_lprobs.size(-1)
        self._support = support(model_lprobs.view(-1, self._beam_size, vocab), self.topk, self._allowed_rows())

    def step(
        self,
        step: int,
        lprobs,
        scores: Optional[Tensor],
        prev_output_tokens: Optional[Tensor] = None,
        original_batch_idxs: Optional[Tensor] = None,
        candidate_multiple: int = 2,
    ):
        if self._support is not None:
            lprobs = restrict(lprobs, self._support, self._allowed_rows(), self.fill)
            self._support = None  # one support per decoder call: never reuse a stale one
        return super().step(step, lprobs, scores, prev_output_tokens, original_batch_idxs, candidate_multiple)


def install(generator, search: MaskedBeamSearch):
    """Make ``generator`` (a fairseq ``SequenceGenerator``) decode with ``search``.

    Replaces its search strategy and wraps its ensemble's ``forward_decoder`` so that ``search``
    sees each step's model log-probabilities before the generator edits them in place.
    """
    generator.search = search
    forward_decoder = generator.model.forward_decoder

    def observed_forward_decoder(*args, **kwargs):
        lprobs, attn = forward_decoder(*args, **kwargs)
        search.observe(lprobs)
        return lprobs, attn

    generator.model.forward_decoder = observed_forward_decoder
    return generator
