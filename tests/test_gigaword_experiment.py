"""experiments/gigaword/gigaword.py end to end at its tiny scale on the synthetic Gigaword fixture (harvardnlp's
layout, no valid split used) and a tiny random BERT: a fresh-head and an adapted-head run, every decoding, through
the real prep, head adaptation, fairseq-train/-generate and scorer. Checks the held-out valid split, that each run
trained from the checkpoint it names, that every test pair is decoded, and that the table's scores are the ROUGE of
those predictions against the untouched references."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import gigaword as experiment  # experiments/gigaword (pyproject.toml's pytest pythonpath)
from conftest import ROOT, run_script
from sparse_softmax.scoring.rouge import postprocess, rouge_scores
from test_hf_encoder import write_tiny_bert

pytest.importorskip("transformers")

GIGA = ROOT / "tests" / "fixtures" / "gigaword_harvard"
METHODS = ["label_smoothing", "sparse_softmax+head"]


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("gigaword")
    giga = root / "giga"
    shutil.copytree(GIGA, giga)
    for name in ("valid.article.filter.txt", "valid.title.filter.txt"):
        (giga / "train" / name).unlink()  # as the shared Gigaword-10k: no valid split
    words = sorted({w.lower() for path in giga.rglob("*.txt") for w in path.read_text().split()} - {"##"} | {"#"})
    bert = write_tiny_bert(root / "bert", 96, words)
    out = root / "out"
    run_script("experiments/gigaword/gigaword.py", "--gigaword-dir", giga, "--model-dir", bert, "--out", out,
               "--scale", "tiny", "--valid-pairs", "6", "--seeds", "1", "--methods", *METHODS)
    return {"giga": giga, "out": out, "data": out / "work" / "data"}


def test_the_valid_split_is_the_last_training_pairs(run):
    data, giga = run["data"], run["giga"]
    assert lines(data / "valid.tgt") == lines(giga / "train" / "train.title.txt")[-6:]
    assert lines(data / "train.tgt") == lines(giga / "train" / "train.title.txt")[:-6]
    assert lines(data / "test.ref") == lines(giga / "Giga" / "task1_ref0.txt")


def test_each_run_trains_from_its_head(run):
    work = run["out"] / "work"
    fresh = (work / "label_smoothing-seed1" / "train.log").read_text()
    adapted = (work / "sparse_softmax+head-seed1" / "train.log").read_text()
    assert "hf_unilm: a fresh (randomly initialised) MLM head transform" in fresh
    assert "hf_unilm: the checkpoint MLM head transform" in adapted and str(work / "head-adapted-seed1") in adapted
    head = json.loads((work / "head-adapted-seed1" / "head_adaptation.json").read_text())
    assert head["steps"] == experiment.SCALES["tiny"]["head_steps"] and head["seed"] == 1
    # the split's files, relative to the folder the harness ran in, so that a committed record names no machine's
    assert [(Path.cwd() / path).resolve() for path in head["text"]] == [
        (run["data"] / name).resolve() for name in ("train.src", "train.tgt")]
    assert not any(Path(path).is_absolute() for path in [*head["text"], head["model"]])


def test_scores_are_the_rouge_of_every_test_prediction(run):
    references = lines(run["data"] / "test.ref")
    records = json.loads((run["out"] / "runs.json").read_text())
    assert sorted(r["method"] for r in records) == sorted(METHODS)
    for record in records:
        assert list(record["scores"]) == list(experiment.DECODINGS)
        for decoding, scores in record["scores"].items():
            folder = run["out"] / "work" / f"{record['method']}-seed1"
            hypotheses = lines(folder / scores["predictions"])
            assert len(hypotheses) == len(references) == 5
            assert not any("##" in h.split() for h in hypotheses), "WordPiece is joined back"
            clean = [postprocess(t, lowercase=True, map_unk=True, digits_to_hash=False) for t in references]
            ours = rouge_scores([postprocess(h, lowercase=True, map_unk=True, digits_to_hash=False)
                                 for h in hypotheses], clean, ["rouge1", "rouge2", "rougeL"], True)
            for i, name in enumerate(["ROUGE-1", "ROUGE-2", "ROUGE-L"]):
                assert scores["F1"][name] == pytest.approx(100 * ours[:, i, 2].mean())


def test_results_compare_each_loss_and_head(run):
    text = (run["out"] / "results.md").read_text()
    assert "| sparse_softmax+head | beam 5, top-5 mask |" in text
    assert "| sparse_softmax+head − label_smoothing |" not in text, "compared with label smoothing on its own head"
    assert "data: gigaword in harvardnlp's layout" in text.lower() and "- valid: 6 pairs in, 6 written" in text
    assert "- train: 40 pairs in, 34 written (1 <unk> written as UNK; 6 held out as the valid split" in text
    assert "- seed 1's adapted head (`+head`, `adapt_mlm_head.py --seed 1`): 4 steps" in text
    assert (run["out"] / "curves.png").stat().st_size > 0


def test_comparisons():
    assert experiment.comparisons(["label_smoothing", "sparse_softmax", "label_smoothing+head",
                                   "sparse_softmax+head"]) == [
        ("sparse_softmax", "label_smoothing"), ("sparse_softmax+head", "label_smoothing+head"),
        ("label_smoothing+head", "label_smoothing"), ("sparse_softmax+head", "sparse_softmax")]


def test_missing_data_is_one_line(tmp_path):
    proc = run_script("experiments/gigaword/gigaword.py", "--gigaword-dir", tmp_path, "--out", tmp_path / "out",
                      check=False)
    assert proc.returncode == 2 and "--gigaword-dir" in proc.stderr and "train/train.article.txt" in proc.stderr
    assert "Traceback" not in proc.stderr
