"""experiments/qg_minilm/qg_minilm.py end to end at its tiny scale: a synthetic SQuAD (JSON and Du-style article
lists) and a tiny random BERT saved as a checkpoint, one seed, two losses, every decoding, through the real prep,
fairseq-train/-generate and scorer. Checks that the test subset is the evenly spaced examples of the split, that
every one of them is decoded, and that the table's scores are the BLEU of those predictions against their
references, per example and grouped by source line."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import qg_minilm as experiment  # experiments/qg_minilm (pyproject.toml's pytest pythonpath)
from conftest import run_script
from test_hf_encoder import write_tiny_bert
from test_qg_experiment import assert_scores_are_bleu

pytest.importorskip("transformers")

METHODS = ["cross_entropy", "sparse_softmax"]
WORDS = [f"w{i}" for i in range(40)]
DOCLISTS = {"train": range(8), "dev": range(8, 10), "test": range(10, 12)}  # articles 0-8 in train JSON, 9-11 dev


def synthetic_squad(folder: Path) -> Path:
    """Twelve one-paragraph articles of five questions each; each question names the word before its answer."""
    rng = random.Random(0)
    articles = []
    for a in range(12):
        words = rng.choices(WORDS, k=30)
        qas = []
        for q in range(5):
            start = rng.randrange(1, 27)
            answer = " ".join(words[start:start + rng.randint(1, 3)])
            qas.append({"id": f"{a}-{q}", "question": f"what comes after {words[start - 1]} ?",
                        "answers": [{"text": answer, "answer_start": len(" ".join(words[:start])) + 1}]})
        articles.append({"title": f"Article_{a}", "paragraphs": [{"context": " ".join(words), "qas": qas}]})
    folder.mkdir()
    for name, part in (("train", articles[:9]), ("dev", articles[9:])):
        (folder / f"{name}-v1.1.json").write_text(json.dumps({"version": "1.1", "data": part}))
    for name, ids in DOCLISTS.items():
        (folder / f"doclist-{name}.txt").write_text("".join(f"Article_{a}\n" for a in ids))
    return folder


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("qg-minilm")
    squad = synthetic_squad(root / "squad")
    bert = write_tiny_bert(root / "bert", 96, WORDS + ["what", "comes", "after", "?"])
    out = root / "out"
    args = ["--squad-dir", squad, "--model-dir", bert, "--out", out, "--scale", "tiny"]
    run_script("experiments/qg_minilm/qg_minilm.py", *args, "--seeds", "1", "--methods", *METHODS)
    scale = experiment.SCALES["tiny"]
    data = out / "work" / f"data-w{scale['window']}-t{scale['target']}"
    return {"out": out, "data": data, "bins": data / "eval-bin", "args": args}


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_evenly_spaced():
    assert experiment.evenly_spaced(10, 4) == [0, 2, 5, 7]
    assert experiment.evenly_spaced(3, 5) == experiment.evenly_spaced(3, None) == [0, 1, 2]


def test_the_test_subset_is_the_evenly_spaced_examples(run):
    from fairseq.data import Dictionary, data_utils

    data, bins = run["data"], run["bins"]
    assert len(lines(data / "test.ref")) == 10  # the two test articles' questions, none skipped
    keep = experiment.evenly_spaced(10, experiment.SCALES["tiny"]["test"])
    assert len(keep) < 10
    assert lines(bins / "test.ref") == [lines(data / "test.ref")[i] for i in keep]
    assert lines(bins / "test.src") == [lines(data / "test.src")[i] for i in keep]
    dictionary = Dictionary.load(str(data / "data-bin" / "dict.src.txt"))
    for side in ("src", "tgt"):
        whole = data_utils.load_indexed_dataset(str(data / "data-bin" / f"test.src-tgt.{side}"), dictionary)
        subset = data_utils.load_indexed_dataset(str(bins / f"test.src-tgt.{side}"), dictionary)
        assert [subset[i].tolist() for i in range(len(subset))] == [whole[i].tolist() for i in keep]


def test_scores_are_those_of_the_decoded_questions(run):
    out, bins = run["out"], run["bins"]
    sources, references = lines(bins / "test.src"), lines(bins / "test.ref")
    runs = json.loads((out / "runs.json").read_text())
    assert sorted(r["method"] for r in runs) == sorted(METHODS)
    for r in runs:
        assert list(r["scores"]) == list(experiment.DECODINGS)
        for decoding, scores in r["scores"].items():
            hyps = lines(out / "work" / f"{r['method']}-seed1" / scores["predictions"])
            assert len(hyps) == len(references) and not any("##" in h for h in hyps)
            assert_scores_are_bleu(scores, hyps, references, sources)
        assert not list((out / "work" / f"{r['method']}-seed1").rglob("*.pt"))  # weights deleted, numbers kept


def test_table_notes_and_plot(run):
    out = run["out"]
    table = (out / "results.md").read_text()
    assert table.startswith("`python experiments/qg_minilm/qg_minilm.py --squad-dir")
    for method in METHODS:
        for decoding in experiment.DECODINGS:
            assert table.count(f"| {method} | {decoding} | ") == 2  # per example and grouped
    assert "- test: 10 questions, 10 written (skipped: none), 6 evenly spaced ones used" in table
    assert "- training: 20 updates of 2 questions = 40 (1.00 epochs)" in table
    assert (out / "curves.png").stat().st_size > 10_000


def test_table_only_tabulates_the_finished_runs_and_runs_nothing(run):
    """Seed 2 and the warm-up method have not run: --table-only leaves them out (nothing is trained, no folder made),
    keeps the finished runs' rows as they were and says which seeds each row has."""
    out = run["out"]
    before = (out / "results.md").read_text()
    run_script("experiments/qg_minilm/qg_minilm.py", *run["args"], "--seeds", "1", "2",
               "--methods", *METHODS, "sparse_softmax_warmup", "--table-only")
    table = (out / "results.md").read_text()
    assert sorted(folder.name for folder in (out / "work").glob("*-seed*")) == [f"{m}-seed1" for m in METHODS]
    assert "sparse_softmax_warmup" not in table.split("`", 2)[2]  # only in the command line
    rows = [line for line in table.splitlines() if line.startswith(tuple(f"| {m} |" for m in METHODS))]
    assert rows == [line for line in before.splitlines() if line.startswith(tuple(f"| {m} |" for m in METHODS))]
    assert len(rows) == 2 * len(METHODS) * len(experiment.DECODINGS) + len(METHODS)  # both tables and training
    assert all(row.endswith("| 1 |") for row in rows)


def test_a_missing_squad_file_is_one_line_error(tmp_path):
    (tmp_path / "train-v1.1.json").write_text("{}")
    proc = run_script("experiments/qg_minilm/qg_minilm.py", "--squad-dir", tmp_path, "--out", tmp_path / "out",
                      check=False)
    assert proc.returncode == 2 and "no dev-v1.1.json (expected SQuAD v1.1's" in proc.stderr.splitlines()[-1]
    assert "Traceback" not in proc.stderr
