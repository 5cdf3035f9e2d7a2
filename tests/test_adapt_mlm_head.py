"""scripts/adapt_mlm_head.py on a tiny random BERT: it trains the MLM head's transform and bias only (the encoder
and the tied word embeddings stay as they were), the held-out masked-LM loss falls, the folder it writes loads
with ``--arch hf_unilm`` as a checkpoint with a head, and bad input is one line with exit status 2."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch

from conftest import run_script
from test_hf_encoder import WHOLE, write_tiny_bert, write_tiny_roberta

transformers = pytest.importorskip("transformers")


def masked_lm(folder: Path):
    return transformers.AutoModelForMaskedLM.from_pretrained(folder, local_files_only=True)


def write_text(path: Path, count: int, empty: int = 0) -> Path:
    """``count`` lines of the tiny vocabulary's words in a fixed pattern (each word follows its neighbour), which
    a head that learns can predict, and ``empty`` empty lines among them."""
    rng = random.Random(0)
    rows = []
    for _ in range(count):
        start = rng.randrange(len(WHOLE) - 8)
        rows.append(" ".join(WHOLE[start:start + 8]))
    rows[3:3] = [""] * empty
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def adapted(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("adapt")
    bert = write_tiny_bert(root / "bert", head="ForMaskedLM")  # a head to compare with
    text = write_text(root / "train.txt", 300, empty=2)
    proc = run_script("scripts/adapt_mlm_head.py", bert, root / "out", "--text", text, "--steps", "60",
                      "--batch-size", "16", "--lr", "1e-2", "--valid-lines", "40", "--log-interval", "20")
    return {"bert": bert, "out": root / "out", "stdout": proc.stdout}


def test_only_the_head_is_trained(adapted):
    before, after = masked_lm(adapted["bert"]).state_dict(), masked_lm(adapted["out"]).state_dict()
    assert before.keys() == after.keys()
    head = [name for name in before if name.startswith("cls.")]
    assert {name for name in head if name.startswith("cls.predictions.transform.")} and "cls.predictions.bias" in head
    bias = {"cls.predictions.bias", "cls.predictions.decoder.bias"}  # one tensor, under both names
    for name in before:
        if name.startswith("cls.predictions.transform.") or name in bias:
            assert not torch.equal(before[name], after[name]), f"{name} was not trained"
        else:  # the encoder and the word embeddings (the decoder's weight is tied to them)
            assert torch.equal(before[name], after[name]), f"{name} changed"


def test_the_held_out_loss_falls_and_is_recorded(adapted):
    record = json.loads((adapted["out"] / "head_adaptation.json").read_text())
    assert record["after"]["loss"] < record["before"]["loss"] - 0.2
    assert record["lines"] == 300 and record["empty_lines_skipped"] == 2 and record["held_out_lines"] == 40
    assert [point["step"] for point in record["curve"]] == [20, 40, 60]
    assert "held-out masked-LM before: loss" in adapted["stdout"] and "step 60/60: masked-LM loss" in adapted["stdout"]


def test_a_checkpoint_without_a_head_gets_one_that_hf_unilm_loads(tmp_path):
    from user_dir.models.hf_unilm import load_masked_lm

    bert = write_tiny_bert(tmp_path / "bert")  # saved without an MLM head, as a sentence-embedding checkpoint
    text = write_text(tmp_path / "train.txt", 50)
    assert load_masked_lm(str(bert))[1] is False
    run_script("scripts/adapt_mlm_head.py", bert, tmp_path / "out", "--text", text, "--steps", "2",
               "--valid-lines", "5")
    model, pretrained_head = load_masked_lm(str(tmp_path / "out"))
    assert pretrained_head is True
    encoder = transformers.AutoModel.from_pretrained(bert, local_files_only=True).state_dict()
    for name, value in model.bert.state_dict().items():
        assert torch.equal(value, encoder[name]), name


def test_the_seed_fixes_a_new_heads_weights(tmp_path):
    """A checkpoint without a head gets one drawn as it loads: the same --seed gives the same adapted head."""
    bert = write_tiny_bert(tmp_path / "bert")
    text = write_text(tmp_path / "train.txt", 50)
    heads = []
    for run, seed in enumerate(["1", "1", "2"]):
        run_script("scripts/adapt_mlm_head.py", bert, tmp_path / f"out{run}", "--text", text, "--steps", "1",
                   "--valid-lines", "5", "--seed", seed)
        heads.append({name: value for name, value in masked_lm(tmp_path / f"out{run}").state_dict().items()
                      if name.startswith("cls.predictions.transform.dense.")})
    assert heads[0].keys() == heads[2].keys() and heads[0]
    for name in heads[0]:
        assert torch.equal(heads[0][name], heads[1][name]), f"{name}: seed 1 twice, two heads"
    assert not torch.equal(heads[0]["cls.predictions.transform.dense.weight"],
                           heads[2]["cls.predictions.transform.dense.weight"])


@pytest.mark.parametrize("case, message", [
    ("no model", r"nowhere: no config.json"),
    ("no text", r"--text .*missing.txt: no such file"),
    ("empty text", r"--text .*empty.txt: no non-empty line"),
    ("too few lines", r"--valid-lines 500: the --text files have only 50 non-empty lines"),
    ("roberta", r"a BERT checkpoint with a \[MASK\] token is expected .* this one is 'roberta'"),
    ("out not empty", r"out: not empty; pass --overwrite"),
    ("bad option", r"--steps: expected a positive number, got 0"),
])
def test_bad_input_is_one_line(tmp_path, case, message):
    bert = write_tiny_bert(tmp_path / "bert")
    text = write_text(tmp_path / "train.txt", 50)
    (tmp_path / "empty.txt").write_text("\n\n")
    model, out, extra = bert, tmp_path / "out", ["--valid-lines", "5"]
    if case == "no model":
        model = tmp_path / "nowhere"
    elif case == "no text":
        text = tmp_path / "missing.txt"
    elif case == "empty text":
        text = tmp_path / "empty.txt"
    elif case == "too few lines":
        extra = []
    elif case == "roberta":
        model = write_tiny_roberta(tmp_path / "roberta")
    elif case == "out not empty":
        out.mkdir()
        (out / "something").write_text("x")
    elif case == "bad option":
        extra += ["--steps", "0"]
    proc = run_script("scripts/adapt_mlm_head.py", model, out, "--text", text, *extra, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert re.search(message, proc.stderr.strip().splitlines()[-1]), proc.stderr
    if case != "out not empty":
        assert not out.exists() or not any(out.iterdir()), "a refused run writes nothing"
