"""Reading and writing parallel text line by line, with every problem named by file and line.

Bad lines (not UTF-8, empty after whitespace normalisation) are errors unless the user asks to skip
them; skipped pairs are counted by reason and reported. Line-count mismatches are always errors:
after one, no pair can be trusted.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Iterator


class PrepError(ValueError):
    """Bad input, with the file and line (or record id) it was found at."""


@dataclass
class SplitCounts:
    """What went into one split and what came out; skips and edits by reason."""

    read: int = 0
    written: int = 0
    skipped: Counter = field(default_factory=Counter)
    edited: Counter = field(default_factory=Counter)

    def summary(self, name: str) -> str:
        parts = [f"{name}: {self.read} in, {self.written} out"]
        parts += [f"skipped {n} ({why})" for why, n in sorted(self.skipped.items())]
        parts += [f"{why}: {n}" for why, n in sorted(self.edited.items())]
        return "; ".join(parts)

    def as_dict(self) -> dict:
        return {"read": self.read, "written": self.written, "skipped": dict(self.skipped), "edited": dict(self.edited)}


def require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise PrepError(f"{path}: no such file ({what})")
    return path


def decode(raw: bytes, path: Path, first_line: int = 1) -> str:
    """``raw`` (a line, or a whole file) as UTF-8, or an error naming the line and column of the bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = first_line + raw.count(b"\n", 0, err.start)
        column = err.start - raw.rfind(b"\n", 0, err.start)
        raise PrepError(f"{path}:{line}: not UTF-8 (byte 0x{raw[err.start]:02x} at column {column})") from None


def normalize(text: str) -> str:
    """Whitespace runs (tabs, carriage returns, Unicode spaces) to one space, none at the ends: fairseq
    and sentencepiece read lines, and a stray carriage return would split one."""
    return " ".join(text.split())


def read_parallel(src: Path, tgt: Path, counts: SplitCounts, *, skip_invalid: bool) -> Iterator[tuple[str, str]]:
    """Aligned (source, target) lines as they are (line ends removed), from two files of equal line count.

    A pair with an empty side or a non-UTF-8 side is an error naming the file and line, or, with
    ``skip_invalid``, skipped and counted in ``counts.skipped``.
    """
    with open(src, "rb") as fs, open(tgt, "rb") as ft:
        for number, (raw_s, raw_t) in enumerate(zip_longest(fs, ft), 1):
            if raw_s is None or raw_t is None:
                longer, shorter = (src, tgt) if raw_t is None else (tgt, src)
                rest = 1 + sum(1 for _ in (fs if raw_t is None else ft))
                raise PrepError(f"{shorter} has {number - 1} lines but {longer} has {number - 1 + rest}: "
                                "source and target files must have one line per pair")
            counts.read += 1
            try:
                pair = tuple(decode(raw, path, number).rstrip("\r\n") for raw, path in ((raw_s, src), (raw_t, tgt)))
            except PrepError:
                if not skip_invalid:
                    raise
                counts.skipped["not UTF-8"] += 1
                continue
            empty = [path for path, text in zip((src, tgt), pair) if not text.split()]
            if empty:
                if not skip_invalid:
                    raise PrepError(f"{empty[0]}:{number}: empty line (use --skip-invalid to skip such pairs, counted)")
                counts.skipped["empty line"] += 1
                continue
            yield pair


def truncate(text: str, max_tokens: int | None, counts: SplitCounts, side: str) -> str:
    """The first ``max_tokens`` whitespace tokens; each truncation is counted."""
    if max_tokens is None:
        return text
    tokens = text.split()
    if len(tokens) <= max_tokens:
        return text
    counts.edited[f"{side} truncated to {max_tokens} tokens"] += 1
    return " ".join(tokens[:max_tokens])


class PairWriter:
    """Writes the sides of one split together (``{prefix}.{side}``, one line each) and counts the examples.

    With ``references`` it also keeps each example's reference exactly as read in that file (the test
    split's ``test.ref``, what the scoring scripts compare with).
    """

    def __init__(self, prefix: Path, counts: SplitCounts, sides: tuple[str, ...] = ("src", "tgt"),
                 references: Path | None = None) -> None:
        self.counts = counts
        self.files = [open(f"{prefix}.{side}", "w", encoding="utf-8") for side in sides]
        self.references = open(references, "w", encoding="utf-8") if references is not None else None

    def write(self, *texts: str, reference: str | None = None) -> None:
        for f, text in zip(self.files, texts, strict=True):
            f.write(text + "\n")
        if self.references is not None:
            self.references.write(reference + "\n")
        self.counts.written += 1

    def __enter__(self) -> "PairWriter":
        return self

    def __exit__(self, *exc) -> None:
        for f in [*self.files, *([self.references] if self.references else [])]:
            f.close()
