"""--task text_classification end to end: prep scripts → fairseq-train → fairseq-validate, for single-label,
multi-label and token classification, every criterion, both encoders, and AS-Speed (rising steps, resume,
two processes). Metrics printed by fairseq are checked against scikit-learn on predictions made here."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch
from sklearn.metrics import f1_score

from conftest import ROOT, TRAIN_COMMON, json_logs, run_cli, run_script, skip_in_fast_tier, train_two_ranks
from test_criterion_wiring import OPTIONS, SCALE, core_loss, criterion_flags

TOPICS = {
    "weather": ["rain", "sunny", "forecast", "cloudy", "storm"],
    "music": ["song", "guitar", "album", "concert", "band"],
    "food": ["pizza", "recipe", "dinner", "noodles", "bread"],
    "travel": ["flight", "hotel", "airport", "passport", "train"],
}
FILLERS = ["please", "tell", "me", "about", "the", "what", "is", "a", "good", "today", "now", "my", "for"]
COMMON = ("--user-dir", ROOT / "user_dir", "--task", "text_classification", "--cpu", "--optimizer", "adam",
          "--lr", "0.003", "--log-format", "json", "--log-interval", "1", "--seed", "2", "--num-workers", "0",
          "--no-epoch-checkpoints", "--dropout", "0.0", "--classifier-dropout", "0.0")
SMALL_ENCODER = ("--arch", "text_encoder", "--encoder-layers", "1", "--encoder-embed-dim", "32",
                 "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2")
#: the options of each single-label criterion here: test_criterion_wiring's, with k = 2 of the 4 classes (its k = 4
#: would keep them all, which is softmax)
SINGLE_LABEL_OPTIONS = {**OPTIONS, "sparse_softmax": {"sparse_topk": 2, "label_smoothing": 0.1}}
TRAINED = ("as_softmax", "softmax", "sparse_softmax")  # trained to learn; the others a few updates


def _sentence(rng: random.Random, topics: list[str]) -> str:
    words = [rng.choice(FILLERS) for _ in range(rng.randint(2, 5))]
    for topic in topics:
        words.insert(rng.randint(0, len(words)), rng.choice(TOPICS[topic]))
    return " ".join(words)


def _write_split(path: Path, rng: random.Random, n: int, multi_label: bool) -> None:
    lines = []
    for _ in range(n):
        topics = rng.sample(sorted(TOPICS), rng.randint(1, 2)) if multi_label else [rng.choice(sorted(TOPICS))]
        lines.append(f"{_sentence(rng, topics)}\t{' '.join(topics)}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _prepare(root: Path, multi_label: bool) -> Path:
    rng = random.Random(5 + multi_label)
    for split, n in (("train", 400), ("valid", 60), ("test", 50)):
        _write_split(root / f"{split}.tsv", rng, n, multi_label)
    run_script("data-prep/prepare_classification.py", root / "prep", "--dataset", "tsv",
               *(x for split in ("train", "valid", "test") for x in (f"--{split}", root / f"{split}.tsv")),
               *(["--multi-label"] if multi_label else []), "--spm-vocab-size", "60")
    return root / "prep"


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    skip_in_fast_tier("fairseq-train")  # every test of this data set trains (the prep has tests of its own)
    return _prepare(tmp_path_factory.mktemp("single"), multi_label=False)


@pytest.fixture(scope="module")
def multi(tmp_path_factory) -> Path:
    skip_in_fast_tier("fairseq-train")
    return _prepare(tmp_path_factory.mktemp("multi"), multi_label=True)


def train(data: Path, save_dir: Path, *flags, updates: int = 30, check: bool = True, batch: int = 16):
    return run_cli("fairseq-train", data / "data-bin", *COMMON, "--batch-size", str(batch), "--max-update",
                   str(updates), "--save-dir", save_dir, *flags, check=check)


def validate(data: Path, checkpoint: Path, subset: str = "valid", batch: int = 7) -> dict:
    out = run_cli("fairseq-validate", data / "data-bin", "--user-dir", ROOT / "user_dir", "--task",
                  "text_classification", "--path", checkpoint, "--cpu", "--batch-size", str(batch),
                  "--valid-subset", subset, "--log-format", "json")
    record = json_logs(out, subset)[0]
    return {key.removeprefix(f"{subset}_"): value for key, value in record.items()}


def independent_scores(data: Path, checkpoint: Path, split: str) -> tuple[np.ndarray, list]:
    """The model's class scores on ``split``, with inputs made here from the text files, the sentencepiece
    model and the dictionaries (not through the task's datasets), and the gold labels as class indices."""
    from fairseq import checkpoint_utils

    import user_dir  # noqa: F401  (checkpoint loading on torch >= 2.6, model registration)

    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    model = models[0].eval()
    head = model.classification_heads[task.cfg.classification_head_name]
    processor = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    words = [line.split()[0] for line in (data / "data-bin/input0/dict.txt").read_text(encoding="utf-8").splitlines()]
    index = {w: i + 4 for i, w in enumerate(words)}  # fairseq: <s> <pad> </s> <unk>, then the file's order
    classes = [line.split()[0] for line in (data / "data-bin/label/dict.txt").read_text(encoding="utf-8").splitlines()]
    scores = []
    with torch.no_grad():
        for text in (data / f"{split}.input0").read_text(encoding="utf-8").splitlines():
            ids = [0] + [index.get(p, 3) for p in processor.encode(text, out_type=str)] + [2]
            features, _ = model(torch.tensor([ids]), features_only=True)
            scores.append(head(features)[0].numpy())
    gold = [[classes.index(c) for c in line.split()]
            for line in (data / f"{split}.label").read_text(encoding="utf-8").splitlines()]
    return np.array(scores), gold


# ----- single label -----

@pytest.mark.parametrize("criterion", sorted(SINGLE_LABEL_OPTIONS))
def test_every_single_label_criterion_logs_its_core_loss(criterion, single, tmp_path):
    """The loss fairseq-train logs on the validation split is the core loss of the checkpoint's class scores,
    computed here from the text; the papers' losses and softmax also train until they classify."""
    options = SINGLE_LABEL_OPTIONS[criterion]
    cosine = ["--classifier", "cosine", "--cosine-scale", str(SCALE)] if criterion == "am_softmax" else []
    updates = 30 if criterion in TRAINED else 2
    out = train(single, tmp_path, *SMALL_ENCODER, *cosine, *criterion_flags(criterion, options), updates=updates)
    losses = [float(r["loss"]) for r in json_logs(out, "train_inner")]
    assert len(losses) == updates and all(math.isfinite(x) for x in losses), losses
    valid = json_logs(out, "valid")[-1]  # fairseq-train validates when it stops, with checkpoint_last.pt's weights
    assert int(valid["valid_num_updates"]) == updates
    scores, gold = independent_scores(single, tmp_path / "checkpoint_last.pt", "valid")
    z, t = torch.from_numpy(scores).double(), torch.tensor([g[0] for g in gold])
    want = float(core_loss(criterion, z, t, options)) / len(t) / math.log(2)
    assert float(valid["valid_loss"]) == pytest.approx(want, abs=1e-3)
    if criterion in TRAINED:
        assert np.mean(losses[-5:]) < np.mean(losses[:5]), losses
        assert float(valid["valid_accuracy"]) > 40.0, valid  # 4 balanced classes: chance is 25
        assert {"valid_accuracy", "valid_macro_f1", "valid_micro_f1"} <= set(valid)


def test_whole_split_metrics_equal_sklearn_on_independent_predictions(single, tmp_path):
    # 'food' as the out-of-scope class: the task also logs accuracy over the other classes and food's recall
    train(single, tmp_path, *SMALL_ENCODER, "--criterion", "as_softmax", "--out-of-scope-label", "food", updates=60)
    checkpoint = tmp_path / "checkpoint_last.pt"
    for split in ("valid", "test"):
        logged = validate(single, checkpoint, split, batch=7)  # 7 per batch: many batches, a short last one
        scores, gold = independent_scores(single, checkpoint, split)
        gold = np.array([g[0] for g in gold])
        predicted = scores.argmax(1)
        assert float(logged["accuracy"]) == pytest.approx(100 * np.mean(predicted == gold), abs=0.006)
        assert float(logged["macro_f1"]) == pytest.approx(100 * f1_score(gold, predicted, average="macro"), abs=0.006)
        assert float(logged["micro_f1"]) == pytest.approx(100 * f1_score(gold, predicted, average="micro"), abs=0.006)
        classes = (single / "data-bin/label/dict.txt").read_text(encoding="utf-8").splitlines()
        food = [line.split()[0] for line in classes].index("food")  # the order independent_scores numbers them
        assert float(logged["in_scope_accuracy"]) == pytest.approx(
            100 * np.mean(predicted[gold != food] == gold[gold != food]), abs=0.006)
        assert float(logged["out_of_scope_recall"]) == pytest.approx(
            100 * np.mean(predicted[gold == food] == food), abs=0.006)


def test_best_checkpoint_metric_is_the_validation_accuracy(single, tmp_path):
    out = train(single, tmp_path, *SMALL_ENCODER, "--criterion", "softmax", "--validate-interval-updates", "5",
                "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric", updates=40)
    accuracies = [float(r["valid_accuracy"]) for r in json_logs(out, "valid")]
    assert len(accuracies) >= 8
    assert float(json_logs(out, "valid")[-1]["valid_best_accuracy"]) == max(accuracies)
    assert float(validate(single, tmp_path / "checkpoint_best.pt")["accuracy"]) == max(accuracies)


def test_shrunk_roberta_trains_and_validates(single, tmp_path):
    out = train(single, tmp_path, "--arch", "roberta_base", "--encoder-layers", "1", "--encoder-embed-dim", "32",
                "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--max-positions", "64",
                "--criterion", "sparse_softmax", "--sparse-topk", "3", updates=30)
    losses = [float(r["loss"]) for r in json_logs(out, "train_inner")]
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    assert "accuracy" in validate(single, tmp_path / "checkpoint_last.pt")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--criterion", "multilabel_softmax"], "multi-label loss but the task is single-label"),
        (["--criterion", "softmax", "--num-classes", "5"], "has 4 classes"),
        (["--criterion", "am_softmax"], "needs cosine logits"),
        (["--criterion", "softmax", "--arch", "transformer_tiny"], "needs a model with classification heads"),
        (["--criterion", "softmax", "--as-speed"], "as_softmax or as_multilabel"),
        (["--criterion", "softmax", "--out-of-scope-label", "oos"],
         "--out-of-scope-label oos: not a class of the label dictionary (its classes: "),
        (["--criterion", "as_softmax", "--fused-output-layer"],
         "--fused-output-layer scores a seq2seq decoder's features against its output projection; "
         "--task text_classification scores classification heads over a few classes instead"),
    ],
)
def test_bad_combinations_are_refused(flags, message, single, tmp_path):
    arch = [] if "--arch" in flags else list(SMALL_ENCODER)
    proc = train(single, tmp_path, *arch, *flags, updates=2, check=False)
    assert proc.returncode != 0 and message in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-2000:]


def test_multi_label_data_needs_multi_label(multi, tmp_path):
    proc = train(multi, tmp_path, *SMALL_ENCODER, "--criterion", "softmax", updates=2, check=False)
    assert proc.returncode != 0
    assert "labels; expected exactly one label (multi-label data needs --multi-label)" in proc.stderr


def test_a_refused_run_leaves_no_save_dir_and_validate_asks_for_a_batch_size(single, tmp_path):
    save_dir = tmp_path / "new" / "checkpoints"
    proc = train(single, save_dir, *SMALL_ENCODER, "--criterion", "softmax", "--num-classes", "99", updates=2,
                 check=False)
    assert proc.returncode == 2 and "--num-classes 99, but the label dictionary" in proc.stderr, proc.stderr
    assert not (tmp_path / "new").exists()  # fairseq-train made both folders
    train(single, tmp_path, *SMALL_ENCODER, "--criterion", "softmax", updates=2)
    proc = run_cli("fairseq-validate", single / "data-bin", "--user-dir", ROOT / "user_dir", "--task",
                   "text_classification", "--path", tmp_path / "checkpoint_last.pt", "--cpu", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1] == ("fairseq-validate: error: --batch-size or --max-tokens: give one (the "
                                            "sentences or the tokens a batch holds)")


def test_out_of_scope_label_is_for_single_label_data(multi, tmp_path):
    proc = train(multi, tmp_path, *SMALL_ENCODER, "--multi-label", "--criterion", "multilabel_softmax",
                 "--out-of-scope-label", "music", updates=2, check=False)
    assert proc.returncode == 2 and "--out-of-scope-label applies to single-label data" in proc.stderr, proc.stderr


# ----- multi-label -----

@pytest.mark.parametrize("criterion", ["multilabel_softmax", "as_multilabel"])
@pytest.mark.parametrize("top_n", [0, 2])
def test_multi_label_training_and_metrics(criterion, top_n, multi, tmp_path):
    flags = ["--multi-label", "--criterion", criterion] + (["--predict-top-n", str(top_n)] if top_n else [])
    out = train(multi, tmp_path, *SMALL_ENCODER, *flags, updates=60)
    losses = [float(r["loss"]) for r in json_logs(out, "train_inner")]
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    logged = validate(multi, tmp_path / "checkpoint_last.pt")
    scores, gold = independent_scores(multi, tmp_path / "checkpoint_last.pt", "valid")
    truth = np.zeros_like(scores, dtype=bool)
    for row, labels in enumerate(gold):
        truth[row, labels] = True
    if top_n:
        predicted = np.zeros_like(truth)
        np.put_along_axis(predicted, np.argsort(-scores, axis=1)[:, :top_n], True, axis=1)
    else:
        predicted = scores > 0
    seen = [c for c in range(truth.shape[1]) if truth[:, c].any() or predicted[:, c].any()]
    assert float(logged["micro_f1"]) == pytest.approx(100 * f1_score(truth, predicted, average="micro"), abs=0.006)
    assert float(logged["macro_f1"]) == pytest.approx(
        100 * f1_score(truth, predicted, average="macro", labels=seen), abs=0.006)
    assert float(logged["micro_f1"]) > 50.0
    assert "accuracy" not in logged


# ----- token classification -----

NAMES = {"PER": ["alice", "bob", "carol smith", "dan"], "LOC": ["paris", "new york", "berlin", "lima"],
         "ORG": ["acme corp", "globex", "initech"]}
TEMPLATES = ["{PER} visited {LOC} yesterday", "{PER} works for {ORG} in {LOC}", "the {ORG} office is in {LOC}",
             "we met {PER} today"]


def _conll(path: Path, rng: random.Random, n: int) -> None:
    lines = ["-DOCSTART- -X- -X- O", ""]
    for _ in range(n):
        for part in rng.choice(TEMPLATES).split():
            if part.startswith("{"):
                kind = part[1:-1]
                for i, word in enumerate(rng.choice(NAMES[kind]).split()):
                    lines.append(f"{word} NNP B-NP {'B' if i == 0 else 'I'}-{kind}")
            else:
                lines.append(f"{part} XX O O")
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")


@pytest.fixture(scope="module")
def conll(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("conll")
    rng = random.Random(11)
    for split, n in (("train", 300), ("valid", 40), ("test", 40)):
        _conll(root / f"{split}.txt", rng, n)
    run_script("data-prep/prepare_conll.py", root / "prep", *(x for s in ("train", "valid", "test")
                                                                for x in (f"--{s}", root / f"{s}.txt")),
               "--spm-vocab-size", "40")
    return root / "prep"


def test_conll_prep_labels_the_first_piece_of_each_word(conll):
    summary = json.loads((conll / "prep_summary.json").read_text())
    assert summary["splits"]["train"]["read"] == 300 and summary["splits"]["train"]["written"] == 300
    assert summary["splits"]["train"]["edited"] == {"-DOCSTART- lines dropped": 1}
    assert summary["num_classes"] == 7  # O, B-/I- of PER, LOC, ORG
    pieces = (conll / "train.spm.input0").read_text(encoding="utf-8").splitlines()
    labels = (conll / "train.label").read_text(encoding="utf-8").splitlines()
    tags = (conll / "train.word_label").read_text(encoding="utf-8").splitlines()
    assert any("X" in line.split() for line in labels), "a 40-piece vocabulary must split some words"
    for piece_line, label_line, tag_line in zip(pieces, labels, tags):
        firsts = [label for piece, label in zip(piece_line.split(), label_line.split()) if piece.startswith("\u2581")]
        rest = [label for piece, label in zip(piece_line.split(), label_line.split()) if not piece.startswith("\u2581")]
        assert firsts == tag_line.split() and set(rest) <= {"X"}
        assert len(piece_line.split()) == len(label_line.split())


def test_token_classification_trains_and_reports_entity_f1(conll, tmp_path):
    out = train(conll, tmp_path, "--token-level", *SMALL_ENCODER, "--criterion", "as_softmax", "--as-delta", "0.2",
                "--validate-interval-updates", "80", updates=80)
    losses = [float(r["loss"]) for r in json_logs(out, "train_inner")]
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    logged = validate(conll, tmp_path / "checkpoint_last.pt", "test")
    assert float(logged["entity_f1"]) > 50.0, logged
    assert "accuracy" in logged and "macro_f1" not in logged


def test_conll_prep_refuses_a_reserved_tag_and_short_lines(tmp_path):
    (tmp_path / "bad.txt").write_text("word NN X\n", encoding="utf-8")
    proc = run_script("data-prep/prepare_conll.py", tmp_path / "out", "--train", tmp_path / "bad.txt", check=False)
    assert proc.returncode == 2 and "bad.txt:1: the tag 'X' is reserved" in proc.stderr
    (tmp_path / "short.txt").write_text("a NN O\nlonely\n", encoding="utf-8")
    proc = run_script("data-prep/prepare_conll.py", tmp_path / "out", "--train", tmp_path / "short.txt", check=False)
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1].endswith(
        "short.txt:2: expected 'word ... label' columns with the label in the last column, got 1 column(s)")


def test_conll_prep_names_where_an_unseen_tag_occurs(tmp_path):
    (tmp_path / "train.txt").write_text("Paris NNP B-LOC\nis VBZ O\n", encoding="utf-8")
    (tmp_path / "dev.txt").write_text("-DOCSTART- -X- O\n\nNew NNP B-LOC\nYork NNP I-LOC\nTimes NNP B-ORG\n",
                                      encoding="utf-8")
    proc = run_script("data-prep/prepare_conll.py", tmp_path / "out", "--train", tmp_path / "train.txt",
                      "--valid", tmp_path / "dev.txt", "--text-only", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1] == (f"prepare_conll.py: error: {tmp_path / 'dev.txt'}:4: the tag 'I-LOC' "
                                            "never occurs in train (nor do B-ORG)")


def test_conll_prep_counts_tokens_and_entities_per_type(tmp_path):
    """Entities by conlleval's chunk rules: an I- tag after O or another type opens one (IOB1 files have them)."""
    (tmp_path / "train.txt").write_text(
        "-DOCSTART- -X- O\n\nNew NNP B-LOC\nYork NNP I-LOC\nand CC O\nAcme NNP I-ORG\nCorp NNP I-ORG\n\n"
        "Bob NNP B-PER\nBob NNP B-PER\nLima NNP I-LOC\n", encoding="utf-8")
    proc = run_script("data-prep/prepare_conll.py", tmp_path / "out", "--train", tmp_path / "train.txt",
                      "--text-only")
    assert "train: 8 tokens; entities 5 (LOC 2, ORG 1, PER 2)" in proc.stdout.splitlines(), proc.stdout
    summary = json.loads((tmp_path / "out/prep_summary.json").read_text())
    assert summary["tokens"] == {"train": 8} and summary["entities"] == {"train": {"LOC": 2, "ORG": 1, "PER": 2}}


def test_conll_prep_skips_a_sentence_with_a_non_utf8_line_whole(tmp_path):
    (tmp_path / "train.txt").write_bytes(b"-DOCSTART- -X- O O\n\nParis NNP B-LOC\nis VBZ O\n\n"
                                         b"Caf\xe9 NN B-ORG\nopens VBZ O\n\nRome NNP B-LOC\n")
    proc = run_script("data-prep/prepare_conll.py", tmp_path / "out", "--train", tmp_path / "train.txt",
                      "--text-only", check=False)
    assert proc.returncode == 2 and "train.txt:6: not UTF-8 (byte 0xe9 at column 4)" in proc.stderr
    run_script("data-prep/prepare_conll.py", tmp_path / "out", "--train", tmp_path / "train.txt", "--text-only",
               "--skip-invalid")
    counts = json.loads((tmp_path / "out" / "prep_summary.json").read_text())["splits"]["train"]
    assert (counts["read"], counts["written"], counts["skipped"]) == (3, 2, {"not UTF-8": 1})
    assert (tmp_path / "out/train.input0").read_text().splitlines() == ["Paris is", "Rome"]
    assert (tmp_path / "out/train.word_label").read_text().splitlines() == ["B-LOC O", "B-LOC"]


# ----- AS-Speed -----

def _expected_steps(logs: list[dict], rows_key: str = "bsz", start: int = 1, cap: int = 3) -> list[int]:
    """The rule replayed on the logged counts: each update's rows (sentences, or target tokens for
    seq2seq) and masked rows recovered exactly from the 4-decimal masked ratio."""
    steps, out = start, []
    for record in logs:
        out.append(steps)
        rows = float(record[rows_key])
        masked = round(float(record["masked_ratio"]) * rows)
        steps = next_steps(steps, rows, masked, cap)
    return out


def next_steps(steps: int, rows: float, masked: int, cap: int) -> int:
    wanted = math.inf if masked >= rows else math.floor(rows / (rows - masked) + 0.5)  # lambda = 1
    return int(min(cap, steps + 1, max(steps, wanted)))


def _check_as_speed_log(logs: list[dict], batch: int, cap: int, workers: int = 1, start: int = 1) -> list[int]:
    steps = [int(float(r["accum_steps"])) for r in logs]
    assert steps == _expected_steps(logs, start=start, cap=cap), steps
    assert all(0 <= b - a <= 1 for a, b in zip(steps, steps[1:])) and max(steps) <= cap
    # each update really took `steps` micro-batches of `batch` sentences per worker (epoch ends may be short)
    full = [int(float(r["bsz"])) == workers * batch * s for r, s in zip(logs, steps)]
    assert sum(full) >= 0.8 * len(full), [(r["bsz"], s) for r, s in zip(logs, steps)]
    return steps


def test_as_speed_steps_rise_as_samples_get_masked_and_resume_from_checkpoint(single, tmp_path):
    flags = [*SMALL_ENCODER, "--criterion", "as_softmax", "--as-delta", "0.1",
             "--as-speed", "--as-speed-max-steps", "3"]
    first = train(single, tmp_path, *flags, updates=60, batch=8)
    logs = json_logs(first, "train_inner")
    steps = _check_as_speed_log(logs, batch=8, cap=3)
    assert steps[0] == 1 and steps[-1] > 1, "the steps must rise once samples are masked"
    said = (first.stdout + first.stderr).count("AS-Speed: 2 micro-batches per update from now on (was 1)")
    assert said == 1, "the first rise is announced once (the update-counted schedule now lags the epochs)"
    second = train(single, tmp_path, *flags, updates=70, batch=8)
    resumed = json_logs(second, "train_inner")
    assert int(resumed[0]["num_updates"]) == 61
    last = logs[-1]
    restored = next_steps(steps[-1], float(last["bsz"]), round(float(last["masked_ratio"]) * float(last["bsz"])), 3)
    _check_as_speed_log(resumed, batch=8, cap=3, start=restored)  # not --update-freq's 1: the checkpoint's


def test_as_speed_with_the_seq2seq_task(toy_data, tmp_path):
    out = run_cli("fairseq-train", toy_data, *TRAIN_COMMON, "--task", "sparse_seq2seq", "--arch", "transformer_tiny",
                  "--criterion", "as_softmax", "--as-delta", "0.1", "--as-speed", "--as-speed-max-steps", "3",
                  "--max-update", "40", "--save-dir", tmp_path)
    logs = json_logs(out, "train_inner")
    steps = [int(float(r["accum_steps"])) for r in logs]
    assert steps == _expected_steps(logs, rows_key="wpb") and steps[-1] > 1, steps


def test_as_speed_two_processes_agree_on_the_steps(single, tmp_path):
    outputs = train_two_ranks(single / "data-bin", *COMMON, *SMALL_ENCODER, "--criterion", "as_softmax",
                              "--as-delta", "0.1", "--as-speed", "--as-speed-max-steps", "3", "--batch-size", "8",
                              "--max-update", "45", "--save-dir", tmp_path)
    logs = json_logs(outputs[0], "train_inner")
    assert [int(r["num_updates"]) for r in logs] == list(range(1, 46))
    # the logged ratio is over both workers' rows: replaying the rule on it gives the steps only if the
    # schedule summed both workers' counts; each update holds steps x 8 sentences from each worker
    steps = _check_as_speed_log(logs, batch=8, cap=3, workers=2)
    assert steps[-1] > 1
