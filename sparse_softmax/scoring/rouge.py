"""ROUGE: rouge-score's ROUGE-1/2/L for summaries, coco's ROUGE-L (β = 1.2) for questions, and the
Gigaword post-processing UniLM applies before scoring.

rouge-score with ``use_stemmer=True`` matches ROUGE-1.5.5 run with ``-m`` (Porter stemming), which is
how the Gigaword numbers in UniLM and the Sparse-softmax paper were produced. Its tokenizer lower-cases
and replaces every non-alphanumeric character by a space, so ``--lowercase`` and ``<unk>`` → ``UNK``
do not change its numbers (``<unk>`` and ``UNK`` both become ``unk``) while ``--digits-to-hash`` does
(``#`` is dropped, digits are not).
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np

# rougeLsum is left out: it splits a summary into sentences at newlines, and ours are one line each,
# so it would always equal rougeL.
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
COCO_BETA = 1.2
_DIGIT = re.compile(r"\d")


def postprocess(text: str, *, lowercase: bool = False, map_unk: bool = False,
                digits_to_hash: bool = False) -> str:
    """UniLM's Gigaword clean-up: lower-case, ``<unk>`` → ``UNK`` (the references' spelling), digits → ``#``."""
    if lowercase:
        text = text.lower()
    if map_unk:
        text = text.replace("<unk>", "UNK")
    if digits_to_hash:
        text = _DIGIT.sub("#", text)
    return text


class _CachedStemmer:
    """Porter stemming memoised per word: rouge-score stems every token of every summary again, and
    stemming is most of its run time; a corpus has few distinct words."""

    def __init__(self) -> None:
        from nltk.stem import porter

        self.stem = lru_cache(maxsize=None)(porter.PorterStemmer().stem)


def rouge_scorer(rouge_types: Sequence[str], use_stemmer: bool = True):
    """A rouge-score ``RougeScorer`` that gives the same numbers as ``RougeScorer(types, use_stemmer)``."""
    from rouge_score import rouge_scorer as rs
    from rouge_score import tokenize, tokenizers

    if not use_stemmer:
        return rs.RougeScorer(list(rouge_types), use_stemmer=False)

    class StemmingTokenizer(tokenizers.Tokenizer):
        stemmer = _CachedStemmer()

        def tokenize(self, text: str) -> list[str]:
            return tokenize.tokenize(text, self.stemmer)

    return rs.RougeScorer(list(rouge_types), tokenizer=StemmingTokenizer())


def rouge_scores(hypotheses: Sequence[str], references: Sequence[str], rouge_types: Sequence[str],
                 use_stemmer: bool = True, progress: Iterable | None = None) -> np.ndarray:
    """Per-example (precision, recall, F1) of each ROUGE type: an array (examples, types, 3) in [0, 1]."""
    scorer = rouge_scorer(rouge_types, use_stemmer)
    pairs = zip(hypotheses, references) if progress is None else progress
    out = np.empty((len(hypotheses), len(rouge_types), 3))
    for i, (hyp, ref) in enumerate(pairs):
        scores = scorer.score(ref, hyp)  # rouge-score takes (target, prediction)
        out[i] = [tuple(scores[t]) for t in rouge_types]
    return out


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence, bit-parallel over ``b`` (Allison–Dix / Hyyrö 2004).

    ``row`` is one row of the LCS table in difference form, one bit per token of ``b``: a 0 bit marks a
    column where the LCS length steps up, so the number of 0 bits is the LCS length. Each token of ``a``
    updates the whole row with one addition, instead of ``len(b)`` table cells.
    """
    matches: dict[str, int] = {}
    for j, token in enumerate(b):
        matches[token] = matches.get(token, 0) | (1 << j)
    full = (1 << len(b)) - 1
    row = full
    for token in a:
        hit = row & matches.get(token, 0)
        row = ((row + hit) | (row - hit)) & full
    return len(b) - row.bit_count()


def coco_rouge_l(hypothesis: str, references: Sequence[str], beta: float = COCO_BETA) -> float:
    """coco's ROUGE-L: F_β of the best precision and the best recall over the references (not of one pair).

    Tokens are whitespace-separated, like our BLEU; coco splits on single spaces, which differs only
    for text with repeated, leading or trailing spaces.
    """
    hyp = hypothesis.split()
    if not hyp:
        return 0.0
    precision = recall = 0.0
    for reference in references:
        ref = reference.split()
        lcs = lcs_length(hyp, ref)
        precision = max(precision, lcs / len(hyp))
        recall = max(recall, lcs / len(ref) if ref else 0.0)
    if precision == 0 or recall == 0:
        return 0.0
    return (1 + beta**2) * precision * recall / (recall + beta**2 * precision)
