"""``FusedTrainerLoss`` (``sparse_softmax.hf.fused``): on tiny random models built from configs (no download) of every
supported family, the loss and every parameter's gradient equal ``TrainerLoss`` on the model's own logits (and, for
cross-entropy, the model's own loss); evaluation, ``generate()`` and the saved weights are untouched; the
architectures and losses it cannot compute exactly are refused in one line; a ``Trainer`` run with it ends with the
weights a run with ``TrainerLoss`` ends with."""
from __future__ import annotations

import copy
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from sparse_softmax.hf import FusedTrainerLoss, LossScheduleCallback, TrainerLoss  # noqa: E402
from test_hf_adapters import _token_rows, _train  # noqa: E402

VOCAB = 97
SEQ2SEQ = ("t5", "bert2bert", "bart", "marian", "bart+bias")
SMALL = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1)


def model_of(family: str, seed: int = 0):
    """A tiny random model of ``family`` in float32, without dropout; "llama+bias", "bart+bias": with a bias in its
    output layer (which none of the families has, but a fine-tuned head may; BART's adds final_logits_bias to it)."""
    torch.manual_seed(seed)
    if family.endswith("+bias"):
        model = model_of(family.removesuffix("+bias"), seed)
        model.lm_head = torch.nn.Linear(16, VOCAB, bias=True)
        return model
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return transformers.GPT2LMHeadModel(config)
    if family in ("bert", "bert2bert"):
        def bert(decoder: bool):
            return transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                           intermediate_size=32, hidden_dropout_prob=0.0,
                                           attention_probs_dropout_prob=0.0, is_decoder=decoder,
                                           add_cross_attention=decoder and family == "bert2bert")
        if family == "bert":
            return transformers.BertLMHeadModel(bert(True))
        config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(bert(False), bert(True))
        config.decoder_start_token_id, config.pad_token_id = 1, 0
        return transformers.EncoderDecoderModel(config=config)
    if family in ("bart", "marian"):
        kind = {"bart": (transformers.BartConfig, transformers.BartForConditionalGeneration),
                "marian": (transformers.MarianConfig, transformers.MarianMTModel)}[family]
        config = kind[0](vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                         decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, dropout=0.0,
                         decoder_start_token_id=1, pad_token_id=0)
        model = kind[1](config)
        model.final_logits_bias.normal_()  # a checkpoint's (Marian's are not zero), which the fused layer must add
        return model
    if family == "t5":
        config = transformers.T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
                                       dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
        return transformers.T5ForConditionalGeneration(config)
    config = DECODER_CONFIGS[family]()
    return transformers.AutoModelForCausalLM.from_config(config)


#: decoder-only families by their configs, tiny; the soft-cap and the scales set so that they change the logits
DECODER_CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**SMALL),
    "mistral": lambda: transformers.MistralConfig(**SMALL, head_dim=8),
    "qwen2": lambda: transformers.Qwen2Config(**SMALL),
    "qwen3": lambda: transformers.Qwen3Config(**SMALL, head_dim=8),
    "gemma": lambda: transformers.GemmaConfig(**SMALL, head_dim=8),
    "gemma2": lambda: transformers.Gemma2Config(**SMALL, head_dim=8, final_logit_softcapping=0.5),
    "gemma3_text": lambda: transformers.Gemma3TextConfig(**SMALL, head_dim=8, final_logit_softcapping=0.5),
    "phi": lambda: transformers.PhiConfig(**SMALL),  # its output layer has a bias
    "phi3": lambda: transformers.Phi3Config(**SMALL, pad_token_id=None),
    "gpt_neox": lambda: transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2,
                                                   num_attention_heads=2, intermediate_size=32),
    "olmo": lambda: transformers.OlmoConfig(**SMALL),
    "olmo2": lambda: transformers.Olmo2Config(**SMALL),
    "olmo3": lambda: transformers.Olmo3Config(**SMALL),
    "starcoder2": lambda: transformers.Starcoder2Config(**SMALL),
    "falcon": lambda: transformers.FalconConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2,
                                                num_attention_heads=2, num_kv_heads=1),
    "opt": lambda: transformers.OPTConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2,
                                          num_attention_heads=2, ffn_dim=32, word_embed_proj_dim=16, dropout=0.0,
                                          max_position_embeddings=64),
    "granite": lambda: transformers.GraniteConfig(**SMALL, logits_scaling=4.0),
    "cohere": lambda: transformers.CohereConfig(**SMALL, logit_scale=3.0),
    "cohere2": lambda: transformers.Cohere2Config(**SMALL, head_dim=8, logit_scale=3.0),
}


def batch_of(family: str, seed: int = 1) -> tuple[dict, torch.Tensor]:
    """The model inputs and labels of a batch of 3 rows, some labels -100."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (3, 9), generator=g)
    seq2seq = family in SEQ2SEQ
    labels = torch.randint(3, VOCAB, (3, 9), generator=g) if seq2seq else ids.clone()
    labels[0, :3] = -100
    labels[2, -2:] = -100
    if seq2seq:  # the decoder reads the labels shifted right, as DataCollatorForSeq2Seq makes them
        decoder = torch.cat([torch.zeros(3, 1, dtype=torch.long), labels[:, :-1].clamp(min=0)], dim=1)
        return {"input_ids": ids, "decoder_input_ids": decoder}, labels
    return {"input_ids": ids}, labels


FAMILIES = [*DECODER_CONFIGS, "gpt2", "bert", "t5", "bert2bert", "bart", "marian"]
#: sparse_softmax's k is above the models' hidden size (16) and below their vocabulary (97): k is bounded by the latter
LOSSES = [("softmax", {"label_smoothing": 0.1}), ("sparse_softmax", {"k": 20}), ("as_softmax", {"delta": 0.05})]


@pytest.mark.parametrize("name, options", LOSSES, ids=[name for name, _ in LOSSES])
@pytest.mark.parametrize("family", [*FAMILIES, "llama+bias"])
def test_loss_and_every_gradient_equal_the_unfused_loss(family, name, options):
    model = model_of(family)
    assert_fused_equals_unfused(model, copy.deepcopy(model), family, name, options)


def assert_fused_equals_unfused(model, reference, family: str, name: str, options: dict) -> None:
    """The fused loss of ``model`` and the unfused loss of ``reference`` (a copy) on ``family``'s batch: equal loss,
    equal gradient of every trained parameter, equal counts."""
    inputs, labels = batch_of(family)
    items = 17
    fused = FusedTrainerLoss(model, name, **options)
    unfused = TrainerLoss(name, causal_lm=family not in SEQ2SEQ, **options)
    got = fused(model(**inputs), labels, items)
    want = unfused(reference(**inputs), labels, items)
    got.backward()
    want.backward()
    torch.testing.assert_close(got, want)
    trained = [(key, p, q) for (key, p), q in zip(model.named_parameters(), reference.parameters()) if p.requires_grad]
    assert trained
    for key, p, q in trained:
        if q.grad is None:  # a parameter the loss does not reach (BERT's pooler)
            assert p.grad is None, key
        else:
            torch.testing.assert_close(p.grad, q.grad, msg=key, rtol=1e-5, atol=1e-6)
    assert fused.totals.keys() == unfused.totals.keys()  # AS's rows and masked rows, sparse_softmax's flat slope
    for key, value in fused.totals.items():
        torch.testing.assert_close(value.double(), unfused.totals[key].double(), msg=key, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, options", LOSSES, ids=[name for name, _ in LOSSES])
def test_lora_with_a_trained_output_layer_and_new_tokens(name, options):
    """PEFT LoRA on q and v with the output layer trained in full (``modules_to_save``), after three new tokens
    (``resize_token_embeddings``): the fused layer trains PEFT's copy of the layer, with the unfused loss's gradients
    of every trained parameter (the adapters and the copy)."""
    peft = pytest.importorskip("peft")
    model = model_of("llama")
    model.resize_token_embeddings(VOCAB + 3)
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                       modules_to_save=["lm_head"], init_lora_weights=False))
    assert_fused_equals_unfused(model, copy.deepcopy(model), "llama", name, options)
    copy_ = model.base_model.model.lm_head.modules_to_save["default"]
    assert copy_.weight.grad is not None and copy_.weight.shape[0] == VOCAB + 3


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_gradient_checkpointing(family):
    model = model_of(family)
    reference = copy.deepcopy(model)
    for m in (model, reference):
        m.activation_checkpointing_enable()
    assert_fused_equals_unfused(model, reference, family, "sparse_softmax", {"k": 20})


@pytest.mark.parametrize("family, attribute", [("gemma2", "final_logit_softcapping"), ("granite", "logits_scaling"),
                                               ("cohere", "logit_scale")])
def test_the_models_transform_of_the_logits_is_back_after_every_forward(family, attribute):
    """A soft-capped or scaled model does nothing to the hidden state it hands over, and is itself again after the
    forward: in evaluation its logits are the unwrapped model's."""
    model = model_of(family)
    plain = copy.deepcopy(model)
    holder = model.config if attribute != "logit_scale" else model
    value = getattr(holder, attribute)
    FusedTrainerLoss(model, "softmax")
    inputs, _ = batch_of(family)
    hidden = model(**inputs).logits
    assert hidden.shape[-1] == 16 and getattr(holder, attribute) == value
    captured = []
    plain.get_output_embeddings().register_forward_hook(lambda module, args, out: captured.append(args[0]))
    plain(**inputs)
    torch.testing.assert_close(hidden, captured[0], msg="the hidden state, untransformed")
    model.eval()
    torch.testing.assert_close(model(**inputs).logits, plain.eval()(**inputs).logits)


def test_a_bias_of_the_output_layer_adds_to_final_logits_bias():
    """BART adds ``final_logits_bias`` to its output layer's logits, and a fine-tuned output layer may have a bias of
    its own: the fused layer scores with both, and the layer's bias gets its gradient."""
    model = model_of("bart+bias")
    reference = copy.deepcopy(model)
    inputs, labels = batch_of("bart+bias")
    got = FusedTrainerLoss(model, "softmax")(model(**inputs), labels, 17)
    want = TrainerLoss("softmax")(reference(**inputs), labels, 17)
    got.backward()
    want.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(model.lm_head.bias.grad, reference.lm_head.bias.grad)


@pytest.mark.filterwarnings("ignore:Version v4.12.0 introduces:FutureWarning")  # EncoderDecoderModel, labels given
@pytest.mark.parametrize("family", FAMILIES)
def test_cross_entropy_equals_the_models_own_loss(family):
    model = model_of(family)
    inputs, labels = batch_of(family)
    own = copy.deepcopy(model)(**inputs, labels=labels).loss  # the mean over the labelled tokens
    got = FusedTrainerLoss(model, "softmax")(model(**inputs), labels)  # no item count: the mean over the rows
    torch.testing.assert_close(got, own)


def test_evaluation_generation_and_the_weights_are_untouched():
    model = model_of("llama")
    plain = copy.deepcopy(model)
    loss = FusedTrainerLoss(model, "sparse_softmax", k=5)
    inputs, labels = batch_of("llama")
    assert model(**inputs).logits.shape[-1] == 16, "training with gradients: the hidden state is handed over"
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, plain.eval()(**inputs).logits)
        assert loss(model(**inputs), labels) == pytest.approx(float(TrainerLoss("sparse_softmax", k=5, causal_lm=True)(
            plain(**inputs), labels)), rel=1e-6)
    model.train()
    with torch.no_grad():  # evaluation in training mode scores logits too
        assert model(**inputs).logits.shape[-1] == VOCAB
    config = transformers.GenerationConfig(max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert model.generate(inputs["input_ids"], generation_config=config).tolist() == plain.generate(
        inputs["input_ids"], generation_config=config).tolist()
    assert model.state_dict().keys() == plain.state_dict().keys()


def test_a_bfloat16_hidden_state_is_scored_in_the_output_layers_dtype():
    """Under autocast (a Trainer's ``bf16=True``) a BERT decoder's prediction head hands a bfloat16 hidden state to
    its float32 output layer: the fused loss scores it in the layer's dtype, and its loss and the output layer's
    gradient are the unfused loss's up to bfloat16's precision."""
    model = model_of("bert")
    reference = copy.deepcopy(model)
    inputs, labels = batch_of("bert")
    fused = FusedTrainerLoss(model, "softmax")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = model(**inputs)
        got = fused(outputs, labels, 17)
        want = TrainerLoss("softmax", causal_lm=True)(reference(**inputs), labels, 17)
    assert outputs.logits.dtype == torch.bfloat16 and model.get_output_embeddings().weight.dtype == torch.float32
    got.backward()
    want.backward()
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=0)
    grads = [m.get_output_embeddings().weight.grad for m in (model, reference)]
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-2 * float(grads[1].abs().max()))


def _encoder_decoder(decoder):
    """An EncoderDecoderModel of a tiny BERT encoder and ``decoder`` (a config)."""
    encoder = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=32)
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    return transformers.EncoderDecoderModel(config=config)


def _llama_with_head(head):
    model = model_of("llama")
    model.lm_head = head
    return model


@pytest.mark.parametrize("make, message", [
    (lambda: transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)),
     "this BERT is not a decoder (is_decoder=False): a masked LM, which the fused loss does not train; use "
     "TrainerLoss"),
    (lambda: transformers.BloomForCausalLM(transformers.BloomConfig(vocab_size=VOCAB, hidden_size=16, n_layer=1,
                                                                    n_head=2)),
     "the fused output layer supports bart, bert, cohere, cohere2, encoder-decoder, falcon, gemma, gemma2, "
     "gemma3_text, gpt2, gpt_neox, granite, llama, marian, mbart, mistral, olmo, olmo2, olmo3, opt, pegasus, phi, "
     "phi3, qwen2, qwen3, starcoder2, t5, not 'bloom': use TrainerLoss"),
    (lambda: _encoder_decoder(transformers.RobertaConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        is_decoder=True, add_cross_attention=True)),
     "the fused output layer supports an encoder-decoder whose decoder is one of bert, falcon, gemma, gpt2, "
     "gpt_neox, llama, mistral, olmo, olmo2, olmo3, opt, phi, phi3, qwen2, qwen3, starcoder2, not 'roberta': use "
     "TrainerLoss"),
    (lambda: _llama_with_head(torch.nn.Sequential(torch.nn.Linear(16, VOCAB))),
     "llama's output layer is a Sequential, not an nn.Linear"),
])
def test_what_the_fused_layer_cannot_compute_exactly_is_refused(make, message):
    with pytest.raises(ValueError) as refused:
        FusedTrainerLoss(make(), "softmax")
    assert str(refused.value) == message


@pytest.mark.parametrize("name, options, message", [
    ("entmax15", {}, "the fused output layer computes softmax, sparse_softmax, as_softmax, not 'entmax15': use "
                     "TrainerLoss, which scores the logits"),
    ("softmax", {"causal_lm": False}, "FusedTrainerLoss takes causal_lm from the model's config"),
])
def test_losses_it_does_not_compute_are_refused(name, options, message):
    with pytest.raises(ValueError) as refused:
        FusedTrainerLoss(model_of("llama"), name, **options)
    assert str(refused.value) == message


@pytest.mark.parametrize("name, options", [("sparse_softmax", {"k": 4, "warmup_ratio": 0.5}),
                                           ("as_softmax", {"delta": 0.1, "anneal_ratio": 0.5})])
def test_a_trainer_run_ends_with_the_unfused_runs_weights(name, options, tmp_path):
    """Six updates with a schedule (sparse_softmax's warm-up hands over at the fourth; AS's δ anneals): the fused
    and the unfused loss train the same weights."""
    rows = [{"input_ids": ids, "labels": ids} for ids in _token_rows(8, 10, VOCAB)]
    models = {}
    for fused in (True, False):
        model = model_of("llama")
        loss = FusedTrainerLoss(model, name, **options) if fused else TrainerLoss(name, causal_lm=True, **options)
        logs, _ = _train(model, rows, loss, LossScheduleCallback(loss), steps=6, tmp_path=tmp_path / str(fused))
        models[fused] = (model, [r["loss"] for r in logs])
    (fused_model, fused_losses), (plain_model, plain_losses) = models[True], models[False]
    assert fused_losses == pytest.approx(plain_losses, rel=1e-4)
    for (key, p), q in zip(fused_model.named_parameters(), plain_model.parameters()):
        torch.testing.assert_close(p, q, msg=key, rtol=1e-4, atol=1e-6)


def test_the_benchmarks_table_and_plot(tmp_path):
    """benchmarks/hf_fused_speed.py on a tiny model: its table has a row for every variant, the first the baseline,
    and its plot is written."""
    import hf_fused_speed  # benchmarks/: pyproject.toml's pytest pythonpath

    from conftest import run_script

    run_script("benchmarks/hf_fused_speed.py", "--hidden", "32", "--vocab", "300", "--batch", "2", "--length", "12",
               "--repeats", "1", "--out", tmp_path / "speed")
    table = (tmp_path / "speed.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| H=32 V=300 \| (.+?) \| ([\d.]+) \| ([\d.]+) \|", table, flags=re.M)
    names = list(hf_fused_speed.variants(32, 300, 2, 2, 12, "cpu", torch.float32))
    assert [row[0] for row in rows] == names and float(rows[0][2]) == 1.0
    assert (tmp_path / "speed.png").stat().st_size > 0


def test_final_logits_bias_is_back_after_every_forward():
    """BART's forward adds a zero in place of final_logits_bias only while it hands the hidden state over; after it,
    and in evaluation, the buffer is the model's own (its logits the unwrapped model's)."""
    model = model_of("bart")
    plain = copy.deepcopy(model)
    FusedTrainerLoss(model, "softmax")
    model.to(torch.float64).to(torch.float32)  # as a Trainer moves a model after the loss is made: a new buffer
    bias = model.final_logits_bias
    inputs, _ = batch_of("bart")
    with torch.no_grad():  # an evaluation before any training forward (Trainer.evaluate() first)
        torch.testing.assert_close(model(**inputs).logits, plain(**inputs).logits)
    assert model.final_logits_bias is bias
    assert model(**inputs).logits.shape[-1] == 16 and model.final_logits_bias is bias
    with pytest.raises(RuntimeError):  # float token ids: the embedding fails inside the forward
        model(**{**inputs, "input_ids": inputs["input_ids"].float()})
    assert model.final_logits_bias is bias, "restored when the forward fails too"
    model.eval()
    torch.testing.assert_close(model(**inputs).logits, plain.eval()(**inputs).logits)
    assert torch.equal(model.state_dict()["final_logits_bias"], plain.state_dict()["final_logits_bias"])


def test_the_causal_lm_example_trains_by_the_fused_layer_as_the_unfused_loss(tmp_path):
    """examples/hf_causal_lm.py on the toy corpus with a tiny BERT made a decoder (its LM head fresh, said in one
    line): the test cross-entropy falls, every test text is continued, and the fused run ends where the unfused one
    does; a bad option is one line with exit status 2 before any work."""
    from conftest import run_script, skip_in_fast_tier
    from test_hf_encoder import write_tiny_bert

    skip_in_fast_tier("examples/hf_causal_lm.py")
    data = tmp_path / "toy"
    run_script("data-prep/make_toy_data.py", data, "--train", "64", "--valid", "4", "--test", "7")
    words = sorted(set((data / "train.tgt").read_text().split()) | set((data / "test.tgt").read_text().split()))
    bert = write_tiny_bert(tmp_path / "bert", 64, words)
    runs = {}
    for mode in ("fused", "unfused"):
        proc = run_script("examples/hf_causal_lm.py", tmp_path / mode, "--data", data, "--model", bert, "--loss",
                          "sparse_softmax", "--loss-option", "k=5", "--max-steps", "6", "--batch-size", "8", "--lr",
                          "3e-3", *(["--unfused"] if mode == "unfused" else []))
        runs[mode] = [float(x) for x in re.findall(r"test cross-entropy \w+ training: ([\d.]+)", proc.stdout)]
        assert ("fresh (parameters not in bert): cls.predictions.bias, cls.predictions.transform.LayerNorm, "
                "cls.predictions.transform.dense\n") in proc.stdout
        assert "MISSING" not in proc.stdout + proc.stderr, "transformers' table of them is not printed"
        assert len((tmp_path / mode / "samples.txt").read_text().splitlines()) == 7
    before, after = runs["fused"]
    assert after < before, runs
    assert runs["fused"] == pytest.approx(runs["unfused"], rel=1e-3), runs
    proc = run_script("examples/hf_causal_lm.py", tmp_path / "refused", "--data", data, "--model", bert,
                      "--loss-option", "k=abc", check=False)
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1] == (
        "hf_causal_lm.py: error: --loss sparse_softmax: sparse_softmax: k must be a whole number, got 'abc'")
    assert not (tmp_path / "refused").exists()
