"""The Hugging Face adapters (``sparse_softmax.hf``): the Trainer loss against Hugging Face's own loss and the core
functions; ``Trainer`` end to end for a few steps with each loss family on tiny random models built from configs
(causal LM, seq2seq, sequence and token classification, multi-label), the schedules and AS-Speed through the
callbacks; the ``generate()`` processors against the fairseq search on the same scores."""
from __future__ import annotations

import ast
import json
import math
import os
import re
import socket
import subprocess
import sys
import zlib

import pytest
import torch

transformers = pytest.importorskip("transformers")
from torch import nn  # noqa: E402
from transformers import (GenerationMixin, PretrainedConfig, PreTrainedModel, Trainer, TrainerCallback,  # noqa: E402
                          TrainingArguments)
from transformers.loss.loss_utils import ForCausalLMLoss  # noqa: E402
from transformers.modeling_outputs import CausalLMOutput  # noqa: E402

from conftest import logged  # noqa: E402
from sparse_softmax import losses  # noqa: E402
from sparse_softmax.schedules import next_accumulation  # noqa: E402
from sparse_softmax.hf import (ASSpeedCallback, LossScheduleCallback, SourceVocabularyMask, TopKRenormalise,  # noqa: E402
                               TrainerLoss)

VOCAB = 24


# ---------------------------------------------------------------- the loss on given outputs


def _outputs(*shape, seed=0):
    return {"logits": torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)}


def _labels(batch, length, vocab, seed=1):
    labels = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))
    labels[0, -2:] = -100  # padding, as the collators write it
    labels[1, :1] = -100
    return labels


def test_softmax_equals_hugging_faces_causal_lm_loss():
    outputs, labels = _outputs(3, 7, VOCAB), _labels(3, 7, VOCAB)
    items = (labels[:, 1:] != -100).sum()  # what the Trainer counts for a causal LM
    ours = TrainerLoss("softmax", causal_lm=True)(outputs, labels, items)
    assert ours == pytest.approx(ForCausalLMLoss(outputs["logits"], labels, VOCAB, num_items_in_batch=items).item())


@pytest.mark.parametrize("name, options", [("sparse_softmax", {"k": 5}), ("as_softmax", {"delta": 0.1}),
                                           ("taylor_softmax", {"order": 4}), ("entmax15", {})])
def test_a_loss_is_the_sum_over_labelled_rows_divided_by_the_batchs_items(name, options):
    outputs, labels = _outputs(3, 7, VOCAB), _labels(3, 7, VOCAB)
    logits, target = outputs["logits"].reshape(-1, VOCAB), labels.reshape(-1)
    core = {"sparse_softmax": losses.sparse_softmax_loss, "as_softmax": losses.as_softmax_loss,
            "taylor_softmax": losses.taylor_softmax_loss, "entmax15": losses.entmax15_loss}[name]
    expected = core(logits, target, **options, ignore_index=-100, reduction="sum") / 40
    assert TrainerLoss(name, **options)(outputs, labels, torch.tensor(40)) == pytest.approx(expected.item())
    # without a count (evaluation): the mean over the labelled rows
    mean = core(logits, target, **options, ignore_index=-100, reduction="mean")
    assert TrainerLoss(name, **options)(outputs, labels) == pytest.approx(mean.item())


def test_sparse_softmax_adds_up_the_flat_slope_of_labelled_rows_in_training_only():
    """mean(top k) − target logit, by brute force over every labelled row (fewer than the 256 sampled); nothing
    added without gradients (evaluation)."""
    outputs, labels = _outputs(3, 7, VOCAB), _labels(3, 7, VOCAB)
    loss = TrainerLoss("sparse_softmax", k=5)
    with torch.no_grad():
        loss(outputs, labels)
    assert loss.totals == {}
    loss(outputs, labels, torch.tensor(18))
    slopes = [sorted(z.tolist())[-5:] for z in outputs["logits"].reshape(-1, VOCAB)]
    slopes = [sum(top) / 5 - float(z[t]) for top, z, t in zip(slopes, outputs["logits"].reshape(-1, VOCAB),
                                                            labels.reshape(-1)) if t != -100]
    assert len(slopes) == 18 and int(loss.totals["slope_rows"]) == 18
    assert float(loss.totals["slope_sum"]) == pytest.approx(sum(slopes))


def test_sparse_softmax_warns_once_when_its_warmup_hands_over_a_model_flat_logits_beat(caplog):
    """Only at the first update after the warm-up, only in training, once."""
    logits = torch.arange(VOCAB, dtype=torch.float64).repeat(2, 1)
    low, high = torch.tensor([0, 1]), torch.tensor([VOCAB - 1, VOCAB - 2])  # the lowest logits, the highest
    loss = TrainerLoss("sparse_softmax", k=4, warmup_ratio=0.5)
    loss.max_update, loss.update = 10, 5
    with torch.no_grad():  # evaluation at the hand-over update, on a model that beats flat logits: not judged
        loss({"logits": logits}, high)
    for update in (4, 5, 5, 6):
        loss.update = update
        loss({"logits": logits}, low, torch.tensor(2))
    told = [r.getMessage() for r in caplog.records if "hands over" in r.getMessage()]
    assert len(told) == 1 and "at update 5 " in told[0]


def test_tuple_outputs_and_a_batch_of_one_row():
    """A model called with ``return_dict=False`` returns a tuple whose first element is the logits (it was given no
    labels); a batch with a single counted row has that row's loss, whatever padding surrounds it."""
    logits = torch.randn(1, 3, 7, dtype=torch.float64)
    labels = torch.tensor([[-100, 4, -100]])
    got = TrainerLoss("softmax")((logits, torch.zeros(1, 3, 5)), labels)
    assert got == pytest.approx(float(torch.nn.functional.cross_entropy(logits[0, 1:2], labels[0, 1:2])), rel=1e-12)


def test_multi_label_items_are_rows():
    logits = torch.randn(4, 6, dtype=torch.float64)
    labels = (torch.rand(4, 6) < 0.4).float()
    labels[:, 0] = 1.0
    loss = TrainerLoss("multilabel_softmax")({"logits": logits}, labels, torch.tensor(4 * 6 * 2))  # 8 rows counted
    total = losses.multilabel_categorical_crossentropy(logits, labels, "sum")
    assert loss == pytest.approx(total.item() / 8)
    # without a count (evaluation): the mean over the 4 rows
    assert TrainerLoss("multilabel_softmax")({"logits": logits}, labels) == pytest.approx(total.item() / 4)


@pytest.mark.parametrize("name, options, message", [
    ("nope", {}, "unknown loss 'nope'; one of: softmax, sparse_softmax, as_softmax, temperature_softmax, "
                 "soft_margin_softmax, am_softmax, taylor_softmax, sm_taylor_softmax, sparsemax, entmax15, "
                 "multilabel_softmax, as_multilabel"),
    ("sparse_softmax", {"delta": 0.3}, "sparse_softmax takes ['impl', 'k', 'label_smoothing', 'tiles'], not ['delta']"),
    ("am_softmax", {"k": 3}, "am_softmax takes ['margin', 'scale'], not ['k']"),
    ("as_multilabel", {"k": 3}, "as_multilabel takes ['delta'], not ['k']"),
    ("sparsemax", {"k": 3}, "sparsemax takes no options, not ['k']"),
    ("softmax", {"warmup_ratio": 0.1}, "softmax has no warm-up (warmup_ratio): as_multilabel, as_softmax, "
                                       "sparse_softmax have"),
    ("sparse_softmax", {"anneal_ratio": 0.5}, "sparse_softmax has no δ to anneal (anneal_ratio): as_multilabel, "
                                              "as_softmax have"),
    ("as_softmax", {"anneal_from": 0.5}, "anneal_from is where anneal_ratio starts: set anneal_ratio"),
    ("as_softmax", {"anneal_ratio": 0.5, "anneal_from": 0.2},
     "anneal_from 0.2 is below delta 0.3: the annealing only lowers delta, from anneal_from down to delta"),
    ("as_softmax", {"anneal_ratio": 0.5, "warmup_ratio": 0.1},
     "warmup_ratio and anneal_ratio: choose one (both start from a softmax-like delta)"),
])
def test_bad_loss_options(name, options, message):
    """The whole message: the options a loss takes, the losses that have a schedule, named as the user spells them."""
    with pytest.raises(ValueError) as refused:
        TrainerLoss(name, **options)
    assert str(refused.value) == message


def test_the_logged_ratios_are_those_of_the_batches_since_the_last_log():
    """LossScheduleCallback adds to the record being logged (history and printed line) AS's δ and masked share and
    sparse_softmax's flat slope over the rows trained since the previous log, as the core counts them."""
    from types import SimpleNamespace

    from sparse_softmax.diagnostics import flat_slope

    logits = torch.randn(2, 5, 9, dtype=torch.float64) * 3
    labels = torch.randint(0, 9, (2, 5))
    labels[1, 3:] = -100
    logits[0, 0, labels[0, 0]] += 20  # a row AS masks
    z, t = logits.reshape(-1, 9)[labels.reshape(-1) != -100], labels[labels != -100]
    for name, options in [("as_softmax", {"delta": 0.3}), ("sparse_softmax", {"k": 3})]:
        loss = TrainerLoss(name, **options)
        callback = LossScheduleCallback(loss)
        state = SimpleNamespace(log_history=[], global_step=0, max_steps=10)
        for _ in range(2):  # two batches, then a log; then a log with no batch since
            loss({"logits": logits}, labels)
        for second_log in range(2):
            state.log_history.append({"loss": 1.0})
            logs = {"loss": 1.0}
            callback.on_log(None, state, None, logs=logs)
            if second_log:
                want = {"loss": 1.0}
            elif name == "as_softmax":
                masked = int((losses.as_softmax(z, t, 0.3).n_masked))
                assert masked >= 1
                want = {"loss": 1.0, "as_delta": 0.3, "masked_ratio": round(masked / len(t), 4)}
            else:
                want = {"loss": 1.0, "flat_slope": round(float(flat_slope(z, t, 3).mean()), 4)}
            assert logs == state.log_history[-1] == want, (name, logged)


@pytest.mark.parametrize("k", [8, 9, 20])
def test_sparse_softmax_over_k_of_as_many_classes_is_softmax_and_says_so_once(k, caplog):
    """k ≥ the classes keeps every class: the loss is the softmax cross-entropy, said once; k one below is not."""
    logits = torch.randn(2, 5, 9, dtype=torch.float64) * 3
    labels = torch.randint(0, 9, (2, 5))
    loss = TrainerLoss("sparse_softmax", k=k)
    with caplog.at_level("WARNING", logger="sparse_softmax.hf.loss"):
        got = [loss({"logits": logits}, labels) for _ in range(2)]
    z, t = logits.reshape(-1, 9), labels.reshape(-1)
    want = losses.sparse_softmax_loss(z, t, min(k, 9)) / len(t)
    assert got[0] == got[1] == pytest.approx(float(want), rel=1e-12)
    said = logged(caplog, "sparse_softmax.hf.loss")
    assert said == ([f"sparse_softmax: k = {k} >= 9 classes keeps every class: this trains plain softmax "
                     "cross-entropy"] if k >= 9 else [])
    if k >= 9:
        assert float(want) == pytest.approx(float(torch.nn.functional.cross_entropy(z, t)), rel=1e-12)


def test_a_schedule_without_its_callback_is_refused():
    loss = TrainerLoss("sparse_softmax", warmup_ratio=0.5)
    with pytest.raises(RuntimeError, match="LossScheduleCallback"):
        loss(_outputs(2, 3, VOCAB), _labels(2, 3, VOCAB))


# ---------------------------------------------------------------- Trainer end to end


class _Batches(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


#: what the callbacks add to a training record
ADDED = {"as_delta", "masked_ratio", "flat_slope", "accum_steps"}


class _Record(TrainerCallback):
    """Micro-batches per update and the accumulation setting each update started with; the training records the
    progress printer is given (after the callbacks under test)."""

    def __init__(self):
        self.updates, self.micro, self.started_with, self.printed = [], 0, None, []

    def on_step_begin(self, args, state, control, **kwargs):
        self.started_with = args.gradient_accumulation_steps

    def on_substep_end(self, args, state, control, **kwargs):
        self.micro += 1

    def on_step_end(self, args, state, control, **kwargs):
        self.updates.append((self.micro + 1, self.started_with))
        self.micro = 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in logs:
            self.printed.append(dict(logs))


def _train(model, rows, loss, *callbacks, steps=12, batch=4, lr=3e-3, accumulation=1, epochs=None, tmp_path=None,
           trainer=Trainer):
    arguments = transformers.Seq2SeqTrainingArguments if trainer is transformers.Seq2SeqTrainer else TrainingArguments
    args = arguments(output_dir=str(tmp_path), per_device_train_batch_size=batch, learning_rate=lr,
                     max_steps=-1 if epochs else steps, num_train_epochs=epochs or 1, logging_steps=1,
                     gradient_accumulation_steps=accumulation, report_to="none", use_cpu=True, save_strategy="no",
                     disable_tqdm=True, seed=0, lr_scheduler_type="constant")
    record = _Record()
    runner = trainer(model=model, args=args, train_dataset=_Batches(rows), compute_loss_func=loss,
                     callbacks=[*callbacks, record])
    runner.train()
    logs = [r for r in runner.state.log_history if "loss" in r]
    for kept, printed in zip(logs, record.printed, strict=True):  # the printed line shows what the history keeps
        assert {key: printed.get(key) for key in kept.keys() & ADDED} == {key: kept[key] for key in kept.keys() & ADDED}
    return logs, record.updates


def _falls(logs):
    losses_ = [r["loss"] for r in logs]
    return sum(losses_[-3:]) / 3 < sum(losses_[:3]) / 3


def _token_rows(n, length, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (length,), generator=g) for _ in range(n)]


def test_causal_lm_trains_with_sparse_softmax_and_its_warmup(tmp_path, caplog):
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32,
                                                                 n_layer=2, n_head=2))
    rows = [{"input_ids": ids, "labels": ids} for ids in _token_rows(8, 10, VOCAB)]
    loss = TrainerLoss("sparse_softmax", k=4, causal_lm=True, warmup_ratio=0.5)
    seen = []

    class Phase(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(loss.update < 0.5 * loss.max_update)

    logs, _ = _train(model, rows, loss, LossScheduleCallback(loss), Phase(), tmp_path=tmp_path)
    assert seen == [True] * 6 + [False] * 6 and _falls(logs[:6])
    assert all(math.isfinite(r["flat_slope"]) for r in logs), "logged in the warm-up and after"
    # The hand-over batch (update 6) is judged whole, so the warning says what its logged loss says: the Trainer
    # divides by every label of the batch, of which the causal shift scores 9 in 10.
    bits = logs[6]["loss"] * 10 / 9 / math.log(2)
    told = [r.getMessage() for r in caplog.records if "hands over" in r.getMessage()]
    assert len(told) == (bits > 2.0)
    if told:
        assert float(re.search(r"scores ([0-9.]+) bits", told[0]).group(1)) == pytest.approx(bits, abs=0.01)


def test_seq2seq_trains_with_as_softmax_annealing_and_logs_delta(tmp_path, capsys):
    config = transformers.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=32, pad_token_id=1, bos_token_id=0,
                                     eos_token_id=2, decoder_start_token_id=2)
    model = transformers.BartForConditionalGeneration(config)
    # The Trainer gives the model no labels when it has a compute_loss_func: the batch carries the decoder's input
    # (as DataCollatorForSeq2Seq(tokenizer, model=model) writes it), or BART would read the source shifted there.
    rows = [{"input_ids": src, "labels": src.flip(0),
             "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(src.flip(0)[None])[0]}
            for src in _token_rows(8, 6, VOCAB, seed=3)]
    loss = TrainerLoss("as_softmax", delta=0.2, anneal_ratio=0.5)
    logs, _ = _train(model, rows, loss, LossScheduleCallback(loss), steps=10, tmp_path=tmp_path,
                     trainer=transformers.Seq2SeqTrainer)
    deltas = [r["as_delta"] for r in logs]  # the δ of each update: 1 − 0.8 · u / 5 for u < 5, then 0.2
    assert deltas == pytest.approx([1.0, 0.84, 0.68, 0.52, 0.36] + [0.2] * 5, abs=1e-4)
    assert all(0.0 <= r["masked_ratio"] <= 1.0 for r in logs) and _falls(logs)
    # the printed training lines (disable_tqdm: the Trainer prints each record's dict) say them too
    printed = [ast.literal_eval(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{'loss'")]
    assert len(printed) == len(logs)  # numbers printed to 4 significant digits
    for shown, kept in zip(printed, logs):
        assert [float(shown[key]) for key in ("as_delta", "masked_ratio")] == pytest.approx(
            [kept["as_delta"], kept["masked_ratio"]], rel=1e-3, abs=1e-4)


def _bert(**config):
    return transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=32, **config)


def _classes(ids, n):
    return int(ids[:3].sum()) % n  # a label the first tokens decide


@pytest.mark.parametrize("name, options", [("am_softmax", {"margin": 0.1, "scale": 5.0}),
                                           ("soft_margin_softmax", {"margin": 0.2}), ("sparsemax", {})])
def test_sequence_classification_trains(name, options, tmp_path):
    model = transformers.BertForSequenceClassification(_bert(num_labels=5))
    rows = [{"input_ids": ids, "labels": torch.tensor(_classes(ids, 5))} for ids in _token_rows(16, 8, VOCAB)]
    logs, _ = _train(model, rows, TrainerLoss(name, **options), steps=15, tmp_path=tmp_path)
    assert _falls(logs)


def test_token_classification_trains_with_taylor_softmax(tmp_path):
    model = transformers.BertForTokenClassification(_bert(num_labels=4))
    rows = []
    for ids in _token_rows(16, 8, VOCAB):
        labels = ids % 4
        labels[0] = -100  # e.g. a CLS position
        rows.append({"input_ids": ids, "labels": labels})
    logs, _ = _train(model, rows, TrainerLoss("taylor_softmax", order=2), steps=15, tmp_path=tmp_path)
    assert _falls(logs)


def test_multi_label_trains_with_as_multilabel(tmp_path):
    model = transformers.BertForSequenceClassification(_bert(num_labels=6, problem_type="multi_label_classification"))
    rows = []
    for ids in _token_rows(16, 8, VOCAB):
        labels = torch.zeros(6)
        labels[[int(ids[0]) % 6, int(ids[1]) % 6]] = 1.0
        rows.append({"input_ids": ids, "labels": labels})
    loss = TrainerLoss("as_multilabel", delta=0.5)
    logs, _ = _train(model, rows, loss, LossScheduleCallback(loss), steps=15, tmp_path=tmp_path)
    assert _falls(logs) and all(r["as_delta"] == 0.5 for r in logs)


def test_as_speed_accumulates_whole_updates_by_the_rule(tmp_path):
    """The classifier learns the data (the label is the first token's) within two epochs, so AS masks more and more
    rows and the accumulation rises. Each update's count is checked against the rule run on the logged masked
    shares, applied where the epoch's micro-batches reach a multiple of it."""
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(_bert(num_labels=3))
    rows = [{"input_ids": ids, "labels": torch.tensor(int(ids[0]) % 3)} for ids in _token_rows(48, 6, VOCAB)]
    loss = TrainerLoss("as_softmax", delta=0.3)
    logs, updates = _train(model, rows, loss, LossScheduleCallback(loss), ASSpeedCallback(loss, lam=1.0, max_steps=4),
                           epochs=4, batch=4, lr=1e-2, tmp_path=tmp_path)
    taken = [r["accum_steps"] for r in logs]
    assert taken == [micro for micro, _ in updates] and max(taken) == 4, taken
    wanted = applied = 1
    micro_in_epoch = 0
    for record, (micro, started) in zip(logs, updates):
        assert micro == min(applied, 12 - micro_in_epoch), (logs, updates)  # whole updates; the epoch's data is 12
        micro_in_epoch = (micro_in_epoch + micro) % 12
        n_rows = 4 * micro
        wanted = next_accumulation(wanted, n_rows, round(record["masked_ratio"] * n_rows), 1.0, 4)
        if micro_in_epoch % wanted == 0:
            applied = wanted
    assert len(updates) < 4 * 12, "AS-Speed took fewer updates than the 12 per epoch of one micro-batch each"


def test_as_speed_needs_an_as_loss_and_a_positive_rule():
    with pytest.raises(ValueError) as refused:
        ASSpeedCallback(TrainerLoss("softmax"))
    assert str(refused.value) == ("AS-Speed counts the samples AS masks: the loss must be one of ['as_multilabel', "
                                  "'as_softmax'], not softmax")
    for options, given in [({"lam": 0.0}, "0.0 and 8"), ({"max_steps": 0}, "1.0 and 0")]:
        with pytest.raises(ValueError) as refused:
            ASSpeedCallback(TrainerLoss("as_softmax"), **options)
        assert str(refused.value) == f"lam must be > 0 and max_steps >= 1, got {given}"
    ASSpeedCallback(TrainerLoss("as_softmax"), lam=0.5, max_steps=1)  # the smallest rule there is


# ---------------------------------------------------------------- generate() against the fairseq search


class _ScriptedConfig(PretrainedConfig):
    model_type = "sparse_softmax_scripted"


class _ScriptedLM(PreTrainedModel, GenerationMixin):
    """A decoder-only model whose next-token distribution after (source, generated prefix) is ``script``'s; the
    source is the (left-padded) prompt of ``prompt_len`` tokens."""

    config_class = _ScriptedConfig

    def __init__(self, config, script, prompt_len):
        super().__init__(config)
        self.script, self.prompt_len = script, prompt_len
        self.anchor = nn.Parameter(torch.zeros(()))  # a parameter, for generate()'s device and dtype

    def forward(self, input_ids, attention_mask=None, **kwargs):
        logits = torch.full((*input_ids.shape, self.config.vocab_size), -math.inf)
        for row, tokens in enumerate(input_ids.tolist()):
            source = tuple(t for t in tokens[: self.prompt_len] if t != self.config.pad_token_id)
            for token, p in self.script(source, tuple(tokens[self.prompt_len:])).items():
                logits[row, -1, token] = math.log(p)
        return CausalLMOutput(logits=logits)


def _script_ids(source: tuple[int, ...], prefix: tuple[int, ...], vocab: int = 10) -> dict[int, float]:
    """A fixed random distribution per (source, prefix) over ids 2..9 (EOS = 2): no EOS first, EOS certain after
    four tokens, so no hypothesis reaches a length limit (where the two searches end differently)."""
    if len(prefix) >= 4:
        return {2: 1.0}
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(zlib.crc32(repr((source, prefix)).encode())),
                         dtype=torch.float64)
    logits[[0, 1]] = -math.inf  # BOS and padding
    logits[2] += len(prefix) - 1 if prefix else -math.inf
    return {i: p for i, p in enumerate(logits.softmax(-1).tolist()) if p > 0}


@pytest.mark.parametrize("beam", [1, 2, 3])
@pytest.mark.parametrize("options", [{"decoding_topk": 1}, {"decoding_topk": 2}, {"decoding_topk": 4},
                                     {"source_vocab_mask": True}, {"decoding_topk": 2, "source_vocab_mask": True}])
def test_processors_give_the_fairseq_searchs_beams(beam, options):
    pytest.importorskip("fairseq")
    import scripted_model
    from test_masked_decoding import _decode

    d = scripted_model.dictionary()  # <s>=0 <pad>=1 </s>=2 <unk>=3 a..f=4..9: the ids the HF model uses

    def fairseq_script(source, prefix):
        probs = _script_ids(tuple(d.index(s) for s in source), tuple(d.index(s) for s in prefix))
        return {d[i]: p for i, p in probs.items()}

    sources = ["a b c", "d e", "f", "a c e f"]
    expected = _decode(fairseq_script, sources, options, beam=beam, nbest=beam, max_len_b=10)

    prompts = [[d.index(s) for s in source.split()] for source in sources]
    width = max(map(len, prompts))
    input_ids = torch.tensor([[1] * (width - len(p)) + p for p in prompts])
    processors = []
    if options.get("source_vocab_mask"):
        processors.append(SourceVocabularyMask(input_ids, pad_token_id=1, always_allowed=[2]))
    if options.get("decoding_topk"):
        processors.append(TopKRenormalise(options["decoding_topk"]))
    model = _ScriptedLM(_ScriptedConfig(vocab_size=len(d), bos_token_id=0, pad_token_id=1, eos_token_id=2),
                        _script_ids, prompt_len=width)
    out = model.generate(input_ids, attention_mask=(input_ids != 1).long(), num_beams=beam,
                         num_return_sequences=beam, do_sample=False, length_penalty=0.0, early_stopping=True,
                         max_new_tokens=10, use_cache=False, logits_processor=processors,
                         return_dict_in_generate=True, output_scores=True)
    for i, hypotheses in enumerate(expected):
        for j, (symbols, _, score) in enumerate(hypotheses):
            row = out.sequences[i * beam + j, width:].tolist()
            generated = row[: row.index(2) + 1]
            assert tuple(d[t] for t in generated) == symbols, (i, j)
            if beam > 1:
                got = out.sequences_scores[i * beam + j].item()
            else:  # greedy search keeps no sequence score: the sum of its steps' processed scores
                got = sum(out.scores[step][i, token].item() for step, token in enumerate(generated))
            assert got == pytest.approx(score, abs=1e-5), (i, j)


def test_topk_of_the_whole_vocabulary_changes_nothing():
    scores = torch.randn(6, VOCAB).log_softmax(-1)
    assert torch.equal(TopKRenormalise(VOCAB)(None, scores), scores)
    kept = TopKRenormalise(3)(None, scores)
    assert torch.allclose(kept.logsumexp(-1), torch.zeros(6), atol=1e-6) and ((kept > -math.inf).sum(-1) == 3).all()


def test_topk_refuses_a_k_below_one():
    with pytest.raises(ValueError) as refused:
        TopKRenormalise(0)
    assert str(refused.value) == "k must be >= 1, got 0"


def test_source_mask_refuses_a_batch_it_was_not_given():
    mask = SourceVocabularyMask(torch.tensor([[4, 5, 6], [6, 7, 8]]), pad_token_id=1)  # 2 sources of 3 tokens
    with pytest.raises(ValueError) as refused:
        mask(None, torch.zeros(3, 10))
    assert str(refused.value) == "3 rows of scores for 2 sources: give the processor the batch generate() was given"


# ---------------------------------------------------------------- the example


def test_the_example_fine_tunes_and_decodes_every_test_source(tmp_path):
    from conftest import run_script, skip_in_fast_tier
    from test_hf_encoder import write_tiny_bert

    skip_in_fast_tier("examples/hf_seq2seq.py")
    data = tmp_path / "toy"
    run_script("data-prep/make_toy_data.py", data, "--train", "64", "--valid", "4", "--test", "7")
    sources = (data / "test.src").read_text().splitlines()
    words = sorted(set((data / "train.src").read_text().split()) | set(" ".join(sources).split()))
    bert = write_tiny_bert(tmp_path / "bert", 64, words)  # every toy word one token
    example = ["examples/hf_seq2seq.py", tmp_path / "out", "--data", data, "--model", bert]
    proc = run_script(*example, "--loss", "as_softmax", "--loss-option", "delta=0.3", "--loss-option",
                      "warmup_ratio=0.5", "--max-steps", "4", "--batch-size", "8", "--beam", "3", "--decoding-topk", "2",
                      "--source-vocab-mask")
    assert ("fresh (the decoder's parameters not in bert): bert.encoder.layer.crossattention, cls.predictions.bias, "
            "cls.predictions.transform.LayerNorm, cls.predictions.transform.dense\n") in proc.stdout
    assert "MISSING" not in proc.stdout + proc.stderr and "corrupted" not in proc.stderr
    hypotheses = (tmp_path / "out" / "test.hyp").read_text().splitlines()
    assert len(hypotheses) == len(sources) == 7
    for hypothesis, source in zip(hypotheses, sources):  # the source mask: only the source's words
        assert set(hypothesis.split()) <= set(source.split()), (hypothesis, source)
    assert (tmp_path / "out" / "model" / "config.json").is_file()
    fused = tmp_path / "fused"  # the fused output layer, on the same BERT2BERT
    run_script(example[0], fused, *example[2:], "--fused", "--loss", "sparse_softmax", "--loss-option", "k=5",
               "--max-steps", "4", "--batch-size", "8", "--beam", "3")
    assert len((fused / "test.hyp").read_text().splitlines()) == 7

    proc = run_script(*example, "--fused", "--loss", "entmax15", check=False)
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1] == ("hf_seq2seq.py: error: --fused: the fused "
                                                                       "output layer computes softmax, sparse_softmax, "
                                                                       "as_softmax, not entmax15")
    proc = run_script(*example, "--loss-option", "k", check=False)
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1] == (
        "hf_seq2seq.py: error: --loss-option k: expected NAME=VALUE, e.g. k=10"), proc.stderr[-2000:]
    proc = run_script(*example, "--loss", "softmax", "--loss-option", "k=3", check=False)
    assert proc.returncode == 2 and "softmax takes ['label_smoothing'], not ['k']" in proc.stderr.splitlines()[-1]
    proc = run_script(*example[:1], tmp_path / "refused", *example[2:], "--loss-option", "k=abc", check=False)
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1] == (
        "hf_seq2seq.py: error: --loss sparse_softmax: sparse_softmax: k must be a whole number, got 'abc'")
    assert not (tmp_path / "refused").exists(), "refused before any work"


def test_a_batch_without_labels_is_refused_by_name():
    """A dataset without a 'labels' column reaches the loss as labels=None: the message says which column."""
    with pytest.raises(ValueError) as refused:
        TrainerLoss("as_softmax")(_outputs(2, 5, VOCAB), None)
    assert str(refused.value) == "as_softmax: the batch has no labels (the Trainer passes the 'labels' column)"


def test_a_causal_lms_outputs_without_causal_lm_are_refused():
    """Unshifted, each position would be trained to predict its own token."""
    outputs = CausalLMOutput(logits=_outputs(2, 5, VOCAB)["logits"])
    with pytest.raises(ValueError, match=r"causal LM's outputs \(CausalLMOutput\): pass causal_lm=True"):
        TrainerLoss("softmax")(outputs, _labels(2, 5, VOCAB))
    assert math.isfinite(TrainerLoss("softmax", causal_lm=True)(outputs, _labels(2, 5, VOCAB)))


@pytest.mark.parametrize("name, options, message", [
    ("sparse_softmax", {"k": "abc"}, "sparse_softmax: k must be a whole number, got 'abc'"),
    ("sparse_softmax", {"k": 2.5}, "sparse_softmax: k must be a whole number, got 2.5"),
    ("sparse_softmax", {"k": 0}, r"sparse_softmax: k must be in \[1, inf\], got 0"),
    ("as_softmax", {"delta": "x"}, "as_softmax: delta must be a number, got 'x'"),
    ("as_softmax", {"delta": 1.5}, r"as_softmax: delta must be in \[0, 1\], got 1.5"),
    ("sparse_softmax", {"warmup_ratio": 1.5}, r"sparse_softmax: warmup_ratio must be in \[0, 1\], got 1.5"),
    ("sparse_softmax", {"warmup_ratio": "0.5"}, "sparse_softmax: warmup_ratio must be a number, got '0.5'"),
    ("as_softmax", {"anneal_ratio": 1.5}, r"as_softmax: anneal_ratio must be in \[0, 1\], got 1.5"),
    ("as_softmax", {"anneal_ratio": 0.5, "anneal_from": 2.0}, r"as_softmax: anneal_from must be in \[0, 1\], got 2.0"),
    ("softmax", {"label_smoothing": True}, "softmax: label_smoothing must be a number, got True"),
])
def test_options_are_checked_when_the_loss_is_built(name, options, message):
    with pytest.raises(ValueError, match=message):
        TrainerLoss(name, **options)


@pytest.mark.parametrize("name, options", [("sparse_softmax", {"warmup_ratio": 0.5}),
                                           ("as_softmax", {"anneal_ratio": 0.5})])
def test_a_schedule_without_its_callback_is_refused_naming_it(name, options):
    """A warm-up or an annealing reads the update count that ``LossScheduleCallback`` gives the loss: without it,
    the first batch is refused."""
    with pytest.raises(RuntimeError) as refused:
        TrainerLoss(name, **options)(_outputs(3, 7, VOCAB), _labels(3, 7, VOCAB), torch.tensor(18))
    assert str(refused.value) == (f"{name}: a warm-up or annealing needs the update count: pass "
                                  "callbacks=[LossScheduleCallback(loss)] to the Trainer")


TWO_PROCESSES = """
import json, os, sys
import torch, transformers
from test_hf_adapters import VOCAB, _Batches, _bert, _Record, _token_rows
from sparse_softmax.hf import ASSpeedCallback, TrainerLoss

torch.manual_seed(0)
model = transformers.BertForSequenceClassification(_bert(num_labels=3))
rows = [{"input_ids": ids, "labels": torch.tensor(int(ids[0]) % 3)} for ids in _token_rows(96, 6, VOCAB)]
loss = TrainerLoss("as_softmax", delta=0.3)
args = transformers.TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=4, num_train_epochs=4,
                                      learning_rate=1e-2, logging_steps=1, report_to="none", use_cpu=True,
                                      save_strategy="no", disable_tqdm=True, seed=0, lr_scheduler_type="constant",
                                      ddp_backend="gloo")
record = _Record()
transformers.Trainer(model=model, args=args, train_dataset=_Batches(rows), compute_loss_func=loss,
                     callbacks=[ASSpeedCallback(loss, lam=1.0, max_steps=4), record]).train()
rank = int(os.environ["RANK"])
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as out:
    json.dump({"updates": record.updates, "rows": float(loss.totals["rows"])}, out)
"""


def test_as_speed_takes_the_same_steps_on_two_processes(tmp_path):
    """Each process sees its half of the data and masks its own rows; the rule runs on the counts summed over
    both, so both accumulate alike (a difference would hang their gradient all-reduce)."""
    from conftest import ROOT, skip_in_fast_tier

    skip_in_fast_tier("torchrun")
    (tmp_path / "two.py").write_text(TWO_PROCESSES)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(port), tmp_path / "two.py", tmp_path], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["updates"] == ranks[1]["updates"] and max(m for m, _ in ranks[0]["updates"]) > 1, ranks
    assert ranks[0]["rows"] == ranks[1]["rows"] == 4 * 96 / 2  # each its half of the rows, every epoch
