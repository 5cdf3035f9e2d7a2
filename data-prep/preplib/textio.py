"""Reading and writing the examples of a split, with every problem named by file and line.

Bad examples (a line that is not UTF-8, an empty text) are errors unless the user asks to skip
them (``--skip-invalid``); skipped examples are counted by reason and reported. Structural problems
(line-count mismatches, malformed JSON, a missing column) are always errors: after one, no example
of the file can be trusted. A UTF-8 byte-order mark at the start of a file is removed and counted.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Iterator

from sparse_softmax.userinput import BOM_REMOVED, UserInputError, decode, without_bom

#: The help of --skip-invalid, the same in every prep script.
SKIP_INVALID_HELP = ("skip (and count, per reason) the examples that cannot be used instead of stopping at the "
                     "first: a line that is not UTF-8 (in CoNLL files: its sentence), an empty text or target, "
                     "a SQuAD question whose answer does not match its context. Structural problems (different "
                     "line counts, malformed JSON, a missing column) always stop")


class PrepError(UserInputError):
    """Bad input, with the file and line (or record id) it was found at."""


class InvalidExample(PrepError):
    """An example that cannot be used; ``reason`` is what ``--skip-invalid`` counts it under."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class SplitCounts:
    """What went into one split and what came out; skips, edits and examples moved to another split, by reason."""

    read: int = 0
    written: int = 0
    skipped: Counter = field(default_factory=Counter)
    edited: Counter = field(default_factory=Counter)
    moved: Counter = field(default_factory=Counter)
    source: str = ""  # where the split's examples come from, for messages

    def skip_or_raise(self, error: InvalidExample, skip_invalid: bool) -> None:
        """Count ``error`` as a skipped example, or raise it when skipping was not asked for."""
        if not skip_invalid:
            raise error
        self.skipped[error.reason] += 1

    def summary(self, name: str) -> str:
        parts = [f"{name}: {self.read} in, {self.written} out"]
        parts += [f"skipped {n} ({why})" for why, n in sorted(self.skipped.items())]
        parts += [f"{n} {why}" for why, n in sorted(self.moved.items())]
        parts += [f"{why}: {n}" for why, n in sorted(self.edited.items())]
        return "; ".join(parts)

    def as_dict(self) -> dict:
        return {"read": self.read, "written": self.written, "skipped": dict(self.skipped), "edited": dict(self.edited),
                "moved": dict(self.moved)}


def require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise PrepError(f"{path}: no such file ({what})")
    return path


def decode_line(raw: bytes, path: Path, number: int, counts: SplitCounts) -> str:
    """Line ``number`` of ``path`` as text; a byte-order mark opening the file is removed (counted), bytes
    that are not UTF-8 raise ``InvalidExample``."""
    if number == 1:
        raw, had_bom = without_bom(raw)
        if had_bom:
            counts.edited[f"{BOM_REMOVED} ({path.name})"] += 1
    try:
        return decode(raw, path, number)
    except UserInputError as err:
        raise InvalidExample(str(err), "not UTF-8") from None


def read_document(path: Path, what: str) -> str:
    """A whole file (a JSON document) as text. A byte-order mark at its start is dropped without being
    counted: it lies outside the JSON value, so removing it changes no text (RFC 8259 lets readers
    ignore it), while ``json.loads`` would refuse the document."""
    return decode(without_bom(require_file(path, what).read_bytes())[0], path)


def lines(path: Path, counts: SplitCounts, *, skip_invalid: bool) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` for every line of ``path`` that can be read (see ``decode_line``); with
    ``skip_invalid`` the others are counted as read and skipped."""
    for number, raw in enumerate(path.read_bytes().splitlines(), 1):
        try:
            yield number, decode_line(raw, path, number, counts)
        except InvalidExample as err:
            counts.read += 1
            counts.skip_or_raise(err, skip_invalid)


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
                pair = tuple(decode_line(raw, path, number, counts).rstrip("\r\n")
                             for raw, path in ((raw_s, src), (raw_t, tgt)))
                empty = [path for path, text in zip((src, tgt), pair) if not text.split()]
                if empty:
                    raise InvalidExample(f"{empty[0]}:{number}: empty line (use --skip-invalid to skip such "
                                         "pairs, counted)", "empty line")
            except InvalidExample as err:
                counts.skip_or_raise(err, skip_invalid)
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
