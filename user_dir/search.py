"""Masked beam search: fairseq's beam step over the top-k / source-vocabulary masked distribution.

``MaskedBeamSearch`` is a ``fairseq.search.BeamSearch`` whose ``step`` renormalises the scores
over a support set (``sparse_softmax.decoding``) and draws the beam's candidates from it.
``install`` puts it into a ``SequenceGenerator`` and lets it see the model's own log-probabilities
at every step: the generator edits the scores (length limits, prefix, n-gram blocking, unknown
penalty) before calling ``step``, and the support has to be chosen on the model's distribution,
not on the edited one, for those options to compose with the mask (see ``sparse_softmax.decoding``).
"""
import math
from typing import Optional

import torch
from fairseq.search import BeamSearch
from torch import Tensor

from sparse_softmax.decoding import Support, TokenSets, kept_scores, restrict, support


class MaskedBeamSearch(BeamSearch):
    """Beam search over the model's next-token distribution restricted to its ``topk`` most
    probable tokens (0: no top-k mask) among the allowed ones (the source-vocabulary mask set per
    batch with ``set_allowed``), renormalised; masked tokens score ``fill``."""

    def __init__(self, tgt_dict, topk: int = 0, fill: float = -math.inf, source_vocab_mask: bool = False):
        super().__init__(tgt_dict)
        # A one-token support (k=1, or a source giving only EOS) can leave a sentence with no live
        # hypothesis before it has `beam` finished ones; fairseq then asserts at the maximum
        # length unless the search says to stop there (as its prefix-constrained search does).
        self.stop_on_max_len = True
        self.topk = topk
        self.fill = fill
        self.source_vocab_mask = source_vocab_mask
        self._next_allowed: Optional[TokenSets] = None
        self._allowed: Optional[TokenSets] = None  # sets of the sentences still decoded, (sentences, 1, S)
        self._beam_size = 1
        self._support: Optional[Support] = None

    def set_allowed(self, allowed: TokenSets) -> None:
        """The allowed tokens (one set per sentence) of the batch about to be generated."""
        self._next_allowed = allowed

    def init_constraints(self, batch_constraints: Optional[Tensor], beam_size: int):
        """Called by the generator at the start of every batch: take that batch's mask."""
        super().init_constraints(batch_constraints, beam_size)
        self._beam_size = beam_size
        allowed, self._next_allowed = self._next_allowed, None
        if self.source_vocab_mask and allowed is None:
            raise RuntimeError(
                "--source-vocab-mask: no source mask was set for this batch; generate through the "
                "task's inference_step (fairseq-generate / fairseq-interactive do)"
            )
        # shaped to broadcast over each sentence's beams
        self._allowed = None if allowed is None else TokenSets(*(t.unsqueeze(1) for t in allowed))
        self._support = None

    def prune_sentences(self, batch_idxs: Tensor):
        """Called by the generator when finished sentences leave the batch."""
        super().prune_sentences(batch_idxs)
        if self._allowed is not None:
            self._allowed = TokenSets(*(t[batch_idxs] for t in self._allowed))

    def observe(self, model_lprobs: Tensor) -> None:
        """Choose the support from the model's log-probabilities ``(sentences × beam, V)``."""
        vocab = model_lprobs.size(-1)
        self._support = support(model_lprobs.view(-1, self._beam_size, vocab), self.topk, self._allowed)

    def step(
        self,
        step: int,
        lprobs,
        scores: Optional[Tensor],
        prev_output_tokens: Optional[Tensor] = None,
        original_batch_idxs: Optional[Tensor] = None,
        candidate_multiple: int = 2,
    ):
        kept, self._support = self._support, None  # one support per decoder call: never reuse a stale one
        if kept is None:
            return super().step(step, lprobs, scores, prev_output_tokens, original_batch_idxs, candidate_multiple)
        if self.fill == -math.inf:
            candidates = kept_scores(lprobs, kept)
            if candidates.amax(dim=-1).min().item() > -math.inf:  # no hypothesis lost all its kept tokens
                return self._step_on_support(step, candidates, kept.ids, scores, candidate_multiple)
        lprobs = restrict(lprobs, kept, self._allowed, self.fill)
        return super().step(step, lprobs, scores, prev_output_tokens, original_batch_idxs, candidate_multiple)

    def _step_on_support(self, step: int, candidates: Tensor, ids: Tensor, scores: Optional[Tensor], multiple: int):
        """``BeamSearch.step`` when every token outside the support scores -inf: the best
        ``multiple × beam`` continuations are drawn from the ``S`` kept tokens of each hypothesis
        instead of the whole vocabulary (same candidates, a topk over beam·S instead of beam·V)."""
        bsz, beam_size, width = candidates.shape
        if step == 0:  # all hypotheses are the same at the first step: expand only the first
            candidates, ids = candidates[:, :1], ids[:, :1]
        else:
            candidates = candidates + scores[:, :, step - 1].unsqueeze(-1)
        wanted = multiple * beam_size
        top, positions = candidates.reshape(bsz, -1).topk(min(wanted, candidates[0].numel()), dim=1)
        tokens = ids.reshape(bsz, -1).gather(1, positions)
        beams = torch.div(positions, width, rounding_mode="trunc")
        if top.size(1) < wanted:  # fewer kept tokens than candidates: the rest are dead (-inf)
            missing = wanted - top.size(1)
            top = torch.cat([top, top.new_full((bsz, missing), -math.inf)], dim=1)
            tokens = torch.cat([tokens, tokens[:, :1].expand(bsz, missing)], dim=1)
            beams = torch.cat([beams, beams[:, :1].expand(bsz, missing)], dim=1)
        # dead candidates (padding of the support, or -inf) carry EOS, which a -inf score never finalises
        return top, tokens.masked_fill(top == -math.inf, self.eos), beams


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
