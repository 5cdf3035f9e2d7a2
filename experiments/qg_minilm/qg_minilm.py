#!/usr/bin/env python
"""Question generation in the papers' setting: a pretrained model (the packaged MiniLM) fine-tuned as UniLM
(``--arch hf_unilm``) on SQuAD passages with Du et al. 2017's article split, with softmax, label smoothing,
sparse_softmax and as_softmax, several seeds, each decoded with beam 1 (the papers' QG setting), beam 5 and
beam 5 with ``--decoding-topk 5``, through the real ``fairseq-train`` / ``fairseq-generate`` and
``scripts/score_questions.py``.

Data. ``data-prep/prepare_squad_qg.py --split doclist --hf-tokenizer`` on SQuAD v1.1's train and dev JSON with
Du et al.'s article lists: the input is UniLM's (a passage window around the answer, ``[SEP]``, the answer), the
target the question, the references Du et al.'s PTB-tokenised, lower-cased questions. Examples whose answer
alone does not fit the window are skipped and counted (results.md gives the counts).

Scales. ``gpu`` is the papers' setting: every training question, 464-token windows, batch 32, learning rate
2e-5, 10 epochs (UniLM's QG recipe), the whole test split. ``cpu`` fits a run into about an hour on 2 cores:
96-token windows (the answer's sentence and some context), a higher learning rate for far fewer updates (what the
32-question batches of those updates cover of the training split is in results.md), and evenly spaced subsets of
the valid and test splits (the valid subset for the curves). ``tiny`` checks the pipeline, not an experiment.

Scoring. Both ways of the QG papers, with ``scripts/score_questions.py``: per example (each prediction against
its own question; UniLM's table) and grouped by source as Du et al.'s script, which UniLM's ``eval.py`` runs on
its passage + answer lines (examples with the same source line are one item, all their questions its
references). Hypotheses are WordPiece joined back to words and re-tokenised as the PTB references
(``score_questions.py --ptb-hypotheses``: BERT's tokenizer splits off every punctuation mark, ``dame ' s``,
``10 , 000``, where the references have ``dame 's``, ``10,000``).

Training. Every run of a scale trains the same model for the same updates with the same batches per seed; the
last checkpoint is decoded (no selection on the valid set). The curves are the valid subset's softmax
cross-entropy (``nll_loss``, the same quantity for every loss).

    python experiments/qg_minilm/qg_minilm.py --seeds 1             # the gate: one seed of every method
    python experiments/qg_minilm/qg_minilm.py                       # seeds 1-3, ~1 hour a run on 2 CPU cores
    python experiments/qg_minilm/qg_minilm.py --scale gpu           # the papers' setting, on a GPU

Runs go to OUT/work (default OUT: ``experiments/qg_minilm/<scale>``; ``tail -f`` a run's
``train.log`` there to follow it); a run with a ``result.json`` there is reused (``--fresh`` re-runs it), and
each run's ``result.json`` (its scores, valid curve and training time) is committed, so seeds and methods can be
added later. OUT gets
``results.md`` (tables and command), ``runs.json`` and ``curves.png``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sparse_softmax.scoring import ptb
from sparse_softmax.scoring.inputs import remove_bpe

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / part) for part in ("benchmarks", "experiments")]
import generation_runs  # noqa: E402  (experiments/)
from measure import ROOT, add_run_selection, command_line, run  # noqa: E402  (benchmarks/)

#: The four of the papers' comparison, and sparse_softmax after a softmax warm-up of 10 % and of 50 %: the checkpoint
#: has no MLM head, so the head's transform starts fresh (the output weights are the tied embeddings) and the top 10
#: it ranks at first is arbitrary; the warm-up lets softmax train it over the whole vocabulary first. 10 % did not
#: save it (it handed over a model at 7.6 bits of valid nll); at half the run cross-entropy is at 4.9 bits (4.13 at
#: its end), a head that ranks the vocabulary, nearer the pretrained one the paper's UniLM starts from: its nll
#: still rises after the switch, but its ranking holds (docs/experiments.md).
METHODS = {**generation_runs.METHODS,
           "sparse_softmax_warmup": [*generation_runs.METHODS["sparse_softmax"], "--sparse-warmup-ratio", "0.1"],
           "sparse_softmax_warmup50": [*generation_runs.METHODS["sparse_softmax"], "--sparse-warmup-ratio", "0.5"]}
DEFAULT_SQUAD_DIR = ROOT.parent / "shared" / "data" / "squad_v1.1"
SQUAD_FILES = ["train-v1.1.json", "dev-v1.1.json", "doclist-train.txt", "doclist-dev.txt", "doclist-test.txt"]
DECODINGS = {
    "beam 1": ["--beam", "1"],
    "beam 5": ["--beam", "5"],
    "beam 5, top-5 mask": ["--beam", "5", "--decoding-topk", "5"],
}
#: window: source tokens (passage window, [SEP], answer); target: longest question in tokens; valid/test: evenly
#: spaced examples of the split (None: all); updates: 10 epochs of 75,719 questions in batches of 32 for gpu.
#: cpu, sized on 2 cores: 1.85 s an update (49 min of training), a few minutes for each decoding. Its learning rate
#: and length come from a pilot (cross_entropy, seed 1, 1,200 updates, 300 test questions): BLEU-4 per example 3.0
#: after 400 updates, 6.7 after 800, 8.5 after 1,200 (beam 1; 10.1 with beam 5), still rising; 3e-4 and 6e-4 gave
#: the same loss over the first 150 updates.
SCALES = {
    "cpu": {"window": 96, "target": 32, "updates": 1600, "lr": 3e-4, "warmup": 160, "batch": 32, "valid": 500,
            "test": 2000, "device": ["--cpu"]},
    "gpu": {"window": 464, "target": 40, "updates": 23662, "lr": 2e-5, "warmup": 2366, "batch": 32, "valid": 2000,
            "test": None, "device": ["--fp16"]},
    "tiny": {"window": 40, "target": 16, "updates": 20, "lr": 1e-3, "warmup": 2, "batch": 2, "valid": 4,
             "test": 6, "device": ["--cpu"]},
}


def evenly_spaced(count: int, keep: int | None) -> list[int]:
    """``keep`` indices spread evenly over ``range(count)`` (every one when ``keep`` is None or not less)."""
    if keep is None or keep >= count:
        return list(range(count))
    return [i * count // keep for i in range(keep)]


def subset_split(data_bin: Path, split: str, keep: list[int], out: Path) -> None:
    """The ``keep`` examples of a binarised split, in that order, as the same split in ``out``."""
    from fairseq.data import Dictionary, data_utils, indexed_dataset

    dictionary = Dictionary.load(str(data_bin / "dict.src.txt"))
    for side in ("src", "tgt"):
        name = f"{split}.src-tgt.{side}"
        dataset = data_utils.load_indexed_dataset(str(data_bin / name), dictionary, "mmap")
        builder = indexed_dataset.make_builder(str(out / f"{name}.bin"), "mmap", vocab_size=len(dictionary))
        for index in keep:
            builder.add_item(dataset[index])
        builder.finalize(str(out / f"{name}.idx"))


def prepare(args) -> dict:
    """The data (made once per window and target length): SQuAD with Du's split through the prep, then a data-bin
    with the training split as it is and the evenly spaced valid and test subsets, with their text lines."""
    scale = SCALES[args.scale]
    data = args.out / "work" / f"data-w{scale['window']}-t{scale['target']}"
    squad = args.squad_dir
    if not (data / "prep_summary.json").exists():
        run([sys.executable, ROOT / "data-prep" / "prepare_squad_qg.py", data, "--train-json",
             squad / "train-v1.1.json", "--dev-json", squad / "dev-v1.1.json", "--split", "doclist",
             "--doclist-dir", squad, "--hf-tokenizer", args.model_dir, "--max-source-tokens", scale["window"],
             "--max-target-tokens", scale["target"], "--skip-invalid", "--overwrite"])
    summary = json.loads((data / "prep_summary.json").read_text(encoding="utf-8"))
    written = summary["binarised_sentences"]
    bins = data / "eval-bin"
    keep = {split: evenly_spaced(written[split], scale[split]) for split in ("valid", "test")}
    if not (bins / "test.src-tgt.tgt.idx").exists():
        bins.mkdir(exist_ok=True)
        for name in ["dict.src.txt", "dict.tgt.txt", *(f"train.src-tgt.{s}.{e}" for s in ("src", "tgt")
                                                       for e in ("bin", "idx"))]:
            (bins / name).unlink(missing_ok=True)
            (bins / name).symlink_to(data / "data-bin" / name)
        for split, indices in keep.items():
            subset_split(data / "data-bin", split, indices, bins)
        for name in ("test.src", "test.ref"):
            lines = (data / name).read_text(encoding="utf-8").splitlines()
            (bins / name).write_text("".join(lines[i] + "\n" for i in keep["test"]), encoding="utf-8")
    return {"bin": bins, "summary": summary, "kept": {split: len(indices) for split, indices in keep.items()}}


def decode(args, bins: Path, checkpoint: Path, decoding: str, folder: Path) -> Path:
    """One decoding of the test subset; the hypotheses in the references' PTB tokens, one a line in the subset's
    order."""
    expected = len((bins / "test.ref").read_text(encoding="utf-8").splitlines())
    hypotheses = generation_runs.generate(bins, checkpoint, [*DECODINGS[decoding], "--batch-size", "64", "--max-len-b",
                                                             SCALES[args.scale]["target"], *SCALES[args.scale]["device"]],
                                          expected)
    predictions = generation_runs.prediction_file(folder, decoding)
    predictions.write_text("".join(ptb.from_bert(remove_bpe(h, "wordpiece")) + "\n"
                                   for h in hypotheses), encoding="utf-8")
    return predictions


def train_and_test(args, bins: Path, method: str, seed: int) -> dict:
    scale = SCALES[args.scale]
    updates = args.updates or scale["updates"]

    def train(folder: Path) -> None:
        generation_runs.fairseq_train(bins, folder, seed, updates, generation_runs.unilm_flags(
            args.model_dir, METHODS[method], args.lr or scale["lr"], min(scale["warmup"], updates), updates,
            scale["batch"], scale["device"], max_target_tokens=scale["target"]), log_interval=20)

    return generation_runs.record(
        generation_runs.run_folder(args.out, method, seed), method, METHODS[method], seed, train,
        lambda checkpoint, decoding, folder: decode(args, bins, checkpoint, decoding, folder), list(DECODINGS),
        generation_runs.question_scoring(bins / "test.ref", bins / "test.src"), args.fresh)


def data_notes(args, data: dict) -> str:
    """What the table was measured on: the split's counts (Du et al.'s test split has 11,877 questions), what was
    skipped and cut, the subsets, and how much of the training split the updates cover."""
    scale, splits = SCALES[args.scale], data["summary"]["splits"]
    updates = args.updates or scale["updates"]
    lines = [f"Data: SQuAD v1.1 with Du et al.'s article lists, `{args.model_dir.name}`'s tokens, "
             f"{scale['window']}-token sources (passage window, [SEP], answer), questions up to {scale['target']} "
             "tokens (longer ones cut in training only; the references are whole)."]
    for split, counts in splits.items():
        skipped = "; ".join(f"{n} {why}" for why, n in counts["skipped"].items()) or "none"
        lines.append(f"- {split}: {counts['read']:,} questions, {counts['written']:,} written (skipped: {skipped})"
                     + (f", {data['kept'][split]:,} evenly spaced ones used" if split in data["kept"] else ""))
    seen = updates * scale["batch"]
    lines.append(f"- training: {updates:,} updates of {scale['batch']} questions = {seen:,} "
                 f"({seen / splits['train']['written']:.2f} epochs), learning rate {args.lr or scale['lr']:g}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--squad-dir", type=Path, default=DEFAULT_SQUAD_DIR,
                        help="SQuAD v1.1 train/dev JSON and Du et al.'s doclist-{train,dev,test}.txt "
                        "(default: %(default)s)")
    parser.add_argument("--scale", choices=list(SCALES), default="cpu",
                        help="cpu: 96-token windows, 1,600 updates, 2,000 test questions; gpu: the papers' setting "
                        "(464-token windows, 10 epochs, lr 2e-5, --fp16); tiny: checks the pipeline")
    generation_runs.add_unilm_options(parser, "qg_minilm")
    add_run_selection(parser, list(METHODS), list(METHODS))
    args = parser.parse_args(argv)
    generation_runs.check_inputs(parser, "--squad-dir", args.squad_dir, SQUAD_FILES, "SQuAD v1.1's train-v1.1.json "
                                 "and dev-v1.1.json and Du et al.'s doclist-{train,dev,test}.txt")
    generation_runs.check_model_dir(parser, args.model_dir)
    args.out = args.out or Path(__file__).parent / args.scale
    data = prepare(args)
    results = generation_runs.collect(args.out, {m: METHODS[m] for m in args.methods}, args.seeds,
                                      lambda m, s: train_and_test(args, data["bin"], m, s), args.table_only)
    command = command_line(__file__, argv)
    generation_runs.write(args.out, command, results, list(DECODINGS),
                          generation_runs.question_scoring(data["bin"] / "test.ref", data["bin"] / "test.src"),
                          "per example", data_notes(args, data))


if __name__ == "__main__":
    main()
