"""``--task text_classification`` in this process, on label lines binarised here as fairseq-preprocess does: the
three label kinds (``user_dir/tasks/label_kinds.py``) from the lines to the targets, the rows a criterion scores and
the split's metrics, which must equal scikit-learn's (and, for entities, a chunker written here) on the predictions
of the model's own logits, however the split is cut into batches. The CLI tests (test_text_classification.py) run
the same task through fairseq-train in a child process; these reach every line of it in the fast tier."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from fairseq.data import Dictionary, indexed_dataset
from fairseq.logging import metrics
from omegaconf import OmegaConf
from sklearn.metrics import f1_score

from conftest import logged
from test_criterion_wiring import build
from sparse_softmax.losses import am_softmax_loss
from user_dir.models.heads import ClassificationHead
from user_dir.options import UsageError
from user_dir.tasks.label_kinds import IGNORE
from user_dir.tasks.text_classification import TextClassificationConfig, TextClassificationTask

WORDS = "the a flight hotel book cancel please now at ten".split()
INTENTS = ["book_flight", "cancel", "greet", "oos"]
TAGS = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
#: a class of each kind's label dictionary that no example of the split has (as a class may be missing from a small
#: validation split): macro-F1 counts it where it is predicted
SPARE = {"single": "weather", "multi": "weather", "token": "B-MISC"}


def label_lines(kind: str, inputs: list[str], rng: random.Random) -> list[str]:
    """One label line per input line: an intent, a set of intents (sometimes none), or a tag per token, the
    tokens after a word's first piece (here: every third) labelled X, the default ``--ignore-label``."""
    if kind == "single":
        return [rng.choice(INTENTS) for _ in inputs]
    if kind == "multi":
        return [" ".join(rng.sample(INTENTS[:3], rng.randint(0, 2))) for _ in inputs]
    return [" ".join("X" if i % 3 == 2 else rng.choice(TAGS) for i in range(len(line.split()))) for line in inputs]


def binarise(lines: list[str], folder: Path, split: str, dictionary: Dictionary | None = None) -> Dictionary:
    """``lines`` as fairseq-preprocess --only-source writes them to ``folder``: dict.txt (padded with madeupword
    entries, here to a multiple of 16 so that every dictionary of these tests has some) and ``split``.{bin,idx},
    by ``dictionary`` when given."""
    folder.mkdir(parents=True, exist_ok=True)
    if dictionary is None:
        dictionary = Dictionary()
        for line in lines:
            for symbol in line.split():
                dictionary.add_symbol(symbol)
        dictionary.finalize(padding_factor=16)
        dictionary.save(str(folder / "dict.txt"))
    builder = indexed_dataset.make_builder(str(folder / f"{split}.bin"), impl="mmap", vocab_size=len(dictionary))
    for line in lines:
        builder.add_item(dictionary.encode_line(line, add_if_not_exist=False).long())
    builder.finalize(str(folder / f"{split}.idx"))
    return dictionary


def data(root: Path, kind: str, n: int = 23, seed: int = 0) -> tuple[list[str], list[str]]:
    """A train split of ``n`` examples of ``kind`` under ``root``, its label dictionary also holding the kind's
    ``SPARE`` class; its input and label lines."""
    rng = random.Random(seed)
    inputs = [" ".join(rng.choices(WORDS, k=rng.randint(2, 7))) for _ in range(n)]
    labels = label_lines(kind, inputs, rng)
    binarise(inputs, root / "input0", "train")
    binarise(labels, root / "label", "train", binarise([*labels, SPARE[kind]], root / "label", "valid"))
    return inputs, labels


def task_for(root: Path, kind: str, **options) -> TextClassificationTask:
    kinds = {"single": {}, "multi": {"multi_label": True}, "token": {"token_level": True}}
    cfg = TextClassificationConfig(data=str(root), seed=1, **kinds[kind], **options)
    return TextClassificationTask.setup_task(cfg)


class Encoder(torch.nn.Module):
    """Stands in for the task's encoders: random features of the tokens, and the head the task would add."""

    def __init__(self, task: TextClassificationTask, dim: int = 8, seed: int = 0, cosine_scale: float | None = None):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(len(task.source_dictionary), dim)
        self.classification_heads = torch.nn.ModuleDict({task.cfg.classification_head_name: ClassificationHead(
            dim, dim, task.num_classes, 0.0, task.labels.token_level, cosine_scale)})

    def forward(self, src_tokens, src_lengths, features_only: bool = False):
        """Each token's embedding, and at <s>, which a sentence's head reads, their mean over the sentence; without
        ``features_only``, as fairseq's encoders, the words' logits instead."""
        x = self.embed(src_tokens)
        x = torch.cat([x.mean(1, keepdim=True), x[:, 1:]], dim=1)
        return (x if features_only else x @ self.embed.weight.T), None

    def logits(self, task: TextClassificationTask, sample) -> torch.Tensor:
        features = self(**sample["net_input"], features_only=True)[0]
        return self.classification_heads[task.cfg.classification_head_name](features)


def examples(task: TextClassificationTask) -> list[dict]:
    """The train split's examples in their original order (the dataset shuffles them)."""
    dataset = task.load_dataset("train")
    return sorted((dataset[i] for i in range(len(dataset))), key=lambda example: example["id"])


def split_metrics(task: TextClassificationTask, model: Encoder, batch: int, criterion: str = "softmax"
                  ) -> tuple[dict, list]:
    """The split's metrics as the task reduces its criterion's logs over batches of ``batch`` examples, and
    each batch with the model's logits."""
    dataset, criterion = task.load_dataset("train"), build(criterion, task.source_dictionary, task=task)
    batches = [dataset.collater([dataset[i] for i in range(start, min(start + batch, len(dataset)))])
               for start in range(0, len(dataset), batch)]
    with torch.no_grad():
        logs = [criterion(model, sample)[2] for sample in batches]
        scored = [(sample, model.logits(task, sample)) for sample in batches]
    with metrics.aggregate(new_root=True) as aggregate:
        task.reduce_metrics(logs, criterion)
        return aggregate.get_smoothed_values(), scored


@pytest.mark.parametrize("kind", ["single", "multi", "token"])
def test_each_target_is_its_label_line(kind, tmp_path):
    inputs, labels = data(tmp_path, kind)
    task = task_for(tmp_path, kind)
    for example, text, line in zip(examples(task), inputs, labels, strict=True):
        tokens = example["net_input.src_tokens"]  # an item of NestedDictionaryDataset: flattened keys
        assert tokens[0] == task.source_dictionary.bos() and len(tokens) == len(text.split()) + 2  # <s> … </s>
        if kind == "single":
            assert example["target"].item() == task.class_names.index(line)
        elif kind == "multi":
            assert example["target"].tolist() == [name in line.split() for name in task.class_names]
        else:
            want = [IGNORE if tag == "X" else task.class_names.index(tag) for tag in line.split()]
            assert example["target"].tolist() == [IGNORE, *want, IGNORE]


@pytest.mark.parametrize("kind, classes", [("single", INTENTS), ("multi", INTENTS[:3]), ("token", TAGS)])
def test_the_classes_are_the_labels_alone(kind, classes, tmp_path):
    classes = [*classes, SPARE[kind]]
    """Not the dictionary's specials, not fairseq-preprocess's madeupword padding, not the ignored label."""
    data(tmp_path, kind)
    task = task_for(tmp_path, kind)
    assert sorted(task.class_names) == sorted(classes) and task.num_classes == len(classes)
    label_dictionary = task.target_dictionary
    assert any(symbol.startswith("madeupword") for symbol in label_dictionary.symbols)
    for index, symbol in enumerate(label_dictionary.symbols):
        want = (task.class_names.index(symbol) if symbol in task.class_names else IGNORE if symbol == "X" else -1)
        assert task.to_class[index] == want, symbol


@pytest.mark.parametrize("batch", [1, 4, 23])
def test_single_label_metrics_equal_sklearn(batch, tmp_path):
    data(tmp_path, "single", n=40)
    task = task_for(tmp_path, "single", out_of_scope_label="oos")
    values, scored = split_metrics(task, Encoder(task, seed=9), batch)  # seed 9: the two asserts below hold
    gold = torch.cat([sample["target"] for sample, _ in scored])
    predicted = torch.cat([logits.argmax(1) for _, logits in scored])
    oos = task.class_names.index("oos")
    in_scope = gold != oos
    want = {"accuracy": (predicted == gold).double().mean(),
            "micro_f1": f1_score(gold, predicted, average="micro"),
            "macro_f1": f1_score(gold, predicted, average="macro"),
            "in_scope_accuracy": (predicted == gold)[in_scope].double().mean(),
            "out_of_scope_recall": (predicted == gold)[~in_scope].double().mean()}
    assert 0 < want["out_of_scope_recall"] < 1 and len(set(predicted.tolist())) > 1, "a case that tells them apart"
    assert (predicted == task.class_names.index(SPARE["single"])).any(), "a class predicted but in no gold label"
    for name, value in want.items():
        assert values[name] == pytest.approx(100 * float(value), abs=0.006), name


@pytest.mark.parametrize("top_n", [0, 2])
def test_multi_label_metrics_equal_sklearn(top_n, tmp_path):
    """Classes scored > 0, or the ``top_n`` best; macro-F1 over the classes in the gold sets or the predictions."""
    data(tmp_path, "multi", n=40)
    task = task_for(tmp_path, "multi", predict_top_n=top_n)
    values, scored = split_metrics(task, Encoder(task), batch=6, criterion="multilabel_softmax")
    gold = torch.cat([sample["target"] for sample, _ in scored])
    logits = torch.cat([logits for _, logits in scored])
    if top_n:
        predicted = torch.zeros_like(gold)
        for row, scores in zip(predicted, logits):
            row[sorted(range(task.num_classes), key=lambda c: -scores[c])[:top_n]] = True
    else:
        predicted = logits > 0
    seen = [c for c in range(task.num_classes) if gold[:, c].any() or predicted[:, c].any()]
    spare = task.class_names.index(SPARE["multi"])
    assert not gold[:, spare].any() and (top_n or predicted[:, spare].any()), "a class predicted but in no gold set"
    assert values["micro_f1"] == pytest.approx(100 * f1_score(gold, predicted, average="micro"), abs=0.006)
    assert values["macro_f1"] == pytest.approx(
        100 * f1_score(gold, predicted, average="macro", labels=seen), abs=0.006)
    assert "accuracy" not in values


def chunks(tags: list[str]) -> set[tuple[int, int, str]]:
    """Entities as conlleval reads BIO tags: a tag other than O starts one unless it continues the one before
    (I- of the same type); the entity runs over the I- tags of its type that follow."""
    found, i = set(), 0
    while i < len(tags):
        if tags[i] == "O":
            i += 1
            continue
        kind, end = tags[i][2:], i + 1
        while end < len(tags) and tags[end] == f"I-{kind}":
            end += 1
        found.add((i, end, kind))
        i = end
    return found


@pytest.mark.parametrize("batch", [1, 5])
def test_token_metrics_equal_entity_f1_on_the_scored_positions(batch, tmp_path):
    """Entity F1 over the sentences' scored positions (not <s>, </s>, padding or X pieces), and token accuracy
    over them; every scored position is a criterion row."""
    data(tmp_path, "token", n=30)
    task = task_for(tmp_path, "token")
    values, scored = split_metrics(task, Encoder(task), batch)
    correct = found = expected = hits = positions = 0
    for sample, logits in scored:
        for gold_row, predicted_row in zip(sample["target"].tolist(), logits.argmax(-1).tolist()):
            kept = [(g, p) for g, p in zip(gold_row, predicted_row) if g != IGNORE]
            gold = chunks([task.class_names[g] for g, _ in kept])
            predicted = chunks([task.class_names[p] for _, p in kept])
            correct, found, expected = correct + len(gold & predicted), found + len(predicted), expected + len(gold)
            hits, positions = hits + sum(g == p for g, p in kept), positions + len(kept)
    assert 0 < correct < found
    assert values["entity_f1"] == pytest.approx(100 * 2 * correct / (found + expected), abs=0.006)
    assert values["accuracy"] == pytest.approx(100 * hits / positions, abs=0.006)


@pytest.mark.parametrize("kind, line, expected", [
    ("single", "greet cancel", "exactly one label (multi-label data needs --multi-label)"),
    ("single", "", "exactly one label (multi-label data needs --multi-label)"),
    ("token", "O O", "as many labels as input tokens"),
])
def test_a_label_line_of_the_wrong_length_is_named(kind, line, expected, tmp_path):
    """The third example's label line (its input has three tokens) holds the wrong number of labels."""
    inputs = ["book a flight", "cancel it now", "the hotel please", "greet me"]
    labels = ["greet", "cancel", line, "greet"] if kind == "single" else ["O O O", "O B-LOC I-LOC", line, "O O"]
    binarise(inputs, tmp_path / "input0", "train")
    dictionary = binarise([*labels, "greet cancel" if kind == "single" else "O B-LOC I-LOC"], tmp_path / "label",
                          "valid")
    binarise(labels, tmp_path / "label", "train", dictionary)
    task = task_for(tmp_path, kind)
    with pytest.raises(UsageError) as refused:
        task.load_dataset("train")
    assert str(refused.value) == (f"{tmp_path / 'label' / 'train'}: example 2 (line 3 of the text file) has "
                                  f"{len(line.split())} labels; expected {expected} (1 such examples)")


def test_inputs_and_labels_of_different_lengths_are_refused(tmp_path):
    inputs, labels = data(tmp_path, "single", n=5)
    binarise(labels[:4], tmp_path / "label", "train", task_for(tmp_path, "single").target_dictionary)
    with pytest.raises(UsageError) as refused:
        task_for(tmp_path, "single").load_dataset("train")
    assert str(refused.value) == (f"{tmp_path / 'input0' / 'train'} has 5 examples but "
                                  f"{tmp_path / 'label' / 'train'} has 4")


@pytest.mark.parametrize("kind, options, message", [
    ("token", {"multi_label": True}, "--multi-label and --token-level cannot be combined"),
    ("single", {"predict_top_n": 2}, "--predict-top-n applies to --multi-label data"),
    ("multi", {"out_of_scope_label": "greet"}, "--out-of-scope-label applies to single-label data"),
    ("token", {"out_of_scope_label": "O"}, "--out-of-scope-label applies to single-label data"),
])
def test_options_the_data_cannot_take_are_refused(kind, options, message, tmp_path):
    data(tmp_path, kind)
    with pytest.raises(UsageError) as refused:
        task_for(tmp_path, kind, **options)
    assert str(refused.value) == message


def test_an_out_of_scope_label_that_is_no_class_is_refused_with_the_classes(tmp_path):
    data(tmp_path, "single")
    with pytest.raises(UsageError) as refused:
        task_for(tmp_path, "single", out_of_scope_label="unknown")
    start = "--out-of-scope-label unknown: not a class of the label dictionary (its classes: "
    assert str(refused.value).startswith(start) and str(refused.value).endswith(")")
    assert sorted(str(refused.value)[len(start):-1].split()) == sorted([*INTENTS, SPARE["single"]])


def test_the_number_of_classes_is_checked_against_the_label_dictionary(tmp_path):
    data(tmp_path, "single")
    assert task_for(tmp_path, "single", num_classes=5).num_classes == 5
    with pytest.raises(UsageError) as refused:
        task_for(tmp_path, "single", num_classes=4)
    dictionary = tmp_path / "label" / "dict.txt"
    assert str(refused.value) == f"--num-classes 4, but the label dictionary {dictionary} has 5 classes"


def test_a_label_the_classes_lack_is_refused_for_its_example(tmp_path):
    """A label line holding a symbol the label dictionary lacks (binarised as <unk>, which is no class) is refused
    where it is, not trained on as some class."""
    inputs, labels = data(tmp_path, "single", n=8)
    labels[5] = "mystery"
    binarise(labels, tmp_path / "label", "train", task_for(tmp_path, "single").target_dictionary)
    dataset = task_for(tmp_path, "single").load_dataset("train")
    assert all(dataset[i]["target"].numel() == 1 for i in (0, 4, 6))
    with pytest.raises(ValueError) as refused:
        dataset[5]
    assert str(refused.value) == (f"{tmp_path / 'label' / 'train'}: example 5 has a label outside the label "
                                  "dictionary's classes")


@pytest.mark.parametrize("more, warned", [(-1, False), (0, True), (1, True)])
def test_predicting_every_class_is_warned(more, warned, tmp_path, caplog):
    data(tmp_path, "multi")
    classes = len(INTENTS[:3]) + 1  # the multi-label sets' intents and the spare class
    top_n = classes + more
    task_for(tmp_path, "multi", predict_top_n=top_n)
    message = f"--predict-top-n {top_n} >= {classes} classes: every class is predicted for every example"
    assert logged(caplog, "user_dir.tasks.text_classification") == ([message] if warned else [])


def test_a_batch_counts_its_sentences(tmp_path):
    inputs, _ = data(tmp_path, "single", n=8)
    dataset = task_for(tmp_path, "single").load_dataset("train")
    batch = dataset.collater([dataset[i] for i in range(5)])
    assert batch["nsentences"] == 5 and batch["ntokens"] == sum(len(line.split()) + 2 for line in inputs[:5])


@pytest.mark.parametrize("side", ["input0", "label"])
def test_a_missing_dictionary_is_named_with_what_writes_it(side, tmp_path):
    data(tmp_path, "single")
    (tmp_path / side / "dict.txt").unlink()
    with pytest.raises(UsageError) as refused:
        task_for(tmp_path, "single")
    assert str(refused.value) == (f"{tmp_path / side / 'dict.txt'}: no such file: --task text_classification reads "
                                  "DATA/input0 and DATA/label (data-prep/prepare_classification.py writes them)")


def test_am_softmax_reads_the_cosine_heads_scale(tmp_path):
    """--classifier cosine: the criterion gets the head's s, and scores AM-softmax on its cosines."""
    data(tmp_path, "single", n=8)
    task = task_for(tmp_path, "single", classifier="cosine")
    scale = task.cfg.cosine_scale
    model = Encoder(task, cosine_scale=scale)  # the head build_model adds with --classifier cosine
    dataset = task.load_dataset("train")
    sample = dataset.collater([dataset[i] for i in range(len(dataset))])
    loss, _, _ = build("am_softmax", task.source_dictionary, task=task, softmax_margin=0.2)(model, sample)
    with torch.no_grad():
        cosines = model.logits(task, sample) / scale
    assert float(loss) == pytest.approx(float(am_softmax_loss(cosines, sample["target"], 0.2, scale, reduction="sum")),
                                        rel=1e-5)


@pytest.mark.parametrize("kind, options", [
    ("single", {}),
    ("token", {"classifier": "cosine", "classifier_inner_dim": 1, "classifier_dropout": 0.2, "cosine_scale": 12.0,
               "classification_head_name": "tags"}),
])
def test_build_model_adds_the_head_its_options_ask_for(kind, options, tmp_path):
    """The encoder (a real ``text_encoder``) gets one head, named by --classification-head-name: from the features
    through --classifier-inner-dim (-1: the features' width; 1 is its least) to the task's classes, with
    --classifier-dropout, per token for token-level data, and cosine logits at --cosine-scale with --classifier
    cosine."""
    data(tmp_path, kind, n=8)
    task = task_for(tmp_path, kind, **options)
    model = task.build_model(OmegaConf.create({"_name": "text_encoder", "encoder_layers": 1, "encoder_embed_dim": 8,
                                               "encoder_ffn_embed_dim": 8, "encoder_attention_heads": 2}))
    name = options.get("classification_head_name", "text_classification_head")
    assert list(model.classification_heads) == [name]
    head = model.classification_heads[name]
    assert (head.dense.in_features, head.dense.out_features) == (8, options.get("classifier_inner_dim", 8))
    assert head.dropout.p == options.get("classifier_dropout", 0.1)
    assert head.cosine_scale == options.get("cosine_scale")
    logits = head(torch.randn(2, 3, 8))
    assert logits.shape == ((2, 3) if kind == "token" else (2,)) + (task.num_classes,)


def test_a_model_without_classification_heads_is_refused(tmp_path):
    data(tmp_path, "single", n=8)
    with pytest.raises(UsageError) as refused:
        task_for(tmp_path, "single").build_model(OmegaConf.create({"_name": "transformer_tiny"}))
    assert str(refused.value) == ("--arch transformer_tiny: --task text_classification needs a model with "
                                  "classification heads (roberta_*, text_encoder or hf_encoder)")


def test_sizes_and_the_shuffle_follow_the_inputs_and_the_seed(tmp_path):
    """Batching by --max-tokens reads each example's size (<s>, its words, </s>); the split's order is a shuffle
    fixed by --seed."""
    inputs, _ = data(tmp_path, "single")
    dataset = task_for(tmp_path, "single").load_dataset("train")
    sizes = [len(line.split()) + 2 for line in inputs]
    assert [int(dataset.num_tokens(i)) for i in range(len(inputs))] == sizes
    assert [int(dataset.size(i)) for i in range(len(inputs))] == sizes

    def order(seed: int) -> list[int]:
        task = task_for(tmp_path, "single")
        task.cfg.seed = seed
        return task.load_dataset("train").ordered_indices().tolist()

    assert order(1) == order(1) != order(2) and sorted(order(1)) == list(range(len(inputs)))


def test_a_split_that_was_not_binarised_is_named(tmp_path):
    data(tmp_path, "single")
    with pytest.raises(UsageError) as refused:
        task_for(tmp_path, "single").load_dataset("valid")  # label/ has a valid split, input0/ has none
    assert str(refused.value) == f"no binarised valid split at {tmp_path / 'input0' / 'valid'}.{{bin,idx}}"


def test_the_options_own_checks_run(tmp_path):
    data(tmp_path, "single")
    with pytest.raises(UsageError) as refused:
        task_for(tmp_path, "single", cosine_scale=0.0)
    assert str(refused.value).startswith("--cosine-scale ")


def labelled(root: Path, labels: list[str]) -> list[str]:
    """Inputs and these single-label lines under ``root``; the label dictionary's symbols in its order (dict.txt),
    fairseq-preprocess's padding entries left out."""
    binarise([" ".join(WORDS[:1 + i % 5]) for i in range(len(labels))], root / "input0", "train")
    binarise(labels, root / "label", "train")
    symbols = [line.split()[0] for line in (root / "label" / "dict.txt").read_text().splitlines()]
    return [s for s in symbols if not s.startswith("madeupword")]


@pytest.mark.parametrize("n, more", [(10, ""), (11, " ...")])
def test_the_class_list_of_a_refusal_stops_at_ten(n, more, tmp_path):
    classes = labelled(tmp_path, [f"intent{i % n}" for i in range(3 * n)])
    with pytest.raises(UsageError) as refused:
        task_for(tmp_path, "single", out_of_scope_label="unknown")
    assert str(refused.value) == ("--out-of-scope-label unknown: not a class of the label dictionary (its classes: "
                                  f"{' '.join(classes[:10])}{more})")


def test_token_level_refusal_names_five_labels_that_are_no_tags(tmp_path):
    odd = [s for s in labelled(tmp_path, [f"intent{i % 7}" for i in range(21)] + ["O", "B-LOC"])
           if s not in ("O", "B-LOC")]
    with pytest.raises(UsageError) as refused:
        task_for(tmp_path, "token")
    assert str(refused.value) == ("--token-level scores entities from BIO tags (B-X, I-X, O); the label dictionary "
                                  f"also has {', '.join(odd[:5])} (is --ignore-label 'X' right?)")
