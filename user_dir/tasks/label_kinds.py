"""What ``--task text_classification`` does differently for single-label, multi-label and token-level data.

The three kinds differ in exactly five places: how many labels a line must hold, how a line becomes a
training target (a class index, a multi-hot vector, one class per input position), how a batch becomes the
rows a criterion scores, what the batch counts for the split's metrics, and which metrics those counts give.
The task picks one object for its data at start and asks it, instead of testing ``--token-level`` /
``--multi-label`` in each of those places.
"""
from __future__ import annotations

import numpy as np
import torch
from fairseq.data import data_utils
from fairseq.logging import metrics
from torch import Tensor

from sparse_softmax import metrics as scores

from ..options import UsageError

#: Target value of positions that are not scored (<s>, </s>, padding, --ignore-label pieces).
IGNORE = -100


def _log_class_f1() -> None:
    metrics.log_derived("micro_f1", lambda m: round(100 * scores.f1_scores(m["_class_counts"].sum)[0], 2))
    metrics.log_derived("macro_f1", lambda m: round(100 * scores.f1_scores(m["_class_counts"].sum)[1], 2))


def _accuracy(hits: float, m) -> float:
    return round(100 * hits / max(m["_rows"].sum, 1), 2)


class SingleLabel:
    """One class per example; scored by accuracy and micro/macro-F1 over the classes."""

    token_level = False
    #: the metric-count keys this kind logs (the task sums them over batches)
    count_keys = ("_class_counts",)
    expected = "exactly one label (multi-label data needs --multi-label)"
    #: label-dictionary symbols that are not classes: their positions are not trained or scored
    not_classes: frozenset[str] = frozenset()

    def __init__(self, out_of_scope: str = ""):
        #: the out-of-scope class's name (``--out-of-scope-label``), and its index once the classes are known
        self.out_of_scope, self.out_of_scope_index = out_of_scope, None

    def set_classes(self, class_names: list[str]) -> None:
        """Take the label dictionary's classes; raise UsageError when they cannot be this kind's."""
        if self.out_of_scope:
            if self.out_of_scope not in class_names:
                raise UsageError(f"--out-of-scope-label {self.out_of_scope}: not a class of the label dictionary "
                                 f"(its classes: {' '.join(class_names[:10])}{' ...' if len(class_names) > 10 else ''})")
            self.out_of_scope_index = class_names.index(self.out_of_scope)

    def bad_examples(self, label_counts: np.ndarray, input_counts: np.ndarray) -> np.ndarray:
        """Indices of the examples whose label line holds the wrong number of labels."""
        return np.flatnonzero(label_counts != 1)

    def target(self, classes: Tensor, num_classes: int) -> Tensor:
        return classes[0]

    def collate(self, targets: list[Tensor]) -> Tensor:
        return torch.stack(targets)

    def rows(self, logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor, int | None, Tensor]:
        """The batch as criterion rows: logits, targets, the ignored target value (or None) and the row count."""
        return logits, target, None, torch.tensor(target.size(0), device=target.device)

    def metric_counts(self, logits: Tensor, target: Tensor, class_names: list[str]) -> dict:
        """This batch's counts for the split's metrics, from the head's logits and the collated targets."""
        gold = scores.mark(target[:, None], len(class_names))
        return {"_class_counts": scores.class_counts(scores.predict_single_label(logits), gold)}

    def log_derived(self) -> None:
        _log_class_f1()
        metrics.log_derived("accuracy", lambda m: _accuracy(float(m["_class_counts"].sum[0].sum()), m))
        if self.out_of_scope_index is not None:
            for i, name in enumerate(("in_scope_accuracy", "out_of_scope_recall")):
                metrics.log_derived(name, lambda m, i=i: round(
                    100 * scores.out_of_scope_scores(m["_class_counts"].sum, self.out_of_scope_index)[i], 2))


class MultiLabel(SingleLabel):
    """A set of classes per example (space-separated on its line, possibly empty); scored by micro/macro-F1 of
    the predicted sets: classes scored > 0, or the ``predict_top_n`` best when it is set."""

    expected = ""

    def __init__(self, predict_top_n: int):
        super().__init__()
        self.predict_top_n = predict_top_n

    def bad_examples(self, label_counts: np.ndarray, input_counts: np.ndarray) -> np.ndarray:
        return np.array([], dtype=np.int64)

    def target(self, classes: Tensor, num_classes: int) -> Tensor:
        return torch.zeros(num_classes, dtype=torch.bool).index_fill_(0, classes, True)

    def metric_counts(self, logits: Tensor, target: Tensor, class_names: list[str]) -> dict:
        predicted = scores.predict_multi_label(logits, self.predict_top_n)
        return {"_class_counts": scores.class_counts(predicted, target)}

    def log_derived(self) -> None:
        _log_class_f1()


class TokenLabels:
    """One BIO tag per input token (``IGNORE`` at ``<s>``, ``</s>`` and the pieces labelled ``ignore_label``, a
    word's pieces after its first); every scored position is a criterion row; scored by entity F1 and token
    accuracy."""

    token_level = True
    count_keys = ("_entity_counts", "_token_hits")
    expected = "as many labels as input tokens"

    def __init__(self, ignore_label: str):
        self.ignore_label, self.not_classes = ignore_label, frozenset({ignore_label})

    def set_classes(self, class_names: list[str]) -> None:
        odd = [s for s in class_names if s != "O" and s[:2] not in ("B-", "I-")]
        if odd:
            raise UsageError(f"--token-level scores entities from BIO tags (B-X, I-X, O); the label dictionary "
                             f"also has {', '.join(odd[:5])} (is --ignore-label {self.ignore_label!r} right?)")

    def bad_examples(self, label_counts: np.ndarray, input_counts: np.ndarray) -> np.ndarray:
        return np.flatnonzero(label_counts != input_counts)

    def target(self, classes: Tensor, num_classes: int) -> Tensor:
        edge = classes.new_full((1,), IGNORE)
        return torch.cat([edge, classes, edge])

    def collate(self, targets: list[Tensor]) -> Tensor:
        return data_utils.collate_tokens(targets, pad_idx=IGNORE)

    def rows(self, logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor, int | None, Tensor]:
        target = target.reshape(-1)
        return logits.reshape(-1, logits.size(-1)), target, IGNORE, (target != IGNORE).sum()

    def metric_counts(self, logits: Tensor, target: Tensor, class_names: list[str]) -> dict:
        predicted = logits.argmax(dim=-1)
        predicted_tags, gold_tags = [], []
        for pred_row, gold_row in zip(predicted.tolist(), target.tolist()):
            kept = [(p, g) for p, g in zip(pred_row, gold_row) if g != IGNORE]
            predicted_tags.append([class_names[p] for p, _ in kept])
            gold_tags.append([class_names[g] for _, g in kept])
        counts = scores.entity_counts(predicted_tags, gold_tags).to(logits.device)
        return {"_entity_counts": counts, "_token_hits": (predicted == target).sum()}

    def log_derived(self) -> None:
        metrics.log_derived("entity_f1", lambda m: round(100 * scores.entity_f1(m["_entity_counts"].sum), 2))
        metrics.log_derived("accuracy", lambda m: _accuracy(float(m["_token_hits"].sum), m))


LabelKind = SingleLabel | TokenLabels
