#!/usr/bin/env python
"""Write a small, learnable toy "summarisation" corpus as ``{train,valid,test}.{src,tgt}``.

Each source line mixes content words (``w0``…) with filler words (``the``, ``of``…); its target is the
content words in order. Every target token occurs in its source, so the task also exercises
source-vocabulary masking, and a tiny transformer learns it in a few hundred CPU updates. It is the
bundled default of the README's end-to-end job (``--layout harvard``: written as harvardnlp's Gigaword
files, for ``prepare_gigaword.py``) and the data of the end-to-end tests.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

from prepare_gigaword import HARVARD

FILLER = ["the", "of", "a", "in", "to", "and", "is", "for", "on", "that"]


def make_pair(rng: random.Random, n_content: int, min_len: int, max_len: int) -> tuple[str, str]:
    length = rng.randint(min_len, max_len)
    words = [f"w{rng.randrange(n_content)}" if rng.random() < 0.5 else rng.choice(FILLER) for _ in range(length)]
    if not any(w.startswith("w") for w in words):
        words[rng.randrange(length)] = f"w{rng.randrange(n_content)}"
    return " ".join(words), " ".join(w for w in words if w.startswith("w"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--train", type=int, default=2000, help="training pairs (default 2000)")
    parser.add_argument("--valid", type=int, default=100, help="validation pairs (default 100)")
    parser.add_argument("--test", type=int, default=100, help="test pairs (default 100)")
    parser.add_argument("--content-words", type=int, default=30, help="content vocabulary size (default 30)")
    parser.add_argument("--min-len", type=int, default=3)
    parser.add_argument("--max-len", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--layout", choices=("fairseq", "harvard"), default="fairseq",
                        help="fairseq: {split}.{src,tgt}; harvard: harvardnlp Gigaword file names, train/ and Giga/")
    args = parser.parse_args(argv)
    if not 1 <= args.min_len <= args.max_len:
        parser.error(f"need 1 <= --min-len <= --max-len, got {args.min_len}, {args.max_len}")
    rng = random.Random(args.seed)
    for split, count in (("train", args.train), ("valid", args.valid), ("test", args.test)):
        pairs = [make_pair(rng, args.content_words, args.min_len, args.max_len) for _ in range(count)]
        for side, idx in (("src", 0), ("tgt", 1)):
            if args.layout == "fairseq":
                path = args.out_dir / f"{split}.{side}"
            else:  # harvardnlp: train and valid files in train/, the test set in Giga/
                path = args.out_dir / ("" if split == "test" else "train") / HARVARD[split][idx]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(p[idx] + "\n" for p in pairs), encoding="utf-8")
        print(f"{split}: {count} pairs -> {args.out_dir}")


if __name__ == "__main__":
    main()
