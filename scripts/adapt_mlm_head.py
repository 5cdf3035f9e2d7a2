#!/usr/bin/env python
"""Give a BERT checkpoint without a masked-LM head (a sentence-embedding encoder such as the packaged MiniLM) a
head that ranks the vocabulary, before it is fine-tuned with ``--arch hf_unilm``.

Such a checkpoint's output layer (the head's transform, dense + activation + LayerNorm, before the tied word
embeddings) starts from random weights, so at first its top k is arbitrary, which is what sparse_softmax
normalises over. This trains only the head's transform and its output bias on masked-LM over the task's own
training text: the encoder and the word embeddings (the output weights, tied) are frozen, so the encoder runs
without gradients and the head scores the masked positions only. Masking is BERT's: ``--mask-prob`` of the
tokens that are not special, 80 % ``[MASK]``, 10 % a random token, 10 % kept.

Each line of the ``--text`` files is one text (empty lines are skipped, counted); lines longer than
``--max-tokens`` are cut (counted). ``--valid-lines`` lines drawn at random are held out: their masked-LM loss
and accuracy are printed before and after, with fixed masks. OUT is a checkpoint folder (``save_pretrained``:
the encoder as it was and the trained head, the tokenizer, and ``head_adaptation.json`` with the counts and the
curve) that ``--arch hf_unilm --hf-model-dir OUT`` loads as it loads any checkpoint with a head.

    python scripts/adapt_mlm_head.py models/all-MiniLM-L6-v2 models/minilm-giga-head \\
        --text data/giga10k-minilm/train.src data/giga10k-minilm/train.tgt
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from sparse_softmax.userinput import UserInputError, decode, exit_on_error, without_bom


def read_texts(paths: list[Path]) -> tuple[list[str], int]:
    """Every non-empty line of ``paths``, and how many empty lines were skipped."""
    texts, empty = [], 0
    for path in paths:
        if not path.is_file():
            raise UserInputError(f"--text {path}: no such file")
        for number, line in enumerate(without_bom(path.read_bytes())[0].splitlines(), 1):
            if text := decode(line, path, number).strip():
                texts.append(text)
            else:
                empty += 1
    if not texts:
        raise UserInputError(f"--text {' '.join(map(str, paths))}: no non-empty line")
    return texts, empty


def load(folder: Path):
    """The tokenizer and the checkpoint as a BERT masked LM (a missing head starts from random weights)."""
    import transformers
    from transformers.utils import logging as hf_logging

    if not (folder / "config.json").is_file():
        raise UserInputError(f"{folder}: no config.json (expected a folder written by save_pretrained)")
    hf_logging.set_verbosity_error()  # its load report lists the missing head, which is what this fills
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = transformers.AutoModelForMaskedLM.from_pretrained(folder, local_files_only=True)
    if model.config.model_type != "bert" or tokenizer.mask_token_id is None:
        raise UserInputError(f"{folder}: a BERT checkpoint with a [MASK] token is expected (as --arch hf_unilm "
                             f"takes); this one is {model.config.model_type!r}")
    return tokenizer, model


def mask_tokens(ids: torch.Tensor, maskable: torch.Tensor, prob: float, mask_id: int, vocab_size: int,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking of a (B, L) batch: (inputs, labels), labels -100 where nothing is predicted."""
    chosen = (torch.rand(ids.shape, generator=generator) < prob) & maskable
    draw = torch.rand(ids.shape, generator=generator)
    inputs = ids.clone()
    inputs[chosen & (draw < 0.8)] = mask_id
    swap = chosen & (draw >= 0.8) & (draw < 0.9)
    inputs[swap] = torch.randint(vocab_size, ids.shape, generator=generator)[swap]
    return inputs, torch.where(chosen, ids, torch.full_like(ids, -100))


class Batches:
    """The tokenised texts, padded batch by batch, with their maskable positions."""

    def __init__(self, tokenizer, texts: list[str], max_tokens: int):
        encoded = tokenizer(texts, add_special_tokens=True)["input_ids"]
        self.cut = sum(len(ids) > max_tokens for ids in encoded)
        self.ids = [ids[:max_tokens - 1] + [ids[-1]] if len(ids) > max_tokens else ids for ids in encoded]
        self.pad, self.special = tokenizer.pad_token_id, set(tokenizer.all_special_ids)

    def batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, maskable) of the texts ``indices``, both (B, longest)."""
        longest = max(len(self.ids[i]) for i in indices)
        ids = torch.tensor([self.ids[i] + [self.pad] * (longest - len(self.ids[i])) for i in indices])
        maskable = ~torch.isin(ids, torch.tensor(sorted(self.special)))
        return ids, maskable


def masked_lm(model, ids: torch.Tensor, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """The head's summed cross-entropy at the masked positions (the frozen encoder runs without gradients), how
    many of them it predicts right, and how many there are."""
    with torch.no_grad():
        hidden = model.bert(input_ids=inputs, attention_mask=ids.ne(model.config.pad_token_id)).last_hidden_state
    where = labels.ne(-100)
    logits = model.cls(hidden[where])
    target = labels[where]
    return F.cross_entropy(logits, target, reduction="sum"), int(logits.argmax(-1).eq(target).sum()), len(target)


def evaluate(model, batches: Batches, held_out: list[int], args, tokenizer) -> dict[str, float]:
    """Masked-LM loss (nats a masked token) and accuracy (%) on the held-out texts, with masks fixed by the seed."""
    generator = torch.Generator().manual_seed(args.seed)
    loss = correct = count = 0
    with torch.no_grad():
        for start in range(0, len(held_out), args.batch_size):
            ids, maskable = batches.batch(held_out[start:start + args.batch_size])
            inputs, labels = mask_tokens(ids, maskable, args.mask_prob, tokenizer.mask_token_id, len(tokenizer),
                                         generator)
            total, right, masked = masked_lm(model, ids, inputs, labels)
            loss, correct, count = loss + float(total), correct + right, count + masked
    return {"loss": loss / max(count, 1), "accuracy": 100 * correct / max(count, 1), "masked": count}


def adapt(args) -> dict:
    texts, empty = read_texts(args.text)
    if args.valid_lines >= len(texts):
        raise UserInputError(f"--valid-lines {args.valid_lines}: the --text files have only {len(texts)} "
                             "non-empty lines, and training needs some")
    torch.manual_seed(args.seed)  # before loading: a missing head's weights are drawn as the model loads
    tokenizer, model = load(args.model)
    head = [p for name, p in model.named_parameters() if not name.startswith("bert.")]  # the tied weights are bert's
    for p in model.parameters():
        p.requires_grad_(False)
    for p in head:
        p.requires_grad_(True)
    model.eval()  # the encoder's dropout off; the head has none
    batches = Batches(tokenizer, texts, args.max_tokens)
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(args.seed)).tolist()
    held_out, train = order[:args.valid_lines], order[args.valid_lines:]
    before = evaluate(model, batches, held_out, args, tokenizer)
    print(f"held-out masked-LM before: loss {before['loss']:.3f} nats, accuracy {before['accuracy']:.1f} % "
          f"({before['masked']} masked tokens of {len(held_out)} lines)", flush=True)

    optimizer = torch.optim.AdamW(head, lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, max(0.0, (args.steps - step) / (args.steps - warmup + 1))))
    generator, curve, position, started = torch.Generator().manual_seed(args.seed + 1), [], len(train), time.time()
    window = {"loss": 0.0, "correct": 0, "count": 0}
    for step in range(1, args.steps + 1):
        if position + args.batch_size > len(train):  # a new pass over the training texts, shuffled
            train = [train[i] for i in torch.randperm(len(train), generator=generator).tolist()]
            position = 0
        ids, maskable = batches.batch(train[position:position + args.batch_size])
        position += args.batch_size
        inputs, labels = mask_tokens(ids, maskable, args.mask_prob, tokenizer.mask_token_id, len(tokenizer),
                                     generator)
        total, right, count = masked_lm(model, ids, inputs, labels)
        optimizer.zero_grad()
        (total / max(count, 1)).backward()
        optimizer.step()
        schedule.step()
        window = {"loss": window["loss"] + total.item(), "correct": window["correct"] + right,
                  "count": window["count"] + count}
        if step % args.log_interval == 0 or step == args.steps:
            point = {"step": step, "loss": window["loss"] / max(window["count"], 1),
                     "accuracy": 100 * window["correct"] / max(window["count"], 1)}
            curve.append(point)
            print(f"step {step}/{args.steps}: masked-LM loss {point['loss']:.3f} nats, accuracy "
                  f"{point['accuracy']:.1f} % ({time.time() - started:.0f} s)", flush=True)
            window = {"loss": 0.0, "correct": 0, "count": 0}
    after = evaluate(model, batches, held_out, args, tokenizer)
    print(f"held-out masked-LM after: loss {after['loss']:.3f} nats, accuracy {after['accuracy']:.1f} %", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    summary = {"model": str(args.model), "text": [str(p) for p in args.text], "lines": len(texts),
               "empty_lines_skipped": empty, "lines_cut": batches.cut, "held_out_lines": len(held_out),
               "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "mask_prob": args.mask_prob,
               "seed": args.seed, "trained_parameters": sum(p.numel() for p in head), "before": before,
               "after": after, "curve": curve, "seconds": round(time.time() - started, 1)}
    (args.out / "head_adaptation.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(f"{len(texts)} lines ({empty} empty skipped, {batches.cut} cut to {args.max_tokens} tokens); "
          f"wrote {args.out}", flush=True)
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="the BERT checkpoint folder (save_pretrained)")
    parser.add_argument("out", type=Path, help="folder for the checkpoint with the trained head")
    parser.add_argument("--text", type=Path, nargs="+", required=True,
                        help="the task's training text, one text a line (e.g. the prep's train.src and train.tgt)")
    parser.add_argument("--steps", type=int, default=1000, help="updates of the head (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64, help="texts an update (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=1e-3,
                        help="peak learning rate, linear warm-up over a tenth of the steps then linear decay "
                        "(default: %(default)s; the head starts from random weights)")
    parser.add_argument("--mask-prob", type=float, default=0.15, help="share of tokens masked (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="cut longer texts to this many tokens, special tokens included (default: %(default)s)")
    parser.add_argument("--valid-lines", type=int, default=500,
                        help="lines held out to score the head before and after (default: %(default)s)")
    parser.add_argument("--log-interval", type=int, default=100, help="steps between printed lines")
    parser.add_argument("--seed", type=int, default=1,
                        help="fixes a new head's initial weights, the held-out lines and masks and the order of the "
                             "training texts (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true", help="write into OUT even if it is not empty")
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "max_tokens", "log_interval"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected a positive number, got {getattr(args, name)}")
    if not 0 < args.mask_prob < 1 or args.lr <= 0 or args.valid_lines < 0:
        parser.error("expected 0 < --mask-prob < 1, --lr > 0 and --valid-lines >= 0")
    if args.out.is_dir() and any(args.out.iterdir()) and not args.overwrite:
        parser.error(f"{args.out}: not empty; pass --overwrite to write into it")
    with exit_on_error(parser):
        adapt(args)


if __name__ == "__main__":
    main()
