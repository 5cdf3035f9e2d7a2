#!/usr/bin/env python
"""fairseq-train's output, read from stdin, kept whole in a log file and shown as one line per epoch.

    fairseq-train ... --log-format json 2>&1 | python scripts/train_progress.py --log train.log [--max-update N]

Each epoch gives a line with its last update, train loss, valid loss and nll, and the time so far; the end gives
the best valid loss and where the log is. A run that ends without fairseq's "done training" (an error, a kill)
shows the log's last lines and exits with status 1, so a script with ``set -o pipefail`` stops there, with the
error in sight, rather than going on.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import deque
from pathlib import Path

TAIL = 20  # lines of the log shown when the run did not finish


def record(line: str, tag: str) -> dict | None:
    """fairseq's ``--log-format json`` record of kind ``tag`` on this line, without the ``valid_`` prefixes."""
    if f"| {tag} |" not in line or "{" not in line:
        return None
    try:
        values = json.loads(line[line.index("{"):])
    except json.JSONDecodeError:
        return None
    return {key.removeprefix(f"{tag}_"): value for key, value in values.items()}


def epoch_line(train: dict, valid: dict | None, max_update: int | None) -> str:
    updates = f"{train['num_updates']}" + (f"/{max_update}" if max_update else "")
    text = f"epoch {int(train['epoch']):3d} | update {updates} | train loss {float(train['loss']):.3f}"
    if valid is not None:
        text += f" | valid loss {float(valid['loss']):.3f}"
        if "nll_loss" in valid:
            text += f", nll {float(valid['nll_loss']):.3f}"
    return text + f" | {float(train.get('wall', 0)):.0f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log", type=Path, required=True, help="where fairseq-train's whole output goes")
    parser.add_argument("--max-update", type=int, help="the run's --max-update, shown beside each epoch's update")
    args = parser.parse_args(argv)
    tail: deque[str] = deque(maxlen=TAIL)
    valid, best, finished = None, None, False
    args.log.parent.mkdir(parents=True, exist_ok=True)
    with open(args.log, "w", encoding="utf-8") as log:
        for line in sys.stdin:
            log.write(line)
            log.flush()
            tail.append(line)
            finished = finished or "done training" in line
            if (v := record(line, "valid")) is not None:
                valid = v
                best = v if best is None or float(v["loss"]) < float(best["loss"]) else best
            elif (t := record(line, "train")) is not None:  # fairseq logs an epoch's valid record before it
                print(epoch_line(t, valid, args.max_update), flush=True)
                valid = None
    if not finished:
        print(f"fairseq-train stopped before it finished; the end of {args.log}:", file=sys.stderr)
        sys.stderr.writelines(tail)
        return 1
    if best is not None:
        print(f"best valid loss {float(best['loss']):.3f} (epoch {int(best['epoch'])}); the whole log: {args.log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
