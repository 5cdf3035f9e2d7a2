"""experiments/conll2003/conll2003.py end to end on CoNLL-format files of three entity types, fine-tuning the tiny
random BERT of test_hf_encoder: softmax, as_softmax and AS-Speed on one seed. Checks that every method saw the
same sentences, that AS-Speed took fewer updates for them, that each run's training time is its log's epochs and
the table's ratios those times', and that the tested checkpoint is the best validation's. With ``../shared/data``
and the packaged MiniLM, the prep of the real CoNLL-2003 is checked against its published statistics."""
from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, run_script
from measure import json_records, machine  # benchmarks/ (pyproject.toml's pytest pythonpath)
from test_hf_encoder import write_tiny_bert
from test_text_classification import NAMES, TEMPLATES, _conll

pytest.importorskip("transformers")
METHODS = ["softmax", "as_softmax", "as_softmax+as_speed"]
SHARED = ROOT.parent / "shared" / "data" / "conll2003"
MINILM = ROOT / "models" / "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("conll")
    rng = random.Random(4)
    for name, n in (("train.txt", 120), ("dev.txt", 30), ("test.txt", 30)):
        _conll(root / name, rng, n)
    words = sorted({w for text in [*TEMPLATES, *(n for names in NAMES.values() for n in names)] for w in text.split()
                    if not w.startswith("{")})
    out = root / "out"
    run_script("experiments/conll2003/conll2003.py", "--hf-model-dir", write_tiny_bert(root / "bert", words=words),
               "--data", root, "--out", out, "--epochs", "3", "--batch-size", "8", "--validate-every", "10",
               "--lr", "2e-3", "--seeds", "1", "--methods", *METHODS)
    return out


def records(out: Path) -> dict[str, dict]:
    return {m: json.loads((out / "work" / f"{m}-seed1" / "result.json").read_text()) for m in METHODS}


def test_every_method_sees_the_same_sentences_and_as_speed_takes_fewer_updates(experiment):
    runs = records(experiment)
    seen = {m: sum(float(r["bsz"]) for r in json_records((experiment / "work" / f"{m}-seed1" / "train.log")
                                                          .read_text(), "train_inner")) for m in METHODS}
    assert seen["softmax"] == 3 * 120 and len(set(seen.values())) == 1, seen
    assert {m: r["sentences_seen"] for m, r in runs.items()} == seen
    assert runs["as_softmax+as_speed"]["updates"] < runs["as_softmax"]["updates"] == runs["softmax"]["updates"]


def test_training_time_is_the_epochs_train_wall_and_the_table_gives_its_ratios(experiment):
    runs = records(experiment)
    for method, record in runs.items():
        log = (experiment / "work" / f"{method}-seed1" / "train.log").read_text()
        epochs = json_records(log, "train")
        assert len(epochs) == 3
        assert record["train_seconds"] == sum(float(r["train_wall"]) for r in epochs)
        assert record["load_before"] >= 0
    table = (experiment / "results.md").read_text().split("Training time")[1]
    row = next(line for line in table.splitlines() if line.startswith("| as_softmax+as_speed |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    seconds = {m: r["train_seconds"] for m, r in runs.items()}
    if seconds["softmax"] and seconds["as_softmax"]:  # whole seconds: a tiny run may take 0
        assert cells[2] == f"{seconds['as_softmax+as_speed'] / seconds['softmax']:.2f}"
        assert cells[3] == f"{seconds['as_softmax+as_speed'] / seconds['as_softmax']:.2f}"
    assert cells[4:] == [str(runs["as_softmax+as_speed"]["updates"]), "360"]


def test_table_only_makes_the_tables_of_the_finished_runs_and_trains_nothing(experiment, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(experiment, out)
    harness = ["experiments/conll2003/conll2003.py", "--hf-model-dir", experiment.parent / "bert", "--data",
               experiment.parent, "--out", out, "--table-only", "--seeds", "1", "2"]
    run_script(*harness, "--methods", *METHODS)
    assert sorted(p.name for p in (out / "work").glob("*-seed*")) == sorted(f"{m}-seed1" for m in METHODS)
    before, after = ((folder / "results.md").read_text().split("\n", 1) for folder in (experiment, out))
    assert "--table-only --seeds 1 2" in after[0] and after[1] == before[1], "the same runs, the same tables"
    rows = after[1].strip().split("\n\n")[0].splitlines()[2:]  # the first table, below its header
    assert len(rows) == len(METHODS) and all(row.endswith("| 1 |") for row in rows), "seed 1 alone"
    (out / "work" / "softmax-seed1" / "result.json").unlink()
    proc = run_script(*harness, "--methods", "softmax", "as_softmax", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert re.search(r"error: --table-only: no finished softmax run of seeds 1 2 in .*work; the table is relative "
                     r"to softmax$", proc.stderr.strip()), proc.stderr


def test_a_time_ratio_pairs_runs_by_seed():
    from classification_runs import time_ratio  # experiments/

    baseline = [{"seed": 1, "train_seconds": 100.0}, {"seed": 2, "train_seconds": 200.0}]
    runs = [{"seed": 2, "train_seconds": 100.0}, {"seed": 3, "train_seconds": 900.0}]
    assert time_ratio(runs, baseline) == "0.50", "seed 2 alone: seed 3 has no baseline, seed 1 no run"
    assert time_ratio(baseline, runs) == "2.00"
    assert time_ratio(runs, [{"seed": 2, "train_seconds": 0.0}]) == "–"
    assert time_ratio([*runs, {"seed": 1, "train_seconds": 50.0}], baseline) == "0.50"


def test_the_seconds_to_a_validation_score_pair_softmax_by_seed():
    from classification_runs import relative  # experiments/

    softmax = [{"seed": 1, "wall": 100.0}, {"seed": 2, "wall": 200.0}]
    runs = [{"seed": 2, "wall": 100.0}, {"seed": 3, "wall": 900.0}]
    seconds = lambda run: run["wall"]  # noqa: E731
    assert relative(runs, softmax, seconds) == "500 (2.00×)", "the mean of the runs; softmax's seed 2 over the run's"
    assert relative(softmax, softmax, seconds) == "150 (1.00×)"
    assert relative([{"seed": 1, "wall": 0.0}], softmax, seconds) == "0 (–)", "whole seconds: 0 in a tiny run"


def test_times_pair_only_runs_one_command_made():
    from classification_runs import time_ratio  # experiments/

    baseline = [{"seed": 1, "train_seconds": 100.0, "batch": "m 10:00"}, {"seed": 2, "train_seconds": 200.0,
                                                                        "batch": "m 10:00"}]
    runs = [{"seed": 1, "train_seconds": 50.0, "batch": "m 10:00"}, {"seed": 2, "train_seconds": 50.0,
                                                                    "batch": "m 14:00"}]
    assert time_ratio(runs, baseline) == "0.50", "seed 2's run was made by a later command, on the same machine"
    assert time_ratio(runs[1:], baseline) == "–"
    older = [{"seed": 1, "train_seconds": 300.0, "machine": "m"}]  # records that name only their machine
    assert time_ratio(older, [{"seed": 1, "train_seconds": 100.0, "machine": "m"}]) == "3.00"
    assert time_ratio(older, baseline) == "–"
    oldest = [{"seed": 1, "train_seconds": 400.0}]  # records that name neither
    assert time_ratio(oldest, [{"seed": 1, "train_seconds": 100.0}]) == "4.00"
    assert time_ratio(oldest, baseline) == time_ratio(oldest, older) == "–"


def test_the_runs_of_one_command_share_their_batch(experiment):
    batches = {record["batch"] for record in records(experiment).values()}
    assert len(batches) == 1, "one command made the fixture's runs"
    assert batches.pop().startswith(f"{machine()} "), "the batch names this machine, then the command's start"


def test_the_tested_checkpoint_is_the_best_validation_entity_f1(experiment):
    table = (experiment / "results.md").read_text()
    assert table.splitlines()[2].startswith("| method | test entity F1 | test accuracy | best valid entity F1 |")
    for method in METHODS:
        log = (experiment / "work" / f"{method}-seed1" / "train.log").read_text()
        scores = [float(r["entity_f1"]) for r in json_records(log, "valid")]
        best = json_records(log, "valid")[-1]["best_entity_f1"]  # fairseq's own record of the best checkpoint
        assert float(best) == max(scores)
        row = next(line for line in table.splitlines() if line.startswith(f"| {method} |"))
        assert re.split(r"\s*\|\s*", row)[4] == f"{max(scores):.2f}"  # one seed: its value, no spread


@pytest.mark.skipif(not (SHARED.is_dir() and MINILM.is_dir()),
                    reason="needs ../shared/data/conll2003 and models/all-MiniLM-L6-v2 (scripts/extract_minilm.py)")
def test_real_conll2003_prep_matches_the_published_statistics(tmp_path):
    """Tjong Kim Sang & De Meulder (2003), English: documents (each opened by a -DOCSTART- line), sentences, tokens
    and entities per type; MiniLM's tokenizer cuts no sentence."""
    run_script("data-prep/prepare_conll.py", tmp_path / "out", "--train", SHARED / "train.txt",
               "--valid", SHARED / "dev.txt", "--test", SHARED / "test.txt", "--hf-tokenizer", MINILM)
    summary = json.loads((tmp_path / "out" / "prep_summary.json").read_text())
    published = {"train": (946, 14_041, 203_621, {"LOC": 7140, "MISC": 3438, "ORG": 6321, "PER": 6600}),
                 "valid": (216, 3_250, 51_362, {"LOC": 1837, "MISC": 922, "ORG": 1341, "PER": 1842}),
                 "test": (231, 3_453, 46_435, {"LOC": 1668, "MISC": 702, "ORG": 1661, "PER": 1617})}
    for split, (documents, sentences, tokens, entities) in published.items():
        counts = summary["splits"][split]
        assert counts["edited"] == {"-DOCSTART- lines dropped": documents}
        assert counts["read"] == counts["written"] == summary["binarised_sentences"][split] == sentences
        assert summary["tokens"][split] == tokens and summary["entities"][split] == entities
        assert summary["truncated"][split] == 0
    assert summary["num_classes"] == 9


def test_missing_data_is_one_line_and_status_2(tmp_path):
    proc = run_script("experiments/conll2003/conll2003.py", "--hf-model-dir", write_tiny_bert(tmp_path / "bert"),
                      "--data", tmp_path / "none", "--out", tmp_path / "out", check=False)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"conll2003.py: error: {tmp_path / 'none' / 'train.txt'}, {tmp_path / 'none' / 'dev.txt'}, "
        f"{tmp_path / 'none' / 'test.txt'} not found: pass --data, the folder of train.txt, dev.txt, test.txt"]
