"""experiments/clinc150/clinc150.py end to end: a CLINC150-format file of four intents and ``oos``, the tiny
random BERT of test_hf_encoder fine-tuned for one epoch, two seeds of softmax and of T-softmax, whose temperature
is chosen on seed 1's validation. Checks the choice against the two candidates' own training logs, that seed 2
trained with the chosen value only, and that each run's test accuracy is its in-scope accuracy and oos recall
weighted by the test split's examples."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from conftest import run_script
from measure import json_records  # benchmarks/ (pyproject.toml's pytest pythonpath)
from test_hf_encoder import write_tiny_bert
from test_text_classification import FILLERS, TOPICS, _sentence

pytest.importorskip("transformers")
PER_INTENT = {"train": 40, "val": 10, "test": 10}  # and as many oos examples per split
TEMPERATURES = ["0.5", "2"]


def write_clinc_json(path: Path) -> None:
    rng = random.Random(3)
    data = {}
    for key, n in PER_INTENT.items():
        data[key] = [[_sentence(rng, [topic]), topic] for topic in sorted(TOPICS) for _ in range(n)]
        data[f"oos_{key}"] = [[" ".join(rng.sample(FILLERS, 4)), "oos"] for _ in range(n)]
    path.write_text(json.dumps(data), encoding="utf-8")


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("clinc")
    write_clinc_json(root / "data_full.json")
    out = root / "out"
    run_script("experiments/clinc150/clinc150.py", "--hf-model-dir", write_tiny_bert(root / "bert"),
               "--clinc-json", root / "data_full.json", "--out", out, "--epochs", "5", "--batch-size", "16",
               "--validate-every", "10", "--lr", "2e-3", "--seeds", "1", "2",
               "--methods", "softmax", "temperature_softmax")
    return out


def best_valid_accuracy(folder: Path) -> float:
    log = (folder / "train.log").read_text(encoding="utf-8")
    return max(float(r["accuracy"]) for r in json_records(log, "valid"))


def test_the_temperature_is_the_one_with_the_best_seed_1_validation(experiment):
    work = experiment / "work"
    reached = {t: best_valid_accuracy(work / f"temperature_softmax={t}-seed1") for t in TEMPERATURES}
    chosen = TEMPERATURES[0] if reached[TEMPERATURES[0]] >= reached[TEMPERATURES[1]] else TEMPERATURES[1]
    other = next(t for t in TEMPERATURES if t != chosen)
    assert (work / f"temperature_softmax={chosen}-seed2").is_dir()
    assert not (work / f"temperature_softmax={other}-seed2").exists()
    assert f"'softmax_temperature': {float(chosen)}" in (
        work / f"temperature_softmax={chosen}-seed2" / "train.log").read_text(encoding="utf-8")
    results = (experiment / "results.md").read_text(encoding="utf-8")
    assert f"| temperature_softmax --softmax-temperature {chosen} |" in results
    assert (f"- temperature_softmax --softmax-temperature: {TEMPERATURES[0]}: {reached[TEMPERATURES[0]]:.2f}, "
            f"{TEMPERATURES[1]}: {reached[TEMPERATURES[1]]:.2f} → {chosen}") in results
    rows = [r["method"] for r in json.loads((experiment / "runs.json").read_text())]
    assert rows == ["softmax"] * 2 + [f"temperature_softmax --softmax-temperature {chosen}"] * 2


def test_test_accuracy_is_in_scope_accuracy_and_oos_recall_weighted_by_their_examples(experiment):
    in_scope, oos = len(TOPICS) * PER_INTENT["test"], PER_INTENT["test"]
    folders = sorted((experiment / "work").glob("*-seed*"))
    assert len(folders) == 5  # softmax × 2 seeds, T-softmax: both values on seed 1, the chosen one on seed 2
    for folder in folders:
        scores = json.loads((folder / "result.json").read_text())
        weighted = (scores["test_in_scope_accuracy"] * in_scope + scores["test_out_of_scope_recall"] * oos)
        assert scores["test_accuracy"] == pytest.approx(weighted / (in_scope + oos), abs=0.01), folder.name
