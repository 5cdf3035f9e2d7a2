"""--arch hf_unilm: UniLM-style seq2seq fine-tuning of a BERT checkpoint, through the real fairseq CLIs. The checkpoint
is a tiny random BERT written with save_pretrained (nothing is downloaded) whose vocabulary holds the toy corpus's
words, but for ten of them, which it spells in pieces.

Checked against Hugging Face's own BertModel: the model's output at a target position is BERT's output for a [MASK]
there, run on ``[CLS] source [SEP] target-so-far [MASK]`` under UniLM's attention mask (the source bidirectional,
the target causal) with UniLM's segment and position ids; decoding with the cache gives what recomputing the prefix
gives, beams reordered included. Then the data prep against the tokenizer, training with each loss family,
reloading, every decoding, and the refusals."""
from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest
import torch

from conftest import ROOT, json_logs, output_lines, run_cli, run_script
from test_hf_encoder import write_tiny_bert

transformers = pytest.importorskip("transformers")

N_TEST = 30
MAX_POSITIONS, MAX_TARGET = 40, 16
ROOM = MAX_POSITIONS - 3 - MAX_TARGET  # source tokens: CLS, SEP and the target's end take the other 3
DIGITS = [*"0123456789", *(f"##{d}" for d in "0123456789")]
TRAIN = ("--user-dir", ROOT / "user_dir", "--task", "sparse_seq2seq", "--arch", "hf_unilm",
         "--max-target-tokens", MAX_TARGET, "--cpu", "--optimizer", "adam", "--lr", "0.002", "--batch-size", "16",
         "--log-format", "json", "--log-interval", "1", "--seed", "3", "--no-epoch-checkpoints", "--num-workers", "0")


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("toy")
    run_script("data-prep/make_toy_data.py", root, "--layout", "harvard", "--train", "300", "--valid", "20",
               "--test", str(N_TEST), "--max-len", "16")
    return root


def toy_words(raw: Path) -> list[str]:
    text = (raw / "train" / "train.article.txt").read_text() + (raw / "train" / "train.title.txt").read_text()
    return sorted(set(text.split()))


@pytest.fixture(scope="module")
def bert(raw, tmp_path_factory) -> Path:
    """w20 ... w29 are not in its vocabulary: the tokenizer spells them w ##2 ##0 ..."""
    words = [w for w in toy_words(raw) if not w.startswith("w2")]
    return write_tiny_bert(tmp_path_factory.mktemp("hf") / "bert", MAX_POSITIONS, words + DIGITS)


@pytest.fixture(scope="module")
def data(raw, bert, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prep") / "giga"
    run_script("data-prep/prepare_gigaword.py", raw, out, "--hf-tokenizer", bert, "--max-target-tokens", MAX_TARGET)
    return out


def test_prep_writes_the_tokenizers_tokens_cut_to_fit_and_counted(raw, data, bert):
    tokenizer = transformers.AutoTokenizer.from_pretrained(bert)
    summary = json.loads((data / "prep_summary.json").read_text())
    assert summary["max_source_tokens"] == ROOM and summary["max_target_tokens"] == MAX_TARGET
    for split in ("train", "valid", "test"):
        for side, limit in (("src", ROOM), ("tgt", MAX_TARGET)):
            lines = (data / f"{split}.{side}").read_text().splitlines()
            pieces = [tokenizer.tokenize(line) for line in lines]
            assert (data / f"{split}.hf.{side}").read_text().splitlines() == [" ".join(p[:limit]) for p in pieces]
            assert summary["truncated"][f"{split}.{side}"] == sum(len(p) > limit for p in pieces)
    assert summary["truncated"]["train.src"] > 0, "some sources must be cut for the test to mean something"
    assert "##2" in (data / "train.hf.src").read_text(), "and some words spelt in pieces"
    # the references are the titles as read, whole
    assert (data / "test.ref").read_text() == (raw / "Giga" / "task1_ref0.txt").read_text()


FIXTURES = ROOT / "tests" / "fixtures"
SQUAD = ("--train-json", FIXTURES / "squad_train.json", "--dev-json", FIXTURES / "squad_dev.json")


SQUAD_POSITIONS = 96
SQUAD_ROOM = SQUAD_POSITIONS - 3 - MAX_TARGET


@pytest.fixture(scope="module")
def squad_bert(tmp_path_factory) -> Path:
    """A tiny BERT whose vocabulary has every other word of the SQuAD fixtures (the rest spelt in pieces)."""
    text = " ".join((FIXTURES / name).read_text() for name in ("squad_train.json", "squad_dev.json")).lower()
    words = sorted(set(re.findall(r"[a-z]+", text)))[::2]
    return write_tiny_bert(tmp_path_factory.mktemp("hf") / "squad-bert", SQUAD_POSITIONS, words + DIGITS)


def test_squad_passages_are_cut_around_the_answer_in_the_tokenizers_tokens(squad_bert, tmp_path):
    """Sources are the original text, the passage a window of it around the answer that fits with [SEP] and the
    answer in what the target leaves; targets are the questions as written; test.ref is Du et al.'s form."""
    run_script("data-prep/prepare_squad_qg.py", tmp_path / "hf", *SQUAD, "--hf-tokenizer", squad_bert,
               "--max-target-tokens", MAX_TARGET)
    run_script("data-prep/prepare_squad_qg.py", tmp_path / "ptb", *SQUAD, "--text-only")
    tokenizer = transformers.AutoTokenizer.from_pretrained(squad_bert)
    records = [(p["context"], qa) for article in json.loads((FIXTURES / "squad_train.json").read_text())["data"]
               for p in article["paragraphs"] for qa in p["qas"]]
    sources = (tmp_path / "hf" / "train.src").read_text().splitlines()
    assert len(sources) == len(records)
    cut = 0
    for source, (context, qa) in zip(sources, records):
        passage, _, answer = source.partition(" [SEP] ")
        assert answer == qa["answers"][0]["text"] and answer in passage and passage in context
        assert len(tokenizer.tokenize(source)) <= SQUAD_ROOM
        cut += passage != context
    assert cut > 0, "some passages must be cut for the test to mean something"
    summary = json.loads((tmp_path / "hf" / "prep_summary.json").read_text())
    assert summary["splits"]["train"]["edited"] == {f"passage cut to a {SQUAD_ROOM}-token window around the answer": cut}
    assert not Path(summary["hf_tokenizer"]).is_absolute()  # relative to the folder, as its other paths
    assert (tmp_path / "hf" / summary["hf_tokenizer"]).resolve() == Path(squad_bert).resolve()
    assert (tmp_path / "hf" / "train.tgt").read_text().splitlines() == [qa["question"] for _, qa in records]
    assert (tmp_path / "hf" / "test.ref").read_text() == (tmp_path / "ptb" / "test.ref").read_text()


@pytest.mark.parametrize("flags, message", [
    (("--separator", "<sep>"), "--separator <sep>: with --hf-tokenizer the separator is its tokenizer's [SEP]"),
    (("--max-source-tokens", "500"), f"--max-source-tokens 500: the model's {SQUAD_POSITIONS} positions leave room "
                                     f"for {SQUAD_POSITIONS - 3 - 64} source tokens beside a target of "
                                     "--max-target-tokens 64"),
    (("--max-target-tokens", "93"), "--max-target-tokens 93 leaves no room for a source in the model's "
                                    f"{SQUAD_POSITIONS} positions"),
])
def test_squad_prep_refuses_options_the_tokenizer_contradicts(flags, message, squad_bert, tmp_path):
    proc = run_script("data-prep/prepare_squad_qg.py", tmp_path / "out", *SQUAD, "--hf-tokenizer", squad_bert, *flags,
                      check=False)
    assert proc.returncode == 2 and message in proc.stderr.splitlines()[-1], proc.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def load_model(data: Path, folder: Path):
    import user_dir  # noqa: F401  (fairseq's registries)
    from fairseq.data import Dictionary

    from user_dir.models.hf_unilm import HFUniLMConfig, HFUniLMModel

    dictionary = Dictionary.load(str(data / "data-bin" / "dict.src.txt"))
    task = types.SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(0)
    model = HFUniLMModel.build_model(HFUniLMConfig(hf_model_dir=str(folder), max_target_tokens=MAX_TARGET), task)
    return model.eval(), dictionary


def batch(dictionary, rows: int = 3, source: int = 9, target: int = 6):
    """Random sources (left-padded, as fairseq batches them, with </s>) and targets (right-padded)."""
    g = torch.Generator().manual_seed(1)
    src = torch.randint(dictionary.nspecial, len(dictionary), (rows, source), generator=g)
    src[:, -1] = dictionary.eos()
    src[0, :4] = dictionary.pad()
    prev = torch.randint(dictionary.nspecial, len(dictionary), (rows, target), generator=g)
    prev[:, 0] = dictionary.eos()
    prev[1, -2:] = dictionary.pad()
    return src, prev


def test_a_target_position_is_berts_mask_under_the_unilm_attention_mask(data, bert):
    from user_dir.models.hf_encoder import hf_ids

    model, dictionary = load_model(data, bert)
    reference = transformers.BertModel.from_pretrained(bert).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(bert)
    to_hf = hf_ids(dictionary, tokenizer)
    src, prev = batch(dictionary)
    with torch.no_grad():
        features = model.decoder(prev, model.encoder(src), features_only=True)[0]
        for row in range(src.size(0)):
            source = [dictionary.bos(), *src[row][src[row].ne(dictionary.pad())].tolist()]
            for i in range(prev.size(1)):
                if i and prev[row, i] == dictionary.pad():
                    break  # padding predicts nothing
                ids = to_hf[torch.tensor(source + prev[row, 1:i + 1].tolist())].tolist() + [tokenizer.mask_token_id]
                n, s = len(ids), len(source)
                allowed = torch.zeros(n, n, dtype=torch.bool)
                allowed[:, :s] = True  # everyone sees the source; the source sees only itself
                allowed[s:, s:] = torch.ones(n - s, n - s, dtype=torch.bool).tril()
                hidden = reference(input_ids=torch.tensor([ids]), attention_mask=allowed[None, None],
                                   token_type_ids=torch.tensor([[0] * s + [1] * (n - s)]),
                                   position_ids=torch.arange(n)[None]).last_hidden_state[0, -1]
                torch.testing.assert_close(features[row, i], model.decoder.head(hidden), rtol=1e-5, atol=1e-5)


def test_cached_decoding_gives_what_recomputing_gives(data, bert):
    """Step by step with the key/value cache, the beams reordered between steps (as beam search does), against
    the whole prefix recomputed for the reordered rows."""
    model, dictionary = load_model(data, bert)
    src, prev = batch(dictionary, rows=4)
    prev[1, -2:] = dictionary.index("the")  # no padding inside a prefix being decoded
    encoder_out, state, order = model.encoder(src), {}, torch.arange(src.size(0))
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for step in range(prev.size(1)):
            if step:  # reorder the beams
                new_order = torch.randperm(src.size(0), generator=g)
                encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
                model.decoder.reorder_incremental_state(state, new_order)
                order = order[new_order]
            cached = model.get_normalized_probs(model.decoder(prev[order, :step + 1], encoder_out, state), True)
            full = model.get_normalized_probs(model.decoder(prev[order, :step + 1], model.encoder(src[order])), True)
            torch.testing.assert_close(cached[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head", ["Model", "ForMaskedLM"])
def test_the_mlm_head_is_the_checkpoints_when_it_has_one(head, data, raw, tmp_path, caplog):
    folder = write_tiny_bert(tmp_path / head, MAX_POSITIONS, [w for w in toy_words(raw) if not w.startswith("w2")]
                             + DIGITS, head=head)
    with caplog.at_level("INFO"):
        model, _ = load_model(data, folder)
    saved = transformers.BertForMaskedLM.from_pretrained(folder).cls.predictions.transform.dense.weight
    if head == "ForMaskedLM":
        assert "hf_unilm: the checkpoint MLM head transform" in caplog.text
        torch.testing.assert_close(model.decoder.head.dense.weight, saved)
    else:
        assert "hf_unilm: a fresh (randomly initialised) MLM head transform" in caplog.text


# ----------------------------------------------------------------- through the CLIs

LOSSES = {
    "cross_entropy": ["--criterion", "cross_entropy"],
    "label_smoothed": ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"],
    "sparse_softmax": ["--criterion", "sparse_softmax", "--sparse-topk", "5"],
    "sparse_softmax+warmup": ["--criterion", "sparse_softmax", "--sparse-topk", "5", "--sparse-warmup-ratio", "0.5"],
    "as_softmax+warmup": ["--criterion", "as_softmax", "--as-delta", "0.3", "--as-warmup-ratio", "0.5"],
}
UPDATES = 20


def train(data, bert, save_dir, *flags, updates=UPDATES, check=True):
    return run_cli("fairseq-train", data / "data-bin", *TRAIN, "--hf-model-dir", bert, *flags,
                   "--max-update", str(updates), "--save-dir", save_dir, check=check)


@pytest.fixture(scope="module")
def trained(data, bert, tmp_path_factory) -> dict[str, tuple[Path, list[dict]]]:
    """Each loss's save folder and training logs."""
    runs = {}
    for name, flags in LOSSES.items():
        save_dir = tmp_path_factory.mktemp(name)
        runs[name] = save_dir, json_logs(train(data, bert, save_dir, *flags), "train_inner")
    return runs


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_each_loss_trains(loss, trained):
    _, logs = trained[loss]
    assert [int(r["num_updates"]) for r in logs] == list(range(1, UPDATES + 1))
    nll = [float(r.get("nll_loss", r["loss"])) for r in logs]  # fairseq's cross_entropy logs its loss only
    assert sum(nll[-5:]) < sum(nll[:5]), f"nll did not decrease: {nll}"
    if "warmup" in loss:
        key, warm, after = ("sparse_warmup", 1, 0) if loss.startswith("sparse") else ("as_delta", 1, 0.3)
        assert [float(r[key]) for r in logs] == [warm] * (UPDATES // 2) + [after] * (UPDATES // 2)


DECODINGS = {"plain beam": [], "top-k": ["--decoding-topk", "6"], "source vocab": ["--source-vocab-mask"]}


@pytest.mark.parametrize("decoding", sorted(DECODINGS))
def test_the_checkpoint_reloads_and_decodes_every_test_sentence(decoding, trained, data):
    """fairseq-generate reloads the fine-tuned checkpoint (the folder's config and tokenizer read again) and
    decodes with the task's beam searches; hypotheses stop within the model's positions."""
    save_dir, _ = trained["sparse_softmax+warmup"]
    gen = run_cli("fairseq-generate", data / "data-bin", "--user-dir", ROOT / "user_dir", "--task", "sparse_seq2seq",
                  "--path", save_dir / "checkpoint_last.pt", "--cpu", "--beam", "3", "--batch-size", "7",
                  "--gen-subset", "test", *DECODINGS[decoding])
    hypotheses = output_lines(gen.stdout, "H")
    assert sorted(hypotheses) == list(range(N_TEST))
    assert all(len(h[0][1].split()) <= MAX_TARGET for h in hypotheses.values())
    if decoding == "source vocab":
        sources = output_lines(gen.stdout, "S")
        for i, ((_, hypothesis),) in hypotheses.items():
            assert set(hypothesis.split()) <= set(sources[i][0][0].split()), (hypothesis, sources[i])


@pytest.mark.parametrize("topk", [0, 6])
def test_beam_search_with_the_cache_finds_what_recomputing_finds(topk, trained, data):
    """fairseq's generator with the decoder's cache, and with the prefix recomputed at every step (as for a decoder
    without one): the same hypotheses and scores for every test sentence, beams reordered at every step."""
    import argparse

    from fairseq import checkpoint_utils

    save_dir, _ = trained["cross_entropy"]
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(save_dir / "checkpoint_last.pt")], arg_overrides={"data": str(data / "data-bin"), "decoding_topk": topk})
    task.load_dataset("test")
    batches = list(task.get_batch_iterator(task.dataset("test"), max_sentences=8).next_epoch_itr(shuffle=False))
    found = []
    for cached in (True, False):
        generator = task.build_generator(models, argparse.Namespace(beam=4, max_len_b=MAX_TARGET))
        generator.model.has_incremental = cached
        with torch.no_grad():
            found.append({int(i): (h[0]["tokens"].tolist(), h[0]["score"].item()) for b in batches
                          for i, h in zip(b["id"], task.inference_step(generator, models, b))})
    assert sorted(found[0]) == list(range(N_TEST))
    for i, (tokens, score) in found[0].items():
        assert found[1][i][0] == tokens and found[1][i][1] == pytest.approx(score, abs=1e-5)


def test_validate_interactive_and_a_resumed_run(trained, data, bert):
    save_dir, _ = trained["as_softmax+warmup"]
    valid = run_cli("fairseq-validate", data / "data-bin", "--user-dir", ROOT / "user_dir", "--task", "sparse_seq2seq",
                    "--path", save_dir / "checkpoint_last.pt", "--cpu", "--batch-size", "8")
    assert "valid on 'valid' subset" in valid.stdout + valid.stderr
    lines = (data / "test.hf.src").read_text().splitlines()[:3]
    interactive = run_cli("fairseq-interactive", data / "data-bin", "--user-dir", ROOT / "user_dir", "--task",
                          "sparse_seq2seq", "--path", save_dir / "checkpoint_last.pt", "--cpu", "--beam", "2",
                          "--source-lang", "src", "--target-lang", "tgt", "--decoding-topk", "4",
                          input="\n".join(lines) + "\n")
    assert len(output_lines(interactive.stdout, "H")) == 3
    resumed = json_logs(train(data, bert, save_dir, *LOSSES["as_softmax+warmup"], updates=UPDATES + 4), "train_inner")
    assert [int(r["num_updates"]) for r in resumed] == list(range(UPDATES + 1, UPDATES + 5))


def test_the_fused_output_layer_logs_what_the_plain_one_does(data, bert, tmp_path):
    flags = LOSSES["sparse_softmax+warmup"]  # the same seed: the same dropout in both
    plain = json_logs(train(data, bert, tmp_path / "plain", *flags, updates=4), "train_inner")
    fused = json_logs(train(data, bert, tmp_path / "fused", *flags, "--fused-output-layer", updates=4), "train_inner")
    for a, b in zip(plain, fused, strict=True):
        for key in ("loss", "nll_loss", "sparse_warmup"):
            assert float(a[key]) == pytest.approx(float(b[key]), abs=2e-3), (key, a, b)


def test_bf16_training_fused_and_its_checkpoint_decodes(data, bert, tmp_path):
    """fairseq-train --bf16 (the model in bfloat16, fp32 master weights; on the CPU here, as on a GPU)."""
    logs = json_logs(train(data, bert, tmp_path, *LOSSES["as_softmax+warmup"], "--bf16", "--fused-output-layer",
                           updates=6), "train_inner")
    assert len(logs) == 6 and all(float(r["loss"]) == float(r["loss"]) < 100 for r in logs)  # finite
    gen = run_cli("fairseq-generate", data / "data-bin", "--user-dir", ROOT / "user_dir", "--task", "sparse_seq2seq",
                  "--path", tmp_path / "checkpoint_last.pt", "--cpu", "--bf16", "--beam", "3", "--batch-size", "16",
                  "--gen-subset", "test", "--decoding-topk", "6")
    assert sorted(output_lines(gen.stdout, "H")) == list(range(N_TEST))


# ----------------------------------------------------------------- refusals

def refused(proc, message: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors and message in errors[-1], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_a_missing_checkpoint_folder(data, tmp_path):
    proc = train(data, tmp_path / "nowhere", tmp_path / "save", check=False)
    refused(proc, f"--hf-model-dir {tmp_path / 'nowhere'}: no config.json there")
    assert not list((tmp_path / "save").glob("*.pt"))


def test_a_checkpoint_that_is_not_bert(data, tmp_path):
    from test_hf_encoder import write_tiny_roberta

    proc = train(data, write_tiny_roberta(tmp_path / "roberta"), tmp_path / "save", check=False)
    refused(proc, "--arch hf_unilm takes a BERT checkpoint (BERT, MiniLM: config model_type 'bert'); this one is "
                  "'roberta'")
    assert not list((tmp_path / "save").glob("*.pt"))


def test_data_from_another_tokenizer(toy_data, bert, tmp_path):
    """The conftest corpus is binarised from its words, which this tokenizer partly spells in pieces."""
    proc = run_cli("fairseq-train", toy_data, *TRAIN, "--hf-model-dir", bert, "--criterion", "cross_entropy",
                   "--max-update", "2", "--save-dir", tmp_path, check=False)
    refused(proc, "are not in the tokenizer's vocabulary: prepare the data with --hf-tokenizer and the same folder")
    assert not list(tmp_path.glob("*.pt"))


def test_an_over_long_example_is_refused_or_skipped_and_counted(data, bert, tmp_path):
    """A model given a longer target than the data was prepared for leaves less room for the source."""
    flags = ["--criterion", "cross_entropy", "--max-target-tokens", "24"]
    longest_source = MAX_POSITIONS - 1 - 25  # the CLS and the target's 25 positions taken
    proc = train(data, bert, tmp_path, *flags, updates=2, check=False)
    refused(proc, f"examples of valid are longer than the model takes (source, target tokens at most "
                  f"({longest_source}, 25)")
    assert not list(tmp_path.glob("*.pt"))
    skipped = train(data, bert, tmp_path, *flags, "--skip-invalid-size-inputs-valid-test", updates=2)
    counts = [int(n.replace(",", "")) for n in re.findall(r"([\d,]+) samples have invalid sizes and will be skipped",
                                                           skipped.stdout + skipped.stderr)]
    sources = [len(line.split()) + 1 for line in (data / "valid.hf.src").read_text().splitlines()]
    assert sum(n > longest_source for n in sources) in counts and len(counts) == 2  # train and valid, each counted


def test_a_target_budget_the_checkpoint_cannot_hold(data, bert, tmp_path):
    proc = train(data, bert, tmp_path, "--criterion", "cross_entropy", "--max-target-tokens", "45", check=False)
    refused(proc, f"--max-target-tokens 45 leaves no room for a source in the checkpoint's {MAX_POSITIONS} positions")
