"""What both scoring scripts share: their common options, bootstrap intervals, the table and the JSON."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from .inputs import FORMATS, REMOVE_BPE, Pairs, load_pairs


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """Options for reading hypotheses and references, and for the output; the same in both scripts."""
    parser.add_argument("hypotheses", help="plain text, one hypothesis per line, or a fairseq-generate "
                        "output (its H- lines, sorted by sentence id)")
    parser.add_argument("--refs", metavar="FILE", help="references, one per line, aligned with the "
                        "hypotheses; default: the T- lines of a fairseq-generate output")
    parser.add_argument("--format", choices=FORMATS, default="auto",
                        help="how to read HYPOTHESES; auto = fairseq-generate output if it has H-<id> lines "
                        "(default: %(default)s)")
    parser.add_argument("--remove-bpe", choices=REMOVE_BPE, default="none",
                        help="undo subword segmentation on model output (hypotheses and T- lines, not a --refs "
                        "file), as fairseq's --post-process does; 'none' if fairseq-generate already ran with "
                        "--post-process (default: %(default)s)")
    parser.add_argument("--allow-subwords", action="store_true",
                        help="score text that still has subword markers (sentencepiece '▁', subword-nmt '@@') as it is; "
                        "by default such text is refused, since it is almost always a forgotten --remove-bpe")
    parser.add_argument("--bootstrap", type=int, default=0, metavar="N",
                        help="also give a 95%% confidence interval from N bootstrap resamples of the examples "
                        "(0 = off; 1000 is usual)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the bootstrap resampling")
    parser.add_argument("--json", metavar="PATH", help="write scores, settings, counts and per-example scores "
                        "as JSON to PATH ('-' = stdout, the table then goes to stderr)")


def load(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Pairs:
    """The hypothesis/reference pairs the options name (an ``InputError`` if they cannot be scored)."""
    if args.bootstrap < 0:
        parser.error(f"--bootstrap: expected a number of resamples >= 0, got {args.bootstrap}")
    return load_pairs(args.hypotheses, args.refs, fmt=args.format, bpe=args.remove_bpe,
                      allow_subwords=args.allow_subwords)


def progress(items: Iterable, total: int, what: str) -> Iterable:
    """A progress bar on an interactive terminal (stderr), nothing in logs."""
    from tqdm import tqdm

    return tqdm(items, total=total, desc=what, unit=" ex", disable=None, mininterval=0.5, leave=False)


def bootstrap_interval(statistic: Callable[[np.ndarray], np.ndarray], items: int, resamples: int,
                       seed: int, level: float = 0.95, chunk: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of ``statistic(weights)`` over resamples of the items with replacement.

    A resample is a vector of how often each item was drawn, so corpus-level scores (BLEU's summed
    counts) and means of per-example scores are recomputed exactly by a weighted sum.
    """
    rng = np.random.default_rng(seed)
    uniform = np.full(items, 1.0 / items)
    values = []
    for start in range(0, resamples, chunk):
        weights = rng.multinomial(items, uniform, size=min(chunk, resamples - start))
        values.append(statistic(weights))
    values = np.concatenate(values)
    tail = (1 - level) / 2 * 100
    return np.percentile(values, tail, axis=0), np.percentile(values, 100 - tail, axis=0)


@dataclass
class Report:
    """Scores in [0, 1] by name; printed ×100 with 2 decimals as the papers do, kept unrounded in JSON."""

    title: str
    scores: dict[str, float]
    counts: dict[str, int]
    settings: dict[str, object]
    per_example: list[dict] = field(default_factory=list)
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    extra_lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.counts.get("empty_hypotheses"):
            self.notes.append(f"{self.counts['empty_hypotheses']} empty hypotheses, scored as zero")

    def add_bootstrap(self, statistic: Callable[[np.ndarray], np.ndarray], items: int, resamples: int,
                      seed: int) -> None:
        """Intervals for every score; ``statistic(weights)`` gives the scores' columns in their order."""
        if resamples:
            low, high = bootstrap_interval(statistic, items, resamples, seed)
            self.intervals = {name: (float(lo), float(hi)) for name, lo, hi in zip(self.scores, low, high)}

    def table(self) -> str:
        width = max(len(name) for name in self.scores)
        ci = bool(self.intervals)
        lines = [self.title, f"{'metric':<{width}}  {'score':>6}" + ("  95% CI" if ci else "")]
        for name, value in self.scores.items():
            row = f"{name:<{width}}  {100 * value:6.2f}"
            if name in self.intervals:
                low, high = self.intervals[name]
                row += f"  [{100 * low:.2f}, {100 * high:.2f}]"
            lines.append(row)
        lines += self.extra_lines
        lines.append(", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in self.counts.items()))
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "scale": "percent",
            "scores": {k: 100 * v for k, v in self.scores.items()},
            "confidence_95": {k: [100 * lo, 100 * hi] for k, (lo, hi) in self.intervals.items()},
            "counts": self.counts,
            "settings": self.settings,
            "notes": self.notes,
            "per_example": self.per_example,
        }

    def emit(self, json_path: str | None) -> None:
        """Print the table; write the JSON to a file, or to stdout with the table moved to stderr."""
        print(self.table(), file=sys.stderr if json_path == "-" else sys.stdout)
        if json_path is None:
            return
        text = json.dumps(self.to_json(), indent=1, ensure_ascii=False)
        if json_path == "-":
            print(text)
        else:
            with open(json_path, "w", encoding="utf-8") as f:
                f.write(text + "\n")


def common_settings(args: argparse.Namespace) -> dict[str, object]:
    """The settings of ``add_input_arguments`` as they go into the JSON."""
    return {"hypotheses": args.hypotheses, "references": args.refs or "T- lines", "format": args.format,
            "remove_bpe": args.remove_bpe, "allow_subwords": args.allow_subwords, "bootstrap": args.bootstrap,
            "seed": args.seed}


def percent_rows(names: Sequence[str], values: np.ndarray) -> dict[str, float]:
    """Per-example scores as a JSON row (×100, like the table)."""
    return {name: 100 * float(v) for name, v in zip(names, values)}
