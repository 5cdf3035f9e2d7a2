"""Corpus BLEU-1..4 as the coco-caption / qgevalcap ``bleu_scorer.py`` computes it (QG papers' numbers).

What makes these numbers differ from sacrebleu's (and why we do not just call it):

* n-gram matches are clipped by the *maximum* count over an item's references and summed over the corpus;
  BLEU-n is the geometric mean of the corpus precisions 1..n (cumulative, uniform weights);
* no smoothing: a zero count stays (almost) zero, only ``TINY`` and ``SMALL`` keep the division finite;
* the brevity penalty uses, per item, the reference length *closest* to the hypothesis length (ties go to
  the shorter reference), summed over the corpus;
* tokens are whitespace-separated and nothing is lower-cased.

Per-item scores apply the same formula to one item's counts, as coco's ``bleu_list`` does.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

MAX_N = 4
TINY = 1e-15  # coco adds this to matches and to the hypothesis length
SMALL = 1e-9  # and this to guesses and to the reference length


def ngram_counts(tokens: Sequence[str], max_n: int = MAX_N) -> Counter:
    """Counts of every n-gram (as a tuple) of length 1..max_n."""
    counts: Counter = Counter()
    for n in range(1, max_n + 1):
        counts.update(zip(*(tokens[i:] for i in range(n))))
    return counts


@dataclass
class BleuStats:
    """Sufficient statistics, one row per scored item: enough for corpus, per-item and bootstrap BLEU."""

    matches: np.ndarray  # (items, MAX_N) clipped n-gram matches
    guesses: np.ndarray  # (items, MAX_N) hypothesis n-grams
    hyp_len: np.ndarray  # (items,)
    ref_len: np.ndarray  # (items,) closest reference length

    def __len__(self) -> int:
        return len(self.hyp_len)


def item_stats(hypothesis: str, references: Sequence[str]) -> tuple[list[int], list[int], int, int]:
    """Clipped matches, guesses, hypothesis length and closest reference length for one item."""
    if not references:
        raise ValueError("an item needs at least one reference")
    hyp = hypothesis.split()
    max_ref_counts: Counter = Counter()
    ref_lens = []
    for reference in references:
        ref = reference.split()
        ref_lens.append(len(ref))
        max_ref_counts |= ngram_counts(ref)  # Counter union keeps the maximum count
    matches = [0] * MAX_N
    for gram, count in ngram_counts(hyp).items():
        matches[len(gram) - 1] += min(count, max_ref_counts[gram])
    guesses = [max(len(hyp) - n + 1, 0) for n in range(1, MAX_N + 1)]
    closest = min((abs(length - len(hyp)), length) for length in ref_lens)[1]
    return matches, guesses, len(hyp), closest


def collect_stats(hypotheses: Sequence[str], references: Sequence[Sequence[str]],
                  progress: Iterable | None = None) -> BleuStats:
    """Statistics for every item; ``references[i]`` is the list of references of ``hypotheses[i]``."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference lists")
    items = zip(hypotheses, references) if progress is None else progress
    rows = [item_stats(hyp, refs) for hyp, refs in items]
    return BleuStats(
        matches=np.array([r[0] for r in rows], dtype=np.int64).reshape(-1, MAX_N),
        guesses=np.array([r[1] for r in rows], dtype=np.int64).reshape(-1, MAX_N),
        hyp_len=np.array([r[2] for r in rows], dtype=np.int64),
        ref_len=np.array([r[3] for r in rows], dtype=np.int64),
    )


def bleu_from_totals(matches: np.ndarray, guesses: np.ndarray, hyp_len: np.ndarray,
                     ref_len: np.ndarray) -> np.ndarray:
    """BLEU-1..MAX_N from summed counts; works on a batch: ``matches`` (..., MAX_N), lengths (...)."""
    precisions = (matches + TINY) / (guesses + SMALL)
    log_cumulative = np.cumsum(np.log(precisions), axis=-1) / np.arange(1, MAX_N + 1)
    ratio = (hyp_len + TINY) / (ref_len + SMALL)
    log_bp = np.where(ratio < 1, 1 - 1 / ratio, 0.0)  # ratio > 0 always, thanks to TINY
    return np.exp(log_cumulative + log_bp[..., None])


def corpus_bleu(stats: BleuStats, weights: np.ndarray | None = None) -> np.ndarray:
    """Corpus BLEU-1..4 in [0, 1]; ``weights`` (items,) or (resamples, items) count each item that often."""
    if weights is None:
        weights = np.ones(len(stats), dtype=np.int64)
    return bleu_from_totals(weights @ stats.matches, weights @ stats.guesses,
                            weights @ stats.hyp_len, weights @ stats.ref_len)


def item_bleu(stats: BleuStats) -> np.ndarray:
    """Per-item BLEU-1..4 (items, 4), coco's sentence-level scores."""
    return bleu_from_totals(stats.matches, stats.guesses, stats.hyp_len, stats.ref_len)

