#!/usr/bin/env python
"""Plot loss / nll_loss (and AS-Softmax's masked_ratio when logged) from a fairseq-train log.

The log must come from ``--log-format json``; e.g. ``fairseq-train ... 2>&1 | tee train.log``.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from sparse_softmax.userinput import UserInputError, decode, exit_on_error


def read_records(text: str, path: Path, tag: str) -> list[dict]:
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if f"| {tag} |" in line and "{" in line:
            try:
                records.append(json.loads(line[line.index("{"):]))
            except json.JSONDecodeError as err:
                raise UserInputError(f"{path}:{lineno}: unreadable {tag} record ({err.msg}); was --log-format "
                                     "json used?") from None
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("log", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    args = parser.parse_args(argv)
    with exit_on_error(parser):
        if not args.log.is_file():
            raise UserInputError(f"{args.log}: no such file")
        text = decode(args.log.read_bytes(), args.log)
        train = read_records(text, args.log, "train_inner")
        if not train:
            raise UserInputError(f"{args.log}: no train_inner records (use --log-format json and --log-interval)")
        valid = read_records(text, args.log, "valid")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    masked = "masked_ratio" in train[0]
    fig, axes = plt.subplots(1, 2 if masked else 1, figsize=(10 if masked else 5.5, 3.8), squeeze=False)
    ax = axes[0][0]
    steps = [int(r["num_updates"]) for r in train]
    ax.plot(steps, [float(r["loss"]) for r in train], label="train loss")
    if "nll_loss" in train[0]:  # the multi-label losses log no softmax nll
        ax.plot(steps, [float(r["nll_loss"]) for r in train], label="train nll (plain softmax)")
    if valid and "valid_nll_loss" in valid[0]:
        ax.plot([int(r["valid_num_updates"]) for r in valid], [float(r["valid_nll_loss"]) for r in valid], "o-",
                label="valid nll")
    ax.set_xlabel("update")
    ax.set_ylabel("bits per token")
    ax.legend()
    if masked:
        axes[0][1].plot(steps, [float(r["masked_ratio"]) for r in train])
        axes[0][1].set_xlabel("update")
        axes[0][1].set_title("AS-Softmax masked-token ratio")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"{len(train)} training records, {len(valid)} validation records -> {args.out}")


if __name__ == "__main__":
    main()
