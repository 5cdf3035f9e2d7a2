#!/usr/bin/env python
"""Question generation on Du et al. 2017's sentence-level SQuAD split: softmax, label smoothing,
sparse_softmax (k = 10, also after a softmax warm-up, and k = 100 and 1,000) and as_softmax trained from
scratch, each decoded plainly and with the masks, several seeds, through the real ``fairseq-train`` /
``fairseq-generate`` and ``scripts/score_questions.py``.

Data. Du et al.'s train split is not needed: their dev file (10,570 pairs) is split 90/10 into train and
valid *by source sentence* (a seeded shuffle of the distinct sentences, so no sentence is in both), and
their test file (11,877 pairs, 6,652 distinct sentences) is the test set; any files in Du's format work
(``src-{dev,test}.txt`` / ``tgt-{dev,test}.txt``, one example per line). ``data-prep/prepare_squad_qg.py
--du2017-dir`` tokenises and binarises them (sentencepiece trained on the train split).

Decoding. The model sees the sentence only, so examples that share a sentence get the same question:
each distinct test sentence is decoded once and its question is given to all of its examples. Decodings:
beam 1 (greedy; top-1 masking would change nothing, since the mask keeps the argmax), beam 5 plain,
beam 5 with ``--decoding-topk 5`` (the Sparse-softmax paper's k = beam) and beam 5 with
``--source-vocab-mask``. A question's words are mostly not in its sentence ("what", "?"), so the source
mask alone cannot write questions: it allows, besides the sentence's pieces, the ``--question-pieces`` most
frequent pieces of the training questions (``--source-vocab-allow``; the share of valid questions the mask can
still write, with and without them, is in the results). Each is scored both ways: per example against its own
question (UniLM) and grouped by source sentence against all of its questions (Du et al.'s script).

Training. Every run trains the same transformer with the same batches for ``--updates`` updates (the
AS warm-up is a share of them); the last checkpoint is decoded (no selection on the valid set, so no
method gets a choice the others lack). The curves are the valid set's softmax cross-entropy
(``nll_loss``, the same quantity for every loss) at ten points of each run.

    python experiments/qg_scratch/qg_scratch.py                      # 12 runs, ~2 hours on 2 CPU cores
    python experiments/qg_scratch/qg_scratch.py --scale gpu          # transformer-base size, on a GPU

Data, logs and per-run results go to OUT/work; runs found there (a ``result.json``) are reused, ``--fresh``
re-runs them. Each run's ``result.json`` (its scores, valid curve and training time) is committed with the table, so
seeds can be added without re-running the others; the data (re-made identically from Du's files) and the
predictions are not. OUT gets ``results.md`` (table and command), ``runs.json`` (per-run scores) and
``curves.png``.
"""
from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / part) for part in ("benchmarks", "experiments")]
import generation_runs  # noqa: E402  (experiments/)
from measure import ROOT, add_run_selection, command_line, run, transformer_size  # noqa: E402  (benchmarks/)

DEFAULT_DU_DIR = ROOT.parent / "shared" / "data" / "squad_qg_du2017"
DU_FILES = ["src-dev.txt", "tgt-dev.txt", "src-test.txt", "tgt-test.txt"]
#: the shared methods, sparse_softmax with a softmax warm-up as long as AS-Softmax's (plain sparse_softmax
#: collapses from scratch: does the warm-up save it?), and sparse_softmax with k = 100 and 1,000: flat logits score
#: log2 k = 6.64 and 9.97 bits on its loss, which cross-entropy's model beats from update 60 on (at a smaller scale
#: of its logits for 100; experiments/sparse_collapse/sparse_collapse.py --k), so the model has a ranking to sharpen, not a flat
#: minimum to fall into
METHODS = {**generation_runs.METHODS,
           "sparse_softmax_warmup": [*generation_runs.METHODS["sparse_softmax"], "--sparse-warmup-ratio", "0.3"],
           **{f"sparse_softmax_k{k}": ["--criterion", "sparse_softmax", "--sparse-topk", str(k)] for k in (100, 1000)}}
DECODINGS = {
    "beam 1": ["--beam", "1"],
    "beam 5": ["--beam", "5"],
    "beam 5, top-5 mask": ["--beam", "5", "--decoding-topk", "5"],
    "beam 5, source mask": ["--beam", "5", "--source-vocab-mask"],
}
#: model, training length and regime, and the device's flags. cpu: measured on 2 cores, ~0.5 s an
#: update (4.5 min of training) and ~7 min for the four decodings of the 6,652 test sentences.
SCALES = {
    "cpu": {"model": transformer_size(2, 128, 4), "updates": 600, "lr": 0.0015, "warmup": 200, "dropout": 0.1,
            "device": ["--cpu"]},
    "gpu": {"model": [], "updates": 20000, "lr": 0.0007, "warmup": 4000, "dropout": 0.3,  # 6+6 × 512
            "device": ["--fp16"]},
    "tiny": {"model": transformer_size(1, 64, 2, ffn=128), "updates": 200, "lr": 0.003, "warmup": 10, "dropout": 0.1,
             "device": ["--cpu"]},  # checks the pipeline in minutes; not an experiment
}


def first_question(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Each distinct source sentence with its first question, in order of first appearance."""
    first: dict[str, str] = {}
    for sentence, question in pairs:
        first.setdefault(sentence, question)
    return first


def split_du(du_dir: Path, out: Path, valid_fraction: float) -> dict[str, int]:
    """Du-format files for prepare_squad_qg.py: train/valid from Du's dev file by source sentence, test =
    the distinct test sentences (each with its first question; the scoring reads Du's own test files)."""
    def pairs(name: str) -> list[tuple[str, str]]:
        src = (du_dir / f"src-{name}.txt").read_text(encoding="utf-8").splitlines()
        tgt = (du_dir / f"tgt-{name}.txt").read_text(encoding="utf-8").splitlines()
        if len(src) != len(tgt):
            raise ValueError(f"{du_dir}: src-{name}.txt has {len(src)} lines, tgt-{name}.txt {len(tgt)}: "
                             "expected one question per sentence line")
        return list(zip(src, tgt))

    dev, test = pairs("dev"), pairs("test")
    sentences = sorted({s for s, _ in dev})
    random.Random(0).shuffle(sentences)
    valid_sentences = set(sentences[:max(1, round(valid_fraction * len(sentences)))])
    splits = {"train": [p for p in dev if p[0] not in valid_sentences],
              "dev": [p for p in dev if p[0] in valid_sentences],
              "test": list(first_question(test).items())}
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in splits.items():
        (out / f"src-{name}.txt").write_text("".join(s + "\n" for s, _ in rows), encoding="utf-8")
        (out / f"tgt-{name}.txt").write_text("".join(t + "\n" for _, t in rows), encoding="utf-8")
    return {name: len(rows) for name, rows in splits.items()} | {"test examples": len(test)}


def prepare(args) -> Path:
    data = args.out / "work" / "data"
    if not (data / "data-bin" / "dict.src.txt").exists():
        counts = split_du(args.du2017_dir, args.out / "work" / "split", args.valid_fraction)
        print("split: " + ", ".join(f"{n} {name}" for name, n in counts.items()), flush=True)
        run([sys.executable, ROOT / "data-prep" / "prepare_squad_qg.py", data, "--du2017-dir",
             args.out / "work" / "split", "--spm-vocab-size", args.spm_vocab_size, "--overwrite"])
    return data / "data-bin"


def question_pieces(data: Path, count: int) -> list[str]:
    """The ``count`` most frequent pieces of the training questions: what the source mask allows besides the
    sentence's own pieces (chosen on the training split, never on test)."""
    pieces = Counter(p for line in (data.parent / "train.spm.tgt").open(encoding="utf-8") for p in line.split())
    return [piece for piece, _ in pieces.most_common(count)]


def mask_coverage(data: Path, allowed: set[str]) -> tuple[float, float]:
    """Under the source mask with ``allowed``: the share of valid question pieces it allows, and the share of
    valid questions it allows entirely (the ones it could still write)."""
    def read(name: str) -> list[list[str]]:
        return [line.split() for line in (data.parent / name).read_text(encoding="utf-8").splitlines()]

    questions = read("valid.spm.tgt")
    kept = [[p in allowed or p in source for p in question]
            for source, question in zip((set(s) for s in read("valid.spm.src")), questions, strict=True)]
    return sum(map(sum, kept)) / sum(map(len, kept)), sum(map(all, kept)) / len(questions)


def coverage_text(data: Path, allowed: list[str]) -> str:
    lines = [f"the sentence's pieces{extra}: {pieces:.1%} of the valid questions' pieces, {whole:.1%} of them whole"
             for extra, (pieces, whole) in ((" only", mask_coverage(data, set())),
                                            (f" and the {len(allowed)} question pieces",
                                             mask_coverage(data, set(allowed))))]
    return "What the source mask allows (valid split):\n\n" + "\n".join(f"- {line}" for line in lines)


def decode(args, data: Path, checkpoint: Path, decoding: str, folder: Path) -> Path:
    """One decoding of the distinct test sentences, given to every test example: Du's test order."""
    flags = DECODINGS[decoding]
    if "--source-vocab-mask" in flags and args.allowed:
        flags = [*flags, "--source-vocab-allow", " ".join(args.allowed)]
    sentences = (args.out / "work" / "split" / "src-test.txt").read_text(encoding="utf-8").splitlines()
    hypotheses = generation_runs.generate(data, checkpoint, [
        *flags, "--batch-size", "128", "--max-len-b", "50", "--post-process", "sentencepiece",
        *(["--cpu"] if "--cpu" in SCALES[args.scale]["device"] else [])], len(sentences))
    question = dict(zip(sentences, hypotheses))
    examples = (args.du2017_dir / "src-test.txt").read_text(encoding="utf-8").splitlines()
    predictions = generation_runs.prediction_file(folder, decoding)
    predictions.write_text("".join(question[s] + "\n" for s in examples), encoding="utf-8")
    return predictions


def train_flags(args, loss: list) -> list:
    """The ``fairseq-train`` flags of a run with the ``loss`` flags (``--criterion ...``): model, optimiser, device."""
    scale = SCALES[args.scale]
    return ["--arch", "transformer", *scale["model"], "--share-all-embeddings", *scale["device"], *loss,
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", args.lr or scale["lr"],
            "--lr-scheduler", "inverse_sqrt", "--warmup-updates", args.warmup or scale["warmup"],
            "--dropout", scale["dropout"], "--max-tokens", args.max_tokens]


def train_and_test(args, data: Path, method: str, seed: int) -> dict:
    """One run (its record cached in its folder, see generation_runs.record) and its valid nll curve."""
    updates = args.updates or SCALES[args.scale]["updates"]

    def train(folder: Path) -> None:
        generation_runs.fairseq_train(data, folder, seed, updates, train_flags(args, METHODS[method]),
                                      log_interval=10)

    return generation_runs.record(
        generation_runs.run_folder(args.out, method, seed), method, METHODS[method], seed, train,
        lambda checkpoint, decoding, folder: decode(args, data, checkpoint, decoding, folder), list(DECODINGS),
        scoring(args), args.fresh)


def scoring(args) -> generation_runs.Scoring:
    return generation_runs.question_scoring(args.du2017_dir / "tgt-test.txt", args.du2017_dir / "src-test.txt")


def build_parser() -> argparse.ArgumentParser:
    """The experiment's options (``sparse_collapse.py`` trains its runs with the same ones)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--du2017-dir", type=Path, default=DEFAULT_DU_DIR,
                        help="Du et al.'s src-/tgt-{dev,test}.txt (default: %(default)s)")
    parser.add_argument("--out", type=Path, help="folder for data, runs, tables and plots (default: "
                        "experiments/qg_scratch/SCALE)")
    parser.add_argument("--scale", choices=list(SCALES), default="cpu",
                        help="cpu: 2+2 layers × 128, 600 updates; gpu: transformer base (6+6 × 512), 20000 "
                        "updates, --fp16; tiny: 1+1 × 64, 200 updates (checks the pipeline)")
    parser.add_argument("--updates", type=int, help="train this many updates instead of the scale's")
    parser.add_argument("--lr", type=float, help="peak learning rate instead of the scale's")
    parser.add_argument("--warmup", type=int, help="inverse_sqrt warm-up updates instead of the scale's")
    parser.add_argument("--max-tokens", default="4096")
    parser.add_argument("--spm-vocab-size", default="8000", help="sentencepiece pieces (train split only)")
    parser.add_argument("--valid-fraction", type=float, default=0.1, help="of Du's dev sentences, for valid")
    parser.add_argument("--question-pieces", type=int, default=50,
                        help="the source mask also allows this many of the training questions' most frequent "
                        "pieces (0: the sentence's pieces only)")
    add_run_selection(parser, list(METHODS), list(METHODS))
    return parser


def checked_data(parser: argparse.ArgumentParser, args) -> Path:
    """``prepare(args)``, or ``parser``'s one-line error where Du's files are missing or misaligned."""
    generation_runs.check_inputs(parser, "--du2017-dir", args.du2017_dir, DU_FILES,
                                 "Du et al.'s src-/tgt-{dev,test}.txt")
    try:
        return prepare(args)
    except ValueError as err:
        parser.error(str(err))


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.question_pieces < 0:
        parser.error(f"--question-pieces: expected a count >= 0, got {args.question_pieces}")
    if not 0 < args.valid_fraction < 1:
        parser.error(f"--valid-fraction: expected a number between 0 and 1, got {args.valid_fraction}")
    args.out = args.out or Path(__file__).parent / args.scale
    data = checked_data(parser, args)
    args.allowed = question_pieces(data, args.question_pieces)
    results = generation_runs.collect(args.out, {m: METHODS[m] for m in args.methods}, args.seeds,
                                      lambda m, s: train_and_test(args, data, m, s), args.table_only)
    command = command_line(__file__, argv)
    generation_runs.write(args.out, command, results, list(DECODINGS), scoring(args), "grouped",
                          coverage_text(data, args.allowed) + "\n")

if __name__ == "__main__":
    main()
