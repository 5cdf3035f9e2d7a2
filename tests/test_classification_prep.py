"""data-prep/prepare_classification.py: each input format on small files written here, its refusals,
stock fairseq's sentence_prediction task reading the result, and CLINC150 from ../shared/data."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import SHARED_DATA, json_logs, run_cli, run_script, skip_in_fast_tier

CLINC = SHARED_DATA / "clinc150" / "data_full.json"


def prep(*args, check: bool = True):
    return run_script("data-prep/prepare_classification.py", *args, check=check)


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def summary(out: Path) -> dict:
    return json.loads((out / "prep_summary.json").read_text())


def tiny_clinc(path: Path) -> Path:
    intents = {"train": [["set an  alarm for six", "alarm"], ["wake me up at 7", "alarm"],
                         ["translate hello to french", "translate"], ["how do you say cat in german", "translate"]],
               "val": [["alarm at noon please", "alarm"], ["say thanks in italian", "translate"]],
               "test": [["set an alarm", "alarm"], ["translate dog", "translate"], ["cancel the alarm", "alarm"]],
               "oos_train": [["what is the meaning of life", "oos"]], "oos_val": [["tell me a joke", "oos"]],
               "oos_test": [["who won the game", "oos"]]}
    path.write_text(json.dumps(intents), encoding="utf-8")
    return path


def test_clinc150_with_and_without_oos(tmp_path):
    data = tiny_clinc(tmp_path / "data_full.json")
    prep(tmp_path / "oos", "--dataset", "clinc150", "--input", data, "--spm-vocab-size", "60")
    out = tmp_path / "oos"
    assert lines(out / "train.input0") == ["set an alarm for six", "wake me up at 7", "translate hello to french",
                                           "how do you say cat in german", "what is the meaning of life"]
    assert lines(out / "train.label") == ["alarm", "alarm", "translate", "translate", "oos"]
    assert summary(out)["num_classes"] == 3
    assert summary(out)["binarised_sentences"] == {"train": 5, "valid": 3, "test": 4}
    assert lines(out / "data-bin/label/dict.txt")[:3] == ["alarm 2", "translate 2", "oos 1"]
    prep(tmp_path / "in", "--dataset", "clinc150", "--input", data, "--no-oos", "--text-only")
    assert summary(tmp_path / "in")["num_classes"] == 2
    assert len(lines(tmp_path / "in/test.label")) == 3


def test_stock_sentence_prediction_trains_on_the_layout(tmp_path):
    skip_in_fast_tier("fairseq-train")  # before the prep, which the tests above check
    prep(tmp_path / "out", "--dataset", "clinc150", "--input", tiny_clinc(tmp_path / "d.json"),
         "--spm-vocab-size", "60")
    proc = run_cli("fairseq-train", tmp_path / "out/data-bin", "--task", "sentence_prediction", "--num-classes", "3",
                   "--arch", "roberta_base", "--encoder-layers", "1", "--encoder-embed-dim", "16",
                   "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--max-positions", "64",
                   "--criterion", "sentence_prediction", "--optimizer", "adam", "--lr", "0.001", "--batch-size", "2",
                   "--max-update", "3", "--cpu", "--no-save", "--log-format", "json", "--log-interval", "1",
                   "--num-workers", "0")
    assert len(json_logs(proc, "train_inner")) == 3


def test_sst5_and_bad_label_line(tmp_path):
    folder = tmp_path / "sst"
    folder.mkdir()
    for name in ("train", "dev", "test"):
        (folder / f"stsa.fine.{name}").write_text("4 a gorgeous film\n0 dull , dull , dull\n")
    prep(tmp_path / "out", "--dataset", "sst5", "--input", folder, "--text-only")
    assert lines(tmp_path / "out/train.label") == ["4", "0"]
    assert lines(tmp_path / "out/train.input0") == ["a gorgeous film", "dull , dull , dull"]
    (folder / "stsa.fine.dev").write_text("4 fine\nfive stars\n")
    proc = prep(tmp_path / "out", "--dataset", "sst5", "--input", folder, "--text-only", check=False)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr, "a non-empty output folder is not replaced"
    proc = prep(tmp_path / "out", "--dataset", "sst5", "--input", folder, "--text-only", "--overwrite", check=False)
    assert proc.returncode == 2 and "stsa.fine.dev:2: expected '<label 0-4> <sentence>'" in proc.stderr


def test_tsv_multi_label(tmp_path):
    train = tmp_path / "train.tsv"
    train.write_text("stocks fell\tfinance markets\nrain today\tweather\nnothing here\t\n", encoding="utf-8")
    prep(tmp_path / "out", "--dataset", "tsv", "--train", train, "--valid", train, "--multi-label", "--text-only")
    assert lines(tmp_path / "out/train.label") == ["finance markets", "weather", ""]
    result = summary(tmp_path / "out")
    assert result["num_classes"] == 3
    assert result["splits"]["train"]["edited"] == {"examples without any label": 1}
    proc = prep(tmp_path / "single", "--dataset", "tsv", "--train", train, "--text-only", check=False)
    assert proc.returncode == 2
    assert "train.tsv:1: a label must be one token without spaces, got 'finance markets'" in proc.stderr


def test_jsonl_single_and_multi_label(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text('{"text": "good", "label": "pos"}\n{"text": "bad", "label": "neg"}\n')
    prep(tmp_path / "a", "--dataset", "jsonl", "--train", train, "--test", train, "--text-only")
    assert lines(tmp_path / "a/test.label") == ["pos", "neg"]
    multi = tmp_path / "multi.jsonl"
    multi.write_text('{"text": "both", "labels": ["pos", "neg"]}\n')
    prep(tmp_path / "b", "--dataset", "jsonl", "--train", multi, "--multi-label", "--text-only")
    assert lines(tmp_path / "b/train.label") == ["pos neg"]


@pytest.mark.parametrize("dataset, train, test, message", [
    ("tsv", "a\tx\nb\ty\n", "c\tz\n", r"test.txt:1: the label 'z' never occurs in train$"),
    ("tsv", "a\tx\nno tab here\n", None, r"train.txt:2: expected 'text<TAB>label', found no tab"),
    ("tsv", b"a\tx\ncaf\xe9\tx\n", None, r"train.txt:2: not UTF-8 \(byte 0xe9 at column 4\)"),
    ("tsv", "a\tx\n \tx\n", None, r"train.txt:2: empty text \(use --skip-invalid"),
    ("jsonl", '{"text": "a", "label": "x"}\n{"text": "b"\n', None, r"train.txt:2: malformed JSON"),
    ("jsonl", '{"text": "a", "labels": ["x"]}\n', None, r"train.txt:1: expected an object with 'text' and 'label'"),
], ids=["unseen label", "no tab", "not UTF-8", "empty text", "malformed JSON", "missing key"])
def test_bad_input_is_refused(tmp_path, dataset, train, test, message):
    paths = []
    for name, content in (("train.txt", train), ("test.txt", test)):
        if content is not None:
            path = tmp_path / name
            path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
            paths += [f"--{name.split('.')[0]}", path]
    proc = prep(tmp_path / "out", "--dataset", dataset, *paths, "--text-only", check=False)
    assert proc.returncode == 2 and re.search(message, proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("dataset, content", [
    ("tsv", b"a\tx\n \tx\nb\ty\ncaf\xe9\tx\nc\ty\n"),
    ("jsonl", b'{"text": "a", "label": "x"}\n{"text": " ", "label": "x"}\n{"text": "b", "label": "y"}\n'
              b'{"text": "caf\xe9", "label": "x"}\n{"text": "c", "label": "y"}\n'),
])
def test_empty_and_non_utf8_examples_can_be_skipped_and_counted(tmp_path, dataset, content):
    train = tmp_path / "train.txt"
    train.write_bytes(content)
    prep(tmp_path / "out", "--dataset", dataset, "--train", train, "--text-only", "--skip-invalid")
    counts = summary(tmp_path / "out")["splits"]["train"]
    assert (counts["read"], counts["written"]) == (5, 3)
    assert counts["skipped"] == {"empty text": 1, "not UTF-8": 1}
    assert lines(tmp_path / "out/train.label") == ["x", "y", "y"]
    assert lines(tmp_path / "out/train.input0") == ["a", "b", "c"]


def test_clinc150_real_counts(tmp_path):
    if not CLINC.is_file():
        pytest.skip(f"real data: {CLINC} is not present on this machine")
    prep(tmp_path / "oos", "--dataset", "clinc150", "--input", CLINC, "--text-only")
    result = summary(tmp_path / "oos")
    assert result["num_classes"] == 151
    assert {s: c["written"] for s, c in result["splits"].items()} == {"train": 15100, "valid": 3100, "test": 5500}
    prep(tmp_path / "in", "--dataset", "clinc150", "--input", CLINC, "--no-oos", "--text-only")
    result = summary(tmp_path / "in")
    assert result["num_classes"] == 150
    assert {s: c["written"] for s, c in result["splits"].items()} == {"train": 15000, "valid": 3000, "test": 4500}
