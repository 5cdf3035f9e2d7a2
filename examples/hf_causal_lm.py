"""Train a Hugging Face causal LM with Sparse-softmax (or softmax, as_softmax) by the fused output layer
(``FusedTrainerLoss``): the loss and its gradients from the last hidden state, never the logits.

    python examples/hf_causal_lm.py out/lm --data data/toy-hf --model models/all-MiniLM-L6-v2 \\
        --loss sparse_softmax --loss-option k=10 --max-steps 300

``--data`` holds ``train.tgt`` and ``test.tgt``, one text a line. ``--model`` is a causal LM's checkpoint folder
(GPT-2, Llama, Qwen, ...; ``save_pretrained``) or a BERT-style one, made a decoder (``BertLMHeadModel``, which attends
to the left only); what the checkpoint lacks (a BERT encoder's LM head) starts fresh, said in one line. It prints the
test texts' cross-entropy per token (nats, the full softmax of the logits, in evaluation) before and after training,
and writes the greedy continuation of each test text's first three tokens to ``OUT/samples.txt``. ``--unfused``
trains the same loss from the logits (``TrainerLoss``), to compare.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import transformers
from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer,
                          TrainingArguments)

from sparse_softmax.hf import FusedTrainerLoss, LossScheduleCallback, TrainerLoss
from sparse_softmax.hf.fused import FUSED_LOSSES
from sparse_softmax.userinput import UserInputError, exit_on_error

from hf_seq2seq import add_loss_arguments, loss_options, quietly, say_fresh  # examples/, beside this one


def read_texts(path: Path) -> list[str]:
    if not path.is_file():
        raise UserInputError(f"{path}: not found (--data needs train.tgt and test.tgt)")
    return path.read_text(encoding="utf-8").splitlines()


def load_model(folder: Path):
    """The checkpoint as a causal LM; one line names the parameters it lacks, which start fresh."""
    model, info = quietly(lambda: AutoModelForCausalLM.from_pretrained(folder, is_decoder=True,
                                                                        output_loading_info=True))
    say_fresh(model, info, folder)
    return model


def test_cross_entropy(model, tokenizer, texts: list[str], batch: int = 32) -> float:
    """Nats per predicted token of ``texts``, from the logits' full softmax."""
    model.eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(texts), batch):
            encoded = tokenizer(texts[start:start + batch], padding=True, return_tensors="pt")
            labels = encoded["input_ids"].masked_fill(encoded["attention_mask"] == 0, -100)
            logits = model(**encoded).logits[:, :-1]
            target = labels[:, 1:]
            total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten(),
                                                             ignore_index=-100, reduction="sum"))
            tokens += int((target != -100).sum())
    model.train()
    return total / tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="output folder: the trained model and samples.txt")
    parser.add_argument("--data", type=Path, required=True, help="folder with train.tgt and test.tgt")
    parser.add_argument("--model", type=Path, required=True, help="checkpoint folder (save_pretrained)")
    add_loss_arguments(parser, FUSED_LOSSES)
    parser.add_argument("--unfused", action="store_true", help="the loss from the logits (TrainerLoss), to compare")
    parser.add_argument("--max-steps", type=int, default=300, help="training updates")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens a text is cut to")
    args = parser.parse_args(argv)
    with exit_on_error(parser):
        run(args)


def run(args: argparse.Namespace) -> None:
    options = loss_options(args.loss_option)
    try:
        loss = TrainerLoss(args.loss, causal_lm=True, **options)  # checks the options before any work
    except ValueError as error:
        raise UserInputError(f"--loss {args.loss}: {error}") from None
    train, test = (read_texts(args.data / f"{split}.tgt") for split in ("train", "test"))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:  # GPT-2's has none: padding is masked out of the loss anyway
        tokenizer.pad_token = tokenizer.eos_token
    transformers.set_seed(1)  # what starts fresh starts alike in every run
    model = load_model(args.model)
    if not args.unfused:
        try:
            loss = FusedTrainerLoss(model, args.loss, **options)
        except ValueError as error:
            raise UserInputError(f"--model {args.model}: {error}") from None
    print(f"test cross-entropy before training: {test_cross_entropy(model, tokenizer, test):.4f} nats a token")
    rows = [{"input_ids": ids} for ids in tokenizer(train, truncation=True, max_length=args.max_tokens)["input_ids"]]
    training = TrainingArguments(
        output_dir=str(args.out / "trainer"), max_steps=args.max_steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, warmup_steps=max(1, args.max_steps // 10), lr_scheduler_type="linear",
        logging_steps=max(1, args.max_steps // 20), save_strategy="no", report_to="none", seed=1)
    Trainer(model=model, args=training, train_dataset=rows, compute_loss_func=loss,
            data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),  # labels: the ids, padding -100
            callbacks=[LossScheduleCallback(loss)]).train()
    print(f"test cross-entropy after training: {test_cross_entropy(model, tokenizer, test):.4f} nats a token")
    model.save_pretrained(args.out / "model")
    tokenizer.save_pretrained(args.out / "model")
    samples = continuations(model, tokenizer, test)
    (args.out / "samples.txt").write_text("".join(s + "\n" for s in samples), encoding="utf-8")
    print(f"{len(samples)} continuations of {len(test)} test texts: {args.out / 'samples.txt'}")


def continuations(model, tokenizer, texts: list[str], prompt: int = 3, new: int = 12) -> list[str]:
    """Greedy continuation of each text's first ``prompt`` tokens (special ones included)."""
    model.eval()
    out = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt")["input_ids"][:, :prompt]
            generated = model.generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=tokenizer.pad_token_id)
            out.append(tokenizer.decode(generated[0], skip_special_tokens=True))
    return out


if __name__ == "__main__":
    main()
