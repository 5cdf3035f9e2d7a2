#!/usr/bin/env python
"""Wall-clock of ``data-prep/prepare_gigaword.py`` on a synthetic Gigaword-sized stand-in, against stock
``fairseq-preprocess`` on the same raw text timed in the same run.

The real data cannot be shipped, so this writes ``--pairs`` random article/title pairs (20–40 and 6–12
words from a ``--vocab``-word vocabulary, harvardnlp file names) and times: our text stage alone
(``--text-only``: reading, checks, counts), our whole script (plus sentencepiece training and encoding,
fairseq-preprocess and the read-back of every split), and the baseline, plain ``fairseq-preprocess
--joined-dictionary`` on the raw whitespace tokens (what a user would run without our script: no
checks, no subwords).

    python benchmarks/prep_speed.py                       # 200k pairs; table -> benchmarks/results/prep_speed.md
"""
from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_corpus(root: Path, pairs: int, vocab_size: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(vocab_size)] + ["UNK", "##", ",", "the", "of"]
    sizes = {"train/train": pairs, "train/valid": 2000, "Giga/test": 1951}
    names = {"train/train": ("train.article.txt", "train.title.txt"),
             "train/valid": ("valid.article.filter.txt", "valid.title.filter.txt"),
             "Giga/test": ("input.txt", "task1_ref0.txt")}
    for key, count in sizes.items():
        folder = root / key.split("/")[0]
        folder.mkdir(parents=True, exist_ok=True)
        for name, (low, high) in zip(names[key], ((20, 40), (6, 12))):
            with open(folder / name, "w", encoding="utf-8") as f:
                for _ in range(count):
                    f.write(" ".join(rng.choices(vocab, k=rng.randint(low, high))) + "\n")


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--vocab", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "prep_speed.md")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    write_corpus(tmp / "raw", args.pairs, args.vocab)
    prep = [sys.executable, str(ROOT / "data-prep" / "prepare_gigaword.py"), str(tmp / "raw")]
    baseline_text = tmp / "baseline-text"
    baseline_text.mkdir()
    for split, (src, tgt) in {"train": ("train/train.article.txt", "train/train.title.txt"),
                              "valid": ("train/valid.article.filter.txt", "train/valid.title.filter.txt"),
                              "test": ("Giga/input.txt", "Giga/task1_ref0.txt")}.items():
        (baseline_text / f"{split}.src").symlink_to(tmp / "raw" / src)
        (baseline_text / f"{split}.tgt").symlink_to(tmp / "raw" / tgt)
    rows = [
        ("ours, text stage (--text-only)", timed([*prep, str(tmp / "text"), "--text-only"])),
        ("ours, whole script (32k sentencepiece + fairseq-preprocess)",
         timed([*prep, str(tmp / "full"), "--workers", str(args.workers)])),
        ("baseline: fairseq-preprocess on raw words",
         timed([sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", "src", "--target-lang", "tgt",
                "--joined-dictionary", "--workers", str(args.workers), "--destdir", str(tmp / "baseline"),
                *[a for split in ("train", "valid", "test") for a in (f"--{split}pref", str(baseline_text / split))]])),
    ]
    shutil.rmtree(tmp)
    base = rows[-1][1]
    table = "\n".join(
        [f"{args.pairs:,} synthetic training pairs (+2,000 valid, 1,951 test), {args.vocab:,}-word vocabulary, "
         f"--workers {args.workers}\n", "| step | seconds | ÷ baseline |", "|---|---:|---:|"]
        + [f"| {name} | {seconds:.1f} | {seconds / base:.2f} |" for name, seconds in rows]
    )
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table + f"\n\nCommand: `python benchmarks/prep_speed.py --pairs {args.pairs} --vocab "
                        f"{args.vocab} --workers {args.workers}`\n", encoding="utf-8")


if __name__ == "__main__":
    main()
