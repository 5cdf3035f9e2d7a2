"""sparse_softmax.metrics against scikit-learn and against entity lists worked out by hand."""
from __future__ import annotations

import pytest
import torch
from sklearn.metrics import f1_score

from sparse_softmax import metrics


def _one_hot(indices: torch.Tensor, num_classes: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(indices, num_classes).bool()


@pytest.mark.parametrize("seed", range(5))
def test_single_label_f1_and_accuracy_match_sklearn_when_summed_over_batches(seed):
    g = torch.Generator().manual_seed(seed)
    classes = 7
    logits = torch.randn(90, classes, generator=g)
    gold = torch.randint(0, classes - 1, (90,), generator=g)  # class 6 never gold: may be predicted only
    counts = sum(metrics.class_counts(metrics.predict_single_label(part), _one_hot(y, classes))
                 for part, y in zip(logits.split(13), gold.split(13)))
    predicted = logits.argmax(1)
    micro, macro = metrics.f1_scores(counts)
    assert macro == pytest.approx(f1_score(gold, predicted, average="macro"), abs=1e-12)
    assert micro == pytest.approx(f1_score(gold, predicted, average="micro"), abs=1e-12)
    assert int(counts[0].sum()) == int((predicted == gold).sum())


@pytest.mark.parametrize("seed", range(5))
def test_in_scope_accuracy_and_out_of_scope_recall_count_each_example_once(seed):
    g = torch.Generator().manual_seed(seed)
    classes, oos = 6, seed % 6  # the out-of-scope class anywhere among the classes
    logits = torch.randn(120, classes, generator=g)
    gold = torch.randint(0, classes, (120,), generator=g)
    counts = sum(metrics.class_counts(metrics.predict_single_label(part), _one_hot(y, classes))
                 for part, y in zip(logits.split(17), gold.split(17)))
    right = logits.argmax(1) == gold
    in_scope, recall = metrics.out_of_scope_scores(counts, oos)
    assert in_scope == pytest.approx(float(right[gold != oos].double().mean()), abs=1e-12)
    assert recall == pytest.approx(float(right[gold == oos].double().mean()), abs=1e-12)
    assert metrics.out_of_scope_scores(torch.zeros(3, classes, dtype=torch.long), oos) == (0.0, 0.0)  # empty split


def test_multi_label_prediction_rules_and_f1_match_sklearn():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(40, 6, generator=g)
    gold = torch.rand(40, 6, generator=g) < 0.3
    gold[:, 5] = False
    for top_n in (0, 2):
        predicted = metrics.predict_multi_label(logits, top_n)
        if top_n:
            assert (predicted.sum(1) == top_n).all()
            assert torch.equal(predicted, logits >= logits.sort(1, descending=True).values[:, top_n - 1:top_n])
        else:
            assert torch.equal(predicted, logits > 0)
        seen = [c for c in range(6) if bool(gold[:, c].any() or predicted[:, c].any())]
        micro, macro = metrics.f1_scores(metrics.class_counts(predicted, gold))
        assert micro == pytest.approx(f1_score(gold, predicted, average="micro"), abs=1e-12)
        assert macro == pytest.approx(f1_score(gold, predicted, average="macro", labels=seen), abs=1e-12)


def test_entities_follow_conlleval_chunk_rules():
    # IOB2 (B- starts), IOB1 (I- after O or another type starts), B- after I- of the same type splits
    tags = ["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "I-ORG", "B-ORG", "B-ORG", "I-ORG", "O", "I-MISC"]
    assert metrics.entities(tags) == {(0, 2, "PER"), (3, 5, "LOC"), (5, 6, "ORG"), (6, 7, "ORG"), (7, 9, "ORG"),
                                      (10, 11, "MISC")}
    assert metrics.entities(["O", "O"]) == set()


def test_entity_f1_counts_exact_matches_only():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    predicted = [["B-PER", "O", "O", "B-LOC"], ["B-ORG", "B-PER"]]  # PER cut short: wrong; LOC, ORG right
    counts = metrics.entity_counts(predicted, gold)
    assert counts.tolist() == [2, 4, 3]
    assert metrics.entity_f1(counts) == pytest.approx(2 * 2 / (4 + 3))
