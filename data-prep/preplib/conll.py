"""CoNLL-format token classification (CoNLL-2003 NER) → fairseq's RoBERTa layout, one label per piece.

A CoNLL file has one token per line (``word POS chunk NER``, columns separated by spaces or tabs),
sentences separated by blank lines, and ``-DOCSTART-`` lines between documents (dropped, counted).
Sentences are written as ``{split}.input0`` (words) and ``{split}.word_label`` (their tags). After
sentencepiece has split the words, each word's first piece gets the word's tag and its other pieces
``IGNORE_LABEL``, which ``--task text_classification --token-level`` neither trains nor scores: the
entities are scored on words, as conlleval does.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, NamedTuple

from sparse_softmax.metrics import entities

from .classification import LabelCounts
from .textio import InvalidExample, PairWriter, PrepError, SplitCounts, decode_line, require_file

#: The label of a word's pieces after its first (the task's ``--ignore-label`` default).
IGNORE_LABEL = "X"
WORD_START = "\u2581"  # sentencepiece's word-boundary mark: every word's first piece starts with it


class Sentence(NamedTuple):
    path: Path
    line: int  # the line of its first word; the others follow, one a line
    words: list[str]
    tags: list[str]


@dataclass
class TagCounts(LabelCounts):
    """A split's tags (how often, where each first occurs), its tokens, and its entities per type by conlleval's
    chunk rules."""
    tokens: int = 0
    entities: Counter = field(default_factory=Counter)

    def summary(self, split: str) -> str:
        kinds = ", ".join(f"{kind} {n:,}" for kind, n in sorted(self.entities.items())) or "none"
        return f"{split}: {self.tokens:,} tokens; entities {sum(self.entities.values()):,} ({kinds})"


def column_name(label_column: int) -> str:
    """``--label-column`` as a user reads it."""
    if label_column == -1:
        return "the last column"
    return f"column {label_column} ({'from the end' if label_column < 0 else '0-based'})"


def read_conll(path: Path, label_column: int, counts: SplitCounts,
               skip_invalid: bool = False) -> Iterator[Sentence]:
    """The sentences of a CoNLL file. A sentence with a line that is not UTF-8 is an error, or with
    ``skip_invalid`` read and skipped whole."""
    require_file(path, "CoNLL tokens")
    words: list[str] = []
    tags: list[str] = []
    start = 0
    invalid: InvalidExample | None = None
    for number, raw in enumerate(path.read_bytes().splitlines() + [b""], 1):
        try:
            columns = decode_line(raw, path, number, counts).split()
        except InvalidExample as err:
            if not skip_invalid:
                raise
            invalid, start = invalid or err, start or number  # the sentence is skipped at its end
            continue
        if columns and columns[0] == "-DOCSTART-":
            counts.edited["-DOCSTART- lines dropped"] += 1
            columns = []
        if not columns:
            if invalid is not None:
                counts.read += 1
                counts.skipped[invalid.reason] += 1
            elif words:
                yield Sentence(path, start, words, tags)
            words, tags, start, invalid = [], [], 0, None
            continue
        if len(columns) < 2 or not -len(columns) <= label_column < len(columns) or label_column in (0, -len(columns)):
            raise PrepError(f"{path}:{number}: expected 'word ... label' columns with the label in "
                            f"{column_name(label_column)}, got {len(columns)} column(s)")
        if columns[label_column] == IGNORE_LABEL:
            raise PrepError(f"{path}:{number}: the tag {IGNORE_LABEL!r} is reserved for non-initial word pieces")
        start = start or number
        words.append(columns[0])
        tags.append(columns[label_column])


def write_split(out: Path, split: str, sentences: Iterator[Sentence], counts: SplitCounts) -> TagCounts:
    """Write ``{split}.input0`` / ``{split}.word_label``; returns what the split holds."""
    written = TagCounts()
    with PairWriter(out / split, counts, sides=("input0", "word_label")) as writer:
        for sentence in sentences:
            counts.read += 1
            writer.write(" ".join(sentence.words), " ".join(sentence.tags))
            for i, tag in enumerate(sentence.tags):
                written.add(tag, f"{sentence.path}:{sentence.line + i}")
            written.tokens += len(sentence.tags)
            written.entities.update(kind for _, _, kind in entities(sentence.tags))
    return written


def piece_labels(out: Path, split: str) -> None:
    """``{split}.word_label`` + ``{split}.spm.input0`` → ``{split}.label``: a tag per piece."""
    pieces_path, tags_path = out / f"{split}.spm.input0", out / f"{split}.word_label"
    with open(pieces_path, encoding="utf-8") as pieces_file, open(tags_path, encoding="utf-8") as tags_file, \
            open(out / f"{split}.label", "w", encoding="utf-8") as labels:
        for number, (pieces_line, tags_line) in enumerate(zip(pieces_file, tags_file, strict=True), 1):
            tags = iter(tags_line.split())
            try:
                row = [next(tags) if piece.startswith(WORD_START) else IGNORE_LABEL for piece in pieces_line.split()]
            except StopIteration:
                row = None
            if row is None or next(tags, None) is not None or (row and row[0] == IGNORE_LABEL):
                raise PrepError(f"{pieces_path}:{number}: the pieces do not split into the words of "
                                f"{tags_path}:{number} (a word must start with a {WORD_START!r} piece)")
            labels.write(" ".join(row) + "\n")
