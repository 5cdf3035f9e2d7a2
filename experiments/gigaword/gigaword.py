#!/usr/bin/env python
"""Gigaword-10k headline generation in the Sparse-softmax paper's setting: a pretrained model (the packaged MiniLM)
fine-tuned as UniLM (``--arch hf_unilm``) on 10,000 Gigaword pairs, with label smoothing (the paper's softmax
baseline) and sparse_softmax (its method), each on the checkpoint as it is (a fresh MLM head) and on one whose head
was first trained to rank the vocabulary (``scripts/adapt_mlm_head.py``); then cross-entropy, as_softmax and
sparse_softmax after a softmax warm-up. Each run is decoded with beam 1, beam 5 and beam 5 over each step's top 5
(``--decoding-topk 5``) and scored with ROUGE-1/2/L F1 on all 1,951 test pairs, through the real
``fairseq-train`` / ``fairseq-generate`` and ``scripts/score_summaries.py``.

Data. harvardnlp's layout (``train/train.{article,title}.txt``, ``Giga/{input,task1_ref0}.txt``), prepared by
``data-prep/prepare_gigaword.py --hf-tokenizer`` with the last 500 training pairs held out as the valid split
(``--valid-from-train 500``: the release has none), so 9,500 pairs train. The test references stay as given.

Heads. The checkpoint is a sentence-embedding encoder without an MLM head: ``--arch hf_unilm`` gives it a fresh
one, whose top 10 is arbitrary at first, while the paper's UniLM starts from a head that ranks the vocabulary.
``adapted`` runs start from the checkpoint with its head trained on masked-LM over the training split's sources
and headlines (the encoder and embeddings frozen; once per seed, with that seed, shared by the seed's adapted runs:
the head's initial draw varies with the seed as the rest of a run does).

Scoring. ROUGE F1 as UniLM scores Gigaword: rouge-score with the Porter stemmer (ROUGE-1.5.5 ``-m``), the mean of
per-example scores, hypotheses and references lower-cased, a generated ``<unk>`` written ``UNK`` as the references
spell rare words (``score_summaries.py --lowercase --map-unk``): a predicted ``UNK`` counts as a match for a
reference ``UNK``, as in UniLM's evaluation. Hypotheses are the model's WordPiece joined back into words;
rouge-score keeps only letters and digits of each token, so BERT's split punctuation (``u . s .``) and the data's
(``u.s.``) score alike.

Scales. ``paper``: 30 epochs of batch 64 (4,453 updates), the paper's; many hours a run on 2 CPU cores (a stopped
run goes on from its last checkpoint). ``cpu``: 1,200 updates (8 epochs), about a quarter of that, so that three
seeds of several methods fit on 2 cores. ``tiny`` checks the pipeline. Every run of a scale trains the same model for
the same updates with the same batches per seed; the last checkpoint is decoded (no selection on the valid set).

    python experiments/gigaword/gigaword.py --seeds 1              # the gate: seed 1 of the core comparison
    python experiments/gigaword/gigaword.py                        # seeds 1-3
    python experiments/gigaword/gigaword.py --seeds 1 --methods cross_entropy+head as_softmax+head \
        sparse_softmax_warmup50+head

Runs go to OUT/work (default OUT: ``experiments/gigaword/<scale>``; ``tail -f`` a run's ``train.log`` there
to follow it); a run with a ``result.json`` there is reused (``--fresh`` re-runs it), and each run's ``result.json``
is committed, so seeds and methods can be added later. OUT gets ``results.md`` (tables and command), ``runs.json``
and ``curves.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from sparse_softmax.scoring.inputs import remove_bpe

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / part) for part in ("benchmarks", "experiments")]
import generation_runs  # noqa: E402  (experiments/)
from measure import ROOT, add_run_selection, command_line, run  # noqa: E402  (benchmarks/)

DEFAULT_GIGAWORD_DIR = ROOT.parent / "shared" / "data" / "gigaword"
GIGAWORD_FILES = ["train/train.article.txt", "train/train.title.txt", "Giga/input.txt", "Giga/task1_ref0.txt"]
VALID_PAIRS = 500
#: the losses: the paper's two (label smoothing 0.1, its softmax baseline; sparse_softmax k = 10 as the paper
#: defines it, without smoothing: smoothing over the kept set pulls the k kept logits together, the way in which
#: sparse_softmax flattens a model here, and the reference code has none), then cross-entropy, as_softmax and
#: sparse_softmax after half the run of softmax (what kept its ranking in question generation)
LOSSES = {**generation_runs.METHODS,
          "sparse_softmax_warmup50": [*generation_runs.METHODS["sparse_softmax"], "--sparse-warmup-ratio", "0.5"]}
#: "+head" runs start from the checkpoint with the adapted head
ADAPTED = "+head"
METHODS = {**LOSSES, **{name + ADAPTED: flags for name, flags in LOSSES.items()}}
CORE = ["label_smoothing", "sparse_softmax", "label_smoothing" + ADAPTED, "sparse_softmax" + ADAPTED]
DECODINGS = {
    "beam 1": ["--beam", "1"],
    "beam 5": ["--beam", "5"],
    "beam 5, top-5 mask": ["--beam", "5", "--decoding-topk", "5"],
}
#: updates, batch, learning rate and warm-up; the head adaptation's steps and held-out lines
SCALES = {
    "paper": {"updates": 4453, "batch": 64, "lr": 2e-4, "warmup": 445, "head_steps": 1000, "head_valid": 500,
              "device": ["--cpu"]},
    "cpu": {"updates": 1200, "batch": 64, "lr": 2e-4, "warmup": 120, "head_steps": 1000, "head_valid": 500,
            "device": ["--cpu"]},
    "tiny": {"updates": 12, "batch": 4, "lr": 1e-3, "warmup": 2, "head_steps": 4, "head_valid": 8, "device": ["--cpu"]},
}
#: fairseq-generate's longest headline, in the checkpoint's tokens (the longest test reference has 34)
MAX_HEADLINE = 40


def rouge_scoring(references: Path) -> generation_runs.Scoring:
    """ROUGE-1/2/L F1 of a prediction file against ``references`` by ``scripts/score_summaries.py``."""
    names = ["ROUGE-1", "ROUGE-2", "ROUGE-L"]

    def score(predictions: Path, way: str) -> dict[str, float]:
        return generation_runs.scored("score_summaries.py", predictions, predictions.with_suffix(".json"), names,
                                      ["--refs", references, "--lowercase", "--map-unk"])

    ways = {"F1": "ROUGE F1 as UniLM scores Gigaword (rouge-score, Porter stemmer, lower-cased, <unk> as UNK)"}
    return generation_runs.Scoring("ROUGE", names, ("ROUGE-1", "ROUGE-2"), ways, score)


def prepare(args) -> dict:
    """The data (made once): the prep's folder, its summary and the number of test pairs."""
    data = args.out / "work" / "data"
    if not (data / "prep_summary.json").exists():
        run([sys.executable, ROOT / "data-prep" / "prepare_gigaword.py", args.gigaword_dir, data,
             "--valid-from-train", args.valid_pairs, "--hf-tokenizer", args.model_dir, "--overwrite"])
    summary = json.loads((data / "prep_summary.json").read_text(encoding="utf-8"))
    return {"folder": data, "bin": data / "data-bin", "summary": summary,
            "test": summary["binarised_sentences"]["test"]}


def head_folder(args, seed: int) -> Path:
    """Where seed ``seed``'s adapted checkpoint is made; ``head_adaptation.json`` in it is its record."""
    return args.out / "work" / f"head-adapted-seed{seed}"


def adapted_head(args, data: dict, seed: int) -> Path:
    """The checkpoint with its head adapted on the training split's text with ``seed`` (made once, by the seed's
    first run that needs it)."""
    folder = head_folder(args, seed)
    if not (folder / "model.safetensors").exists():
        folder.mkdir(parents=True, exist_ok=True)
        relative = os.path.relpath  # the record keeps the paths it is given: the repository's, not this machine's
        run([sys.executable, ROOT / "scripts" / "adapt_mlm_head.py", relative(args.model_dir), folder, "--text",
             relative(data["folder"] / "train.src"), relative(data["folder"] / "train.tgt"),
             "--steps", SCALES[args.scale]["head_steps"],
             "--valid-lines", SCALES[args.scale]["head_valid"], "--seed", seed, "--overwrite"],
            folder.with_suffix(".log"))
    return folder


def decode(args, data: dict, checkpoint: Path, decoding: str, folder: Path) -> Path:
    """One decoding of every test pair; the hypotheses' WordPiece joined back into words, one a line."""
    hypotheses = generation_runs.generate(data["bin"], checkpoint, [
        *DECODINGS[decoding], "--batch-size", "64", "--max-len-b", MAX_HEADLINE, *SCALES[args.scale]["device"]],
        data["test"])
    predictions = generation_runs.prediction_file(folder, decoding)
    predictions.write_text("".join(remove_bpe(h, "wordpiece") + "\n" for h in hypotheses), encoding="utf-8")
    return predictions


def train_and_test(args, data: dict, method: str, seed: int) -> dict:
    scale = SCALES[args.scale]
    updates = args.updates or scale["updates"]

    def train(folder: Path) -> None:
        model = adapted_head(args, data, seed) if method.endswith(ADAPTED) else args.model_dir
        generation_runs.fairseq_train(data["bin"], folder, seed, updates, generation_runs.unilm_flags(
            model, METHODS[method], args.lr or scale["lr"], min(scale["warmup"], updates), updates, scale["batch"],
            scale["device"]), log_interval=20)

    return generation_runs.record(
        generation_runs.run_folder(args.out, method, seed), method, METHODS[method], seed, train,
        lambda checkpoint, decoding, folder: decode(args, data, checkpoint, decoding, folder), list(DECODINGS),
        rouge_scoring(data["folder"] / "test.ref"), args.fresh)


def comparisons(methods) -> list[tuple[str, str]]:
    """Each loss against label smoothing on the same head, and each adapted-head run against the fresh-head one."""
    methods = list(methods)
    return [*((m, "label_smoothing" + (ADAPTED if m.endswith(ADAPTED) else "")) for m in methods
              if m.removesuffix(ADAPTED) != "label_smoothing"),
            *((m, m.removesuffix(ADAPTED)) for m in methods if m.endswith(ADAPTED))]


def data_notes(args, data: dict) -> str:
    """What the table was measured on: the splits' counts, the head adaptation, the updates."""
    scale, splits = SCALES[args.scale], data["summary"]["splits"]
    updates = args.updates or scale["updates"]
    lines = [f"Data: Gigaword in harvardnlp's layout from `{args.gigaword_dir.name}`, `{args.model_dir.name}`'s "
             "tokens; the valid split is the last training pairs (the release has none):"]
    for split, counts in splits.items():
        cut = "; ".join(f"{n} {why}" for why, n in {**counts["skipped"], **counts["edited"], **counts["moved"]}.items())
        lines.append(f"- {split}: {counts['read']:,} pairs in, {counts['written']:,} written"
                     + (f" ({cut})" if cut else ""))
    truncated = {name: n for name, n in data["summary"].get("truncated", {}).items() if n}
    lines.append(f"- cut to the model's lengths: {truncated or 'none'}")
    seen = updates * scale["batch"]
    lines.append(f"- training: {updates:,} updates of {scale['batch']} pairs = {seen / splits['train']['written']:.1f} "
                 f"epochs, peak learning rate {args.lr or scale['lr']:g}; the last checkpoint is decoded")
    for seed in args.seeds:
        head = head_folder(args, seed) / "head_adaptation.json"
        if head.exists():
            record = json.loads(head.read_text(encoding="utf-8"))
            before, after = record["before"], record["after"]
            lines.append(f"- seed {seed}'s adapted head (`+head`, `adapt_mlm_head.py --seed {record['seed']}`): "
                         f"{record['steps']} steps of {record['batch_size']} lines of the train split's sources and "
                         f"headlines, {record['seconds']:.0f} s; masked-LM on {record['held_out_lines']} held-out "
                         f"lines: loss {before['loss']:.2f} → {after['loss']:.2f} nats, accuracy "
                         f"{before['accuracy']:.1f} → {after['accuracy']:.1f} %")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gigaword-dir", type=Path, default=DEFAULT_GIGAWORD_DIR,
                        help="harvardnlp's train/ and Giga/ folders (default: %(default)s)")
    parser.add_argument("--scale", choices=list(SCALES), default="cpu",
                        help="cpu: 1,200 updates (8 epochs), for 2 CPU cores; paper: the paper's 30 epochs "
                        "(4,453 updates); tiny: checks the pipeline")
    parser.add_argument("--valid-pairs", type=int, default=VALID_PAIRS,
                        help="the last training pairs held out as the valid split (default: %(default)s)")
    generation_runs.add_unilm_options(parser, "gigaword")
    add_run_selection(parser, list(METHODS), CORE)
    args = parser.parse_args(argv)
    generation_runs.check_inputs(parser, "--gigaword-dir", args.gigaword_dir, GIGAWORD_FILES,
                                 "harvardnlp's train/train.{article,title}.txt and Giga/{input,task1_ref0}.txt")
    generation_runs.check_model_dir(parser, args.model_dir)
    args.out = args.out or Path(__file__).parent / args.scale
    data = prepare(args)
    results = generation_runs.collect(args.out, {m: METHODS[m] for m in args.methods}, args.seeds,
                                      lambda m, s: train_and_test(args, data, m, s), args.table_only)
    command = command_line(__file__, argv)
    generation_runs.write(args.out, command, results, list(DECODINGS), rouge_scoring(data["folder"] / "test.ref"),
                          "F1", data_notes(args, data), comparisons(results))


if __name__ == "__main__":
    main()
