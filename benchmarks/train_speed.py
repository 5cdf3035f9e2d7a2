#!/usr/bin/env python
"""End-to-end training speed through ``fairseq-train``: words per second of each criterion, with and
without ``--fused-output-layer``, against ``--criterion cross_entropy`` in the same run.

A synthetic corpus (``data-prep/make_toy_data.py``) with a ``--vocab``-word vocabulary (32k by default,
a sentencepiece-sized output layer) is binarised once; every run trains the same transformer on the
same batches with the same seed for ``--updates`` updates, and its speed is the median of fairseq's
``wps`` over its ``train_inner`` records after the first (which includes start-up). The runs are
interleaved in a shuffled order per repeat, and the table gives the median over repeats.

The sparse losses pay off in the output layer's backward; how much of a model's work that layer is
depends on its size: about half for 2+2 layers × 256 with 32k words, far less for 6+6 × 512. AS-Softmax
starts dense (an untrained model's target probability is below δ on every row), so a short run from
scratch shows its cost at the start of training, not the speed-up that comes as rows get masked;
the logged ``dense_ratio`` says how many rows were dense.

On a GPU the small models leave it idle most of an update: fairseq's Python and kernel launches set the pace,
and every criterion trains at one speed. ``--models wide`` (2+2 layers × 2048, the width of 1B-parameter
language models with 128k-word vocabularies) with ``--vocab 128000`` and longer pairs (``--lengths``) is sized to
give the GPU more work an update than the CPU, so that the output layer can set the pace.

    python benchmarks/train_speed.py                        # both models, ~50 minutes on 2 CPU cores
    python benchmarks/train_speed.py --models small --repeats 3
    python benchmarks/train_speed.py --device cuda --precision bf16 --max-tokens 16384 --repeats 3 --profile
    python benchmarks/train_speed.py --device cuda --precision bf16 --models wide --vocab 128000 --pairs 40000 \
        --lengths 20 60 --max-tokens 40960 --criteria "cross_entropy;sparse_softmax, fused;as_softmax, fused"

``--profile`` adds where an update's time goes, for cross_entropy and the sparse fused layer
(``profile_train.py``): a GPU that trains every criterion at one speed may be waiting for the CPU. On CUDA it
also profiles cross_entropy with PyTorch's cuDNN attention, which the plugin turns off (``fairseq_compat`` fix
10), to show what that saves.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

from measure import (BIN, ROOT, command_line, device_name, grouped_bars, json_records, pyplot, run, transformer_size,
                     write_results)


MODELS = {"small": transformer_size(2, 256, 4), "large": transformer_size(6, 512, 8),
          "wide": transformer_size(2, 2048, 16)}
MODEL_NAMES = {"small": "2+2 layers × 256", "large": "6+6 layers × 512", "wide": "2+2 layers × 2048"}
CRITERIA = {
    "cross_entropy": ["--criterion", "cross_entropy"],
    "softmax, fused": ["--criterion", "softmax", "--fused-output-layer"],
    "sparse_softmax": ["--criterion", "sparse_softmax", "--sparse-topk", "10"],
    "sparse_softmax, fused": ["--criterion", "sparse_softmax", "--sparse-topk", "10", "--fused-output-layer"],
    "as_softmax": ["--criterion", "as_softmax", "--as-delta", "0.3"],
    "as_softmax, fused": ["--criterion", "as_softmax", "--as-delta", "0.3", "--fused-output-layer"],
}
BASELINE = "cross_entropy"
#: what ``--profile`` profiles (label: criterion and profile_train.py flags), and which updates of the run
PROFILED = {BASELINE: (BASELINE, []), "sparse_softmax, fused": ("sparse_softmax, fused", []),
            "cross_entropy, cuDNN attention": (BASELINE, ["--cudnn-attention"])}
PROFILE_SKIP, PROFILE_UPDATES = 10, 10
#: fairseq-train flags per --device and per --precision (fairseq's fp16 optimizer needs CUDA).
DEVICE_FLAGS = {"cpu": ["--cpu"], "cuda": []}
PRECISION_FLAGS = {"fp32": [], "bf16": ["--bf16"], "fp16": ["--fp16"]}


def prepare(work: Path, vocab: int, pairs: int, lengths: tuple[int, int]) -> Path:
    name = f"{vocab}-{pairs}-{lengths[0]}-{lengths[1]}"
    data = work / f"data-{name}"
    if not (data / "dict.src.txt").exists():
        raw = work / f"raw-{name}"
        run([sys.executable, ROOT / "data-prep" / "make_toy_data.py", raw, "--train", pairs, "--valid", 100,
             "--test", 100, "--content-words", vocab, "--min-len", lengths[0], "--max-len", lengths[1]])
        run([BIN / "fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--joined-dictionary",
             "--workers", 2, "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
             "--destdir", data])
    return data


def train_args(data: Path, model: str, criterion: str, updates: int, args) -> list:
    """The fairseq-train arguments of one run."""
    return [data, "--user-dir", ROOT / "user_dir", "--task", "sparse_seq2seq",
            *DEVICE_FLAGS[args.device], *PRECISION_FLAGS[args.precision],
            "--arch", "transformer", *MODELS[model], "--share-all-embeddings", *CRITERIA[criterion],
            "--optimizer", "adam", "--lr", "0.0005", "--max-tokens", args.max_tokens,
            "--max-update", updates, "--disable-validation", "--no-save", "--num-workers", "0",
            "--log-format", "json", "--log-interval", args.log_interval, "--seed", 1]


def words_per_second(data: Path, model: str, criterion: str, args) -> tuple[float, str]:
    """Median wps after the first logged interval, and the AS runs' mean dense ratio."""
    output = run([BIN / "fairseq-train", *train_args(data, model, criterion, args.updates, args)])
    records = json_records(output, "train_inner")[1:]
    dense = [float(r["dense_ratio"]) for r in records if "dense_ratio" in r]
    return statistics.median(float(r["wps"]) for r in records), f"{statistics.mean(dense):.2f}" if dense else ""


def speed_rows(data: Path, model: str, args) -> list[dict]:
    """Words/s of every criterion for one model: the median over interleaved repeats, each in a shuffled order,
    and its ratio to the baseline's."""
    speeds: dict[str, list[float]] = {name: [] for name in args.criteria}
    dense: dict[str, str] = {}
    order = list(args.criteria)
    for repeat in range(args.repeats):
        random.Random(repeat).shuffle(order)
        for criterion in order:
            wps, dense[criterion] = words_per_second(data, model, criterion, args)
            speeds[criterion].append(wps)
            print(f"{MODEL_NAMES[model]:>18} {criterion:>22}: {wps:8.0f} words/s", flush=True)
    base = statistics.median(speeds[BASELINE])
    return [{"model": MODEL_NAMES[model], "criterion": criterion, "wps": statistics.median(values),
             "ratio": statistics.median(values) / base, "dense": dense[criterion]}
            for criterion, values in speeds.items()]


def profile_lines(data: Path, model: str, args) -> list[str]:
    """Table rows of where an update's time goes (``profile_train.py``) for each of ``PROFILED``: milliseconds per
    update, over the profiled ones."""
    lines = []
    for label, (criterion, flags) in PROFILED.items():
        if criterion not in args.criteria or "--cudnn-attention" in flags and args.device != "cuda":
            continue  # not asked for, or a CPU, which has no cuDNN attention
        output = run([sys.executable, ROOT / "benchmarks" / "profile_train.py", "--profile-skip", PROFILE_SKIP,
                      "--profile-updates", PROFILE_UPDATES, *flags,
                      *train_args(data, model, criterion, PROFILE_SKIP + PROFILE_UPDATES + 1, args)])
        p = json.loads(output.rsplit("profile | ", 1)[1].splitlines()[0])
        regions = p["regions_ms"]
        gpu = "" if p["gpu_busy_ms"] is None else f"{p['gpu_busy_ms']:.1f}"
        lines.append(f"| {MODEL_NAMES[model]} | {label} | {p['wall_ms']:.1f} | {p['outside_step_ms']:.1f} | "
                     + " | ".join(f"{regions.get(r, 0.0):.1f}" for r in ("forward", "backward", "clip-grads",
                                                                         "optimizer")) + f" | {gpu} |")
    return lines


def plot(rows: list[dict], path: Path) -> None:
    fig, ax = pyplot().subplots(figsize=(9, 4))
    grouped_bars(ax, rows, "model", "criterion", "ratio", "fairseq-train words/s ÷ cross_entropy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def chosen(parser: argparse.ArgumentParser, option: str, value: str, separator: str, known: dict) -> list[str]:
    """The names in ``value``, each checked against ``known``: a misspelt one stops the run before any training."""
    names = [name.strip() for name in value.split(separator)]
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"{option}: unknown {', '.join(map(repr, unknown))}; expected {separator!r}-separated names "
                     f"of: {'; '.join(known)}")
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="small,large", help="comma-separated, of: " + ", ".join(MODELS))
    parser.add_argument("--vocab", type=int, default=32000, help="content words of the synthetic corpus")
    parser.add_argument("--pairs", type=int, default=60000, help="training pairs of the synthetic corpus")
    parser.add_argument("--lengths", type=int, nargs=2, default=(3, 12), metavar=("MIN", "MAX"),
                        help="source words a pair (its target is their content words, about half)")
    parser.add_argument("--criteria", default=";".join(CRITERIA),
                        help=f"semicolon-separated, of: {'; '.join(CRITERIA)} ({BASELINE}, the baseline, is always "
                             "run)")
    parser.add_argument("--updates", type=int, default=25)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--device", choices=DEVICE_FLAGS, default="cpu")
    parser.add_argument("--precision", choices=PRECISION_FLAGS, default="fp32",
                        help="fairseq-train's --bf16 / --fp16 (fp16 on CUDA only)")
    parser.add_argument("--work", type=Path, default=ROOT / "work-dirs" / "train_speed")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "train_speed",
                        help="writes OUT.md (table) and OUT.png (plot)")
    parser.add_argument("--profile", action="store_true",
                        help=f"also profile updates {PROFILE_SKIP + 1}-{PROFILE_SKIP + PROFILE_UPDATES} of one "
                             f"more run each of {'; '.join(PROFILED)} (the last on CUDA only): where an update's "
                             "time goes")
    args = parser.parse_args(argv)
    if args.updates < 2 * args.log_interval:
        parser.error(f"--updates must be at least twice --log-interval ({args.log_interval}): the speed is read "
                     "from the logged intervals after the first")
    if args.precision == "fp16" and args.device == "cpu":
        parser.error("--precision fp16 needs --device cuda (fairseq's fp16 optimizer runs on CUDA only)")
    models = chosen(parser, "--models", args.models, ",", MODELS)
    args.criteria = list(dict.fromkeys([BASELINE, *chosen(parser, "--criteria", args.criteria, ";", CRITERIA)]))
    data = prepare(args.work, args.vocab, args.pairs, args.lengths)
    symbols = len((data / "dict.tgt.txt").read_text(encoding="utf-8").splitlines())
    rows = [row for model in models for row in speed_rows(data, model, args)]
    command = command_line(__file__, argv)
    lines = [f"`{command}`", "",
             (f"{args.vocab} content words ({symbols} dictionary symbols), {args.lengths[0]}–{args.lengths[1]} "
              "source words a pair, transformer with shared embeddings, "
              f"--max-tokens {args.max_tokens}, {args.updates} updates per run, median of {args.repeats} "
              f"interleaved repeat(s); {device_name(args.device)}, {args.precision}."), "",
             "| model | criterion | words/s | × cross_entropy | AS dense rows |", "|---|---|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['criterion']} | {r['wps']:.0f} | {r['ratio']:.2f} | {r['dense']} |" for r in rows]
    write_results(args.out, lines, lambda path: plot(rows, path))  # kept if the profiled runs do not finish
    if args.profile:
        lines += ["", f"Where an update's time goes (`benchmarks/profile_train.py`, updates {PROFILE_SKIP + 1}–"
                      f"{PROFILE_SKIP + PROFILE_UPDATES} of one more run each), ms per update: the wall from one "
                      "update's start to the next, the part outside `train_step`, fairseq's marked regions (CPU "
                      "time) and the GPU's kernels.", "",
                  "| model | run | wall | outside step | forward | backward | clip-grads | optimizer "
                  "| GPU busy |", "|---|---|---:|---:|---:|---:|---:|---:|---:|",
                  *(line for model in models for line in profile_lines(data, model, args))]
        write_results(args.out, lines, lambda path: plot(rows, path))


if __name__ == "__main__":
    main()
