#!/usr/bin/env python
"""Question generation on Du et al. 2017's sentence-level SQuAD split: softmax, label smoothing,
sparse_softmax and as_softmax trained from scratch, each decoded plainly and with the masks, several seeds,
through the real ``fairseq-train`` / ``fairseq-generate`` and ``scripts/score_questions.py``.

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

    python benchmarks/qg_experiment.py                      # 12 runs, ~2 hours on 2 CPU cores
    python benchmarks/qg_experiment.py --scale gpu          # transformer-base size, on a GPU

Data, logs and per-run results go to OUT/work; runs found there (a ``result.json``) are reused, ``--fresh``
re-runs them. Each run's ``result.json`` and ``train.log`` are committed with the default OUT's table, so
seeds can be added without re-running the others; the data (re-made identically from Du's files) and the
predictions are not. OUT gets ``results.md`` (table and command), ``runs.json`` (per-run scores) and
``curves.png``.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from measure import BIN, ROOT, json_records, mean_sd, paired_difference, pyplot, run, transformer_size

sys.path.insert(0, str(ROOT / "scripts"))
from scoring.inputs import parse_fairseq_output  # noqa: E402

DEFAULT_DU_DIR = ROOT.parent / "shared" / "data" / "squad_qg_du2017"
DU_FILES = ["src-dev.txt", "tgt-dev.txt", "src-test.txt", "tgt-test.txt"]
METHODS = {
    "cross_entropy": ["--criterion", "cross_entropy"],
    "label_smoothing": ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"],
    "sparse_softmax": ["--criterion", "sparse_softmax", "--sparse-topk", "10"],
    "as_softmax": ["--criterion", "as_softmax", "--as-delta", "0.3", "--as-warmup-ratio", "0.3"],
}
DECODINGS = {
    "beam 1": ["--beam", "1"],
    "beam 5": ["--beam", "5"],
    "beam 5, top-5 mask": ["--beam", "5", "--decoding-topk", "5"],
    "beam 5, source mask": ["--beam", "5", "--source-vocab-mask"],
}
SCORES = ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L"]
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
    output = run([BIN / "fairseq-generate", data, "--user-dir", ROOT / "user_dir", "--task", "sparse_seq2seq",
                  "--path", checkpoint, "--gen-subset", "test", *flags, "--batch-size", "128",
                  "--max-len-b", "50", "--post-process", "sentencepiece",
                  *(["--cpu"] if "--cpu" in SCALES[args.scale]["device"] else [])])
    hypotheses = parse_fairseq_output("fairseq-generate", output.splitlines()).hypotheses
    sentences = (args.out / "work" / "split" / "src-test.txt").read_text(encoding="utf-8").splitlines()
    if len(hypotheses) != len(sentences):
        sys.exit(f"fairseq-generate gave {len(hypotheses)} hypotheses for {len(sentences)} test sentences")
    question = dict(zip(sentences, hypotheses))
    examples = (args.du2017_dir / "src-test.txt").read_text(encoding="utf-8").splitlines()
    predictions = folder / f"pred-{re.sub(r'[^a-z0-9]+', '-', decoding)}.txt"
    predictions.write_text("".join(question[s] + "\n" for s in examples), encoding="utf-8")
    return predictions


def score(args, predictions: Path, grouped: bool) -> dict[str, float]:
    report = predictions.with_suffix(".grouped.json" if grouped else ".json")
    run([sys.executable, ROOT / "scripts" / "score_questions.py", predictions,
         "--refs", args.du2017_dir / "tgt-test.txt", "--json", report,
         *(["--group-by-source", args.du2017_dir / "src-test.txt"] if grouped else [])])
    scores = json.loads(report.read_text(encoding="utf-8"))["scores"]
    return {name: float(scores[name]) for name in SCORES}


def train_and_test(args, data: Path, method: str, seed: int) -> dict:
    """One run: its scores per decoding (cached in result.json) and its valid nll curve."""
    folder = args.out / "work" / f"{method}-seed{seed}"
    result_file, train_log = folder / "result.json", folder / "train.log"
    scale = SCALES[args.scale]
    updates = args.updates or scale["updates"]
    if not result_file.exists() or args.fresh:
        folder.mkdir(parents=True, exist_ok=True)
        run([BIN / "fairseq-train", data, "--user-dir", ROOT / "user_dir", "--task", "sparse_seq2seq",
             "--arch", "transformer", *scale["model"], "--share-all-embeddings", *scale["device"],
             *METHODS[method], "--seed", seed, "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
             "--lr", args.lr or scale["lr"], "--lr-scheduler", "inverse_sqrt",
             "--warmup-updates", args.warmup or scale["warmup"],
             "--dropout", scale["dropout"], "--max-tokens", args.max_tokens, "--max-update", updates,
             "--validate-interval-updates", max(1, updates // 10),
             "--save-dir", folder / "checkpoints", "--no-epoch-checkpoints", "--no-save-optimizer-state",
             "--log-format", "json", "--log-interval", "10", "--num-workers", "0"], train_log)
        checkpoint = folder / "checkpoints" / "checkpoint_last.pt"
        result = {}
        for decoding in DECODINGS:
            predictions = decode(args, data, checkpoint, decoding, folder)
            result[decoding] = {"predictions": predictions.name, "per example": score(args, predictions, False),
                                "grouped": score(args, predictions, True)}
        result_file.write_text(json.dumps(result, indent=1), encoding="utf-8")
        for file in (folder / "checkpoints").glob("*.pt"):  # the numbers are kept; the weights are not
            file.unlink()
    output = train_log.read_text(encoding="utf-8")
    valid = [{"update": int(r["num_updates"]), "nll": float(r.get("nll_loss", r["loss"]))}
             for r in json_records(output, "valid")]
    train = json_records(output, "train")
    return {"method": method, "seed": seed, "scores": json.loads(result_file.read_text(encoding="utf-8")),
            "valid": valid, "wall": float(train[-1]["wall"])}


def table(results: dict[str, list[dict]], way: str) -> str:
    rows = [f"| method | decoding | {' | '.join(SCORES)} |", "|---|---|" + "---|" * len(SCORES)]
    for method, runs in results.items():
        for decoding in DECODINGS:
            cells = [mean_sd([r["scores"][decoding][way][name] for r in runs]) for name in SCORES]
            rows.append(f"| {method} | {decoding} | {' | '.join(cells)} |")
    return "\n".join(rows)


def differences(results: dict[str, list[dict]]) -> str:
    """Grouped BLEU-4 and ROUGE-L differences paired by seed: each method minus cross-entropy at every decoding,
    and what the top-5 mask changes for each method (its masked beam 5 minus its plain beam 5)."""
    def grouped(runs: list[dict], decoding: str, name: str) -> dict[int, float]:
        return {r["seed"]: r["scores"][decoding]["grouped"][name] for r in runs}

    def cells(runs: list[dict], decoding: str, base_runs: list[dict], base_decoding: str) -> str:
        return " | ".join(paired_difference(grouped(runs, decoding, name), grouped(base_runs, base_decoding, name))
                          for name in ("BLEU-4", "ROUGE-L"))

    rows = ["| difference | decoding | BLEU-4 | ROUGE-L |", "|---|---|---|---|"]
    base = results.get("cross_entropy")
    if base:
        rows += [f"| {method} − cross_entropy | {decoding} | {cells(runs, decoding, base, decoding)} |"
                 for method, runs in results.items() if method != "cross_entropy" for decoding in DECODINGS]
    rows += [f"| {method}: top-5 mask − plain | beam 5 | {cells(runs, 'beam 5, top-5 mask', runs, 'beam 5')} |"
             for method, runs in results.items()]
    return "\n".join(rows)


def training_table(results: dict[str, list[dict]]) -> str:
    rows = ["| method | final valid nll (base 2) | s of training (fairseq's wall) |", "|---|---|---|"]
    for method, runs in results.items():
        rows.append(f"| {method} | {mean_sd([r['valid'][-1]['nll'] for r in runs])} "
                    f"| {statistics.mean(r['wall'] for r in runs):.0f} |")
    return "\n".join(rows)


def plot(results: dict[str, list[dict]], path: Path) -> None:
    fig, (curves, bars) = pyplot().subplots(1, 2, figsize=(15, 4.5))
    for index, (method, runs) in enumerate(results.items()):
        for i, r in enumerate(runs):
            curves.plot([v["update"] for v in r["valid"]], [v["nll"] for v in r["valid"]], color=f"C{index}",
                        alpha=0.7, label=method if i == 0 else None)
    curves.set(title="valid softmax cross-entropy (base 2)", xlabel="update")
    curves.grid(alpha=0.3)
    curves.legend()
    width = 0.8 / len(results)
    for index, (method, runs) in enumerate(results.items()):
        values = [[r["scores"][d]["grouped"]["BLEU-4"] for r in runs] for d in DECODINGS]
        bars.bar([x + index * width for x in range(len(DECODINGS))], [statistics.mean(v) for v in values], width,
                 yerr=[statistics.stdev(v) if len(v) > 1 else 0 for v in values], capsize=3, label=method,
                 color=f"C{index}")
    bars.set_xticks([x + width * (len(results) - 1) / 2 for x in range(len(DECODINGS))], list(DECODINGS))
    bars.set(title="test BLEU-4, grouped by source (Du et al.): mean ± sd over seeds")
    bars.grid(alpha=0.3, axis="y")
    bars.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--du2017-dir", type=Path, default=DEFAULT_DU_DIR,
                        help="Du et al.'s src-/tgt-{dev,test}.txt (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "qg_du2017",
                        help="folder for data, runs, tables and plots")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
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
    parser.add_argument("--fresh", action="store_true", help="re-run runs that already have results")
    args = parser.parse_args(argv)
    if args.question_pieces < 0:
        parser.error(f"--question-pieces: expected a count >= 0, got {args.question_pieces}")
    if not 0 < args.valid_fraction < 1:
        parser.error(f"--valid-fraction: expected a number between 0 and 1, got {args.valid_fraction}")
    missing = [name for name in DU_FILES if not (args.du2017_dir / name).is_file()]
    if missing:
        parser.error(f"--du2017-dir {args.du2017_dir}: no {missing[0]} "
                     "(expected Du et al.'s src-/tgt-{dev,test}.txt)")
    try:
        data = prepare(args)
    except ValueError as err:
        parser.error(str(err))
    args.allowed = question_pieces(data, args.question_pieces)
    results: dict[str, list[dict]] = {m: [] for m in args.methods}
    jobs = [(m, s) for s in args.seeds for m in args.methods]  # interleaved: machine noise hits every method
    for method, seed in tqdm(jobs, desc="training runs", unit="run"):
        results[method].append(train_and_test(args, data, method, seed))
    command = "python benchmarks/qg_experiment.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (f"`{command.strip()}`\n\nTest BLEU / ROUGE-L (%), grouped by source sentence (Du et al.), mean ± sd "
            f"over seeds {args.seeds}:\n\n{table(results, 'grouped')}\n\nPer example (UniLM):\n\n"
            f"{table(results, 'per example')}\n\nGrouped, paired by seed (mean ± sd of the per-seed differences):\n\n"
            f"{differences(results)}\n\nTraining:\n\n{training_table(results)}\n\n"
            f"{coverage_text(data, args.allowed)}\n")
    print(text)
    (args.out / "results.md").write_text(text, encoding="utf-8")
    runs = [{"method": r["method"], "seed": r["seed"], "scores": r["scores"], "final_valid_nll": r["valid"][-1]["nll"],
             "wall": r["wall"]} for runs in results.values() for r in runs]
    (args.out / "runs.json").write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")
    plot(results, args.out / "curves.png")
    print(f"wrote {args.out / 'results.md'} and {args.out / 'curves.png'}")


if __name__ == "__main__":
    main()
