"""A fairseq encoder-decoder whose next-token probabilities are written by the test.

Like fairseq's own ``tests/test_sequence_generator.py``: the test states the distribution the
decoder emits after every prefix, so the hypotheses and scores a search must produce can be
worked out by hand. Tokens are the symbols of a small dictionary.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from fairseq.data import Dictionary
from fairseq.models import FairseqDecoder, FairseqEncoder, FairseqEncoderDecoderModel

SYMBOLS = ("a", "b", "c", "d", "e", "f")
# script(source symbols, prefix symbols) -> {symbol: probability}; unlisted symbols get probability 0
Script = Callable[[tuple[str, ...], tuple[str, ...]], dict[str, float]]


def dictionary() -> Dictionary:
    d = Dictionary()  # <s>=0 <pad>=1 </s>=2 <unk>=3
    for s in SYMBOLS:
        d.add_symbol(s)
    return d


class _Encoder(FairseqEncoder):
    def forward(self, src_tokens, src_lengths=None, **kwargs):
        return {"src_tokens": [src_tokens]}

    def reorder_encoder_out(self, encoder_out, new_order):
        return {"src_tokens": [encoder_out["src_tokens"][0].index_select(0, new_order)]}


class _Decoder(FairseqDecoder):
    def __init__(self, d: Dictionary, script: Script):
        super().__init__(d)
        self.script = script

    def _symbols(self, tokens) -> tuple[str, ...]:
        special = {self.dictionary.pad(), self.dictionary.eos(), self.dictionary.bos()}
        return tuple(self.dictionary[t] for t in tokens.tolist() if t not in special)

    def forward(self, prev_output_tokens, encoder_out=None, **kwargs):
        src = encoder_out["src_tokens"][0]
        bsz, length = prev_output_tokens.shape
        logits = torch.full((bsz, length, len(self.dictionary)), -math.inf, device=prev_output_tokens.device)
        for row in range(bsz):
            probs = self.script(self._symbols(src[row]), self._symbols(prev_output_tokens[row, 1:]))
            assert abs(sum(probs.values()) - 1) < 1e-9, probs
            for symbol, p in probs.items():
                logits[row, -1, self.dictionary.index(symbol)] = math.log(p) if p > 0 else -math.inf
        return logits, None


def model(d: Dictionary, script: Script) -> FairseqEncoderDecoderModel:
    return FairseqEncoderDecoderModel(_Encoder(d), _Decoder(d, script)).eval()


def sample(d: Dictionary, sources: list[str]) -> dict:
    """A batch in fairseq's layout (left-padded sources ending in EOS)."""
    rows = [[d.index(s) for s in src.split()] + [d.eos()] for src in sources]
    width = max(map(len, rows))
    src_tokens = torch.tensor([[d.pad()] * (width - len(r)) + r for r in rows])
    return {
        "id": torch.arange(len(rows)),
        "net_input": {"src_tokens": src_tokens, "src_lengths": torch.tensor([len(r) for r in rows])},
    }
