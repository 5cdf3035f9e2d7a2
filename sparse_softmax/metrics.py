"""Classification metrics computed from summable counts, so a whole split is scored exactly however
fairseq batches it and however many workers it runs on (averaging per-batch F1s would not be).

Plain PyTorch/Python, no fairseq. Per class the counts are true positives, false positives and false
negatives; accuracy, micro-F1 and macro-F1 follow from their sums. For token classification the
counts are entities (conlleval's chunk rules, which read IOB1 and IOB2/BIO alike).
"""
from __future__ import annotations

import torch
from torch import Tensor


def mark(indices: Tensor, num_classes: int) -> Tensor:
    """``(N, k)`` class indices → ``(N, num_classes)`` bool, True at those classes."""
    return torch.zeros(indices.size(0), num_classes, dtype=torch.bool, device=indices.device).scatter_(1, indices, True)


def predict_single_label(logits: Tensor) -> Tensor:
    """``(N, C)`` scores → ``(N, C)`` one-hot of the arg-max."""
    return mark(logits.argmax(dim=1, keepdim=True), logits.size(1))


def predict_multi_label(logits: Tensor, top_n: int = 0) -> Tensor:
    """``(N, C)`` scores → multi-hot: the classes scored > 0 (Su's loss), or the ``top_n`` best."""
    if top_n <= 0:
        return logits > 0
    return mark(logits.topk(min(top_n, logits.size(1)), dim=1).indices, logits.size(1))


def class_counts(pred: Tensor, gold: Tensor) -> Tensor:
    """``(3, C)`` int64: true positives, false positives, false negatives per class, from bool ``(N, C)``."""
    return torch.stack([(pred & gold).sum(0), (pred & ~gold).sum(0), (~pred & gold).sum(0)])


def f1_scores(counts: Tensor) -> tuple[float, float]:
    """(micro-F1, macro-F1) in [0, 1] from ``class_counts`` summed over a split.

    Macro-F1 averages over the classes that occur in the gold labels or the predictions (a class in
    neither has no defined F1), as scikit-learn does for single-label data.
    """
    tp, fp, fn = counts.double()
    seen = (tp + fp + fn) > 0
    if not bool(seen.any()):
        return 0.0, 0.0
    micro = 2 * tp.sum() / (2 * tp.sum() + fp.sum() + fn.sum())
    macro = (2 * tp[seen] / (2 * tp[seen] + fp[seen] + fn[seen])).mean()
    return float(micro), float(macro)


def out_of_scope_scores(counts: Tensor, out_of_scope: int) -> tuple[float, float]:
    """(in-scope accuracy, out-of-scope recall) in [0, 1] from single-label ``class_counts`` summed over a split:
    the two numbers CLINC150 is read by (Larson et al. 2019), which plain accuracy mixes in proportion to the
    split's share of out-of-scope examples (3 % of CLINC150's validation split, 18 % of its test split).

    In-scope accuracy is over the examples whose gold class is not ``out_of_scope`` (predicting it for one of
    them is a miss); recall is over those whose gold class is. A split without such examples scores 0."""
    tp, _, fn = counts.double()
    gold = tp + fn  # single-label: each example is a true positive or a false negative of its gold class
    in_scope, oos = gold.sum() - gold[out_of_scope], gold[out_of_scope]
    hits = tp.sum() - tp[out_of_scope]
    return (float(hits / in_scope) if in_scope else 0.0, float(tp[out_of_scope] / oos) if oos else 0.0)


def entities(tags: list[str]) -> set[tuple[int, int, str]]:
    """The ``(start, end, type)`` chunks of a tag sequence (end exclusive), by conlleval's rules:
    a chunk starts at ``B-X``, or at ``I-X`` after ``O`` or another type, and ends where the next
    token does not continue it. Anything that is not ``B-``/``I-`` prefixed is outside (``O``)."""
    chunks, start, kind = set(), None, None
    for i, tag in enumerate(tags + ["O"]):
        prefix, _, this = tag.partition("-") if tag[:2] in ("B-", "I-") else ("O", "", None)
        if start is not None and (prefix != "I" or this != kind):
            chunks.add((start, i, kind))
            start = None
        if prefix == "B" or (prefix == "I" and start is None):
            start, kind = i, this
    return chunks


def entity_counts(predicted: list[list[str]], gold: list[list[str]]) -> Tensor:
    """``(3,)`` int64: correct, predicted and gold entities over sentences of tags."""
    correct = found = expected = 0
    for pred_tags, gold_tags in zip(predicted, gold, strict=True):
        pred_chunks, gold_chunks = entities(pred_tags), entities(gold_tags)
        correct += len(pred_chunks & gold_chunks)
        found += len(pred_chunks)
        expected += len(gold_chunks)
    return torch.tensor([correct, found, expected])


def entity_f1(counts: Tensor) -> float:
    """Entity-level F1 in [0, 1] from summed ``entity_counts`` (conlleval's FB1 / 100)."""
    correct, found, expected = (float(c) for c in counts)
    return 2 * correct / (found + expected) if found + expected else 0.0
