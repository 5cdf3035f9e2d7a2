#!/usr/bin/env python
"""Training speed of ``--arch text_encoder`` against fairseq's RoBERTa shrunk to the same sizes, on
CLINC150 with ``--task text_classification --criterion softmax``, through ``fairseq-train``.

Both runs use the same data, sizes (layers, width, feed-forward, heads), batches and updates, in the
same command; the table gives sentences per second of training (fairseq's ``bsz × ups`` over the run,
validation excluded) and the ratio to RoBERTa.

    python benchmarks/classifier_speed.py                 # needs CLINC150 prepared by the experiment
    python benchmarks/classifier_speed.py --data DIR/data-bin --updates 300
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from measure import BIN, ROOT, command_line, json_records, run

SIZES = ["--encoder-layers", "2", "--encoder-embed-dim", "128", "--encoder-ffn-embed-dim", "256",
         "--encoder-attention-heads", "4"]
ARCHS = {"text_encoder": ["--arch", "text_encoder"], "roberta_base (shrunk)": ["--arch", "roberta_base",
                                                                             "--max-positions", "256"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT / "experiments/clinc150/scratch/work/data/data-bin",
                        help="a text_classification data-bin (default: the CLINC150 experiment's)")
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/classifier_speed.md")
    args = parser.parse_args(argv)
    if not (args.data / "label" / "dict.txt").exists():
        sys.exit(f"{args.data}: no data-bin; run experiments/clinc150/clinc150.py first or pass --data")
    rows = {}
    for name, arch in ARCHS.items():
        start = time.perf_counter()
        output = run([BIN / "fairseq-train", args.data, "--user-dir", ROOT / "user_dir", "--task",
                      "text_classification", *arch, *SIZES, "--criterion", "softmax", "--cpu", "--optimizer", "adam",
                      "--lr", "0.001", "--batch-size", args.batch_size, "--max-update", args.updates,
                      "--disable-validation", "--no-save", "--log-format", "json", "--log-interval", "50",
                      "--num-workers", "0", "--seed", "1"])
        inner = json_records(output, "train_inner")[1:]  # the first interval includes start-up
        sentences = sum(float(r["bsz"]) * 50 for r in inner)
        seconds = sum(50 / float(r["ups"]) for r in inner)
        rows[name] = (sentences / seconds, time.perf_counter() - start)
    base = rows["roberta_base (shrunk)"][0]
    lines = [f"`{command_line(__file__, argv)}`",
             "", "| model | train sentences/s | × roberta | whole command (s) |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {rate:.0f} | {rate / base:.2f} | {total:.0f} |" for name, (rate, total) in rows.items()]
    text = "\n".join(lines)
    print(text)
    args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
