"""Text classification data → fairseq's RoBERTa layout: ``input0/`` (sentencepiece pieces, or a pretrained
checkpoint's own tokens) and ``label/`` (one label, or a space-separated label list for multi-label data, per
line), both binarised with ``--only-source``.

Readers yield ``(text, labels)`` per example and name the file and line (or JSON position) of anything
they cannot read. Labels must be single tokens (fairseq reads a label line as space-separated tokens),
and every label of the validation and test splits must occur in training: fairseq would otherwise map
it to ``<unk>`` without a word.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from . import hf_tokenizer as hf
from .binarize import SentencePieceOptions, encode_splits, fairseq_preprocess, split_prefixes
from .textio import InvalidExample, PairWriter, PrepError, SplitCounts, lines, normalize, read_document, require_file

Example = tuple[str, str, list[str]]  # (where it was read, text, labels)

#: CLINC150 ``data_full.json`` keys per split; the ``oos_*`` keys hold the out-of-scope class.
CLINC_KEYS = {"train": "train", "valid": "val", "test": "test"}
SST_FILES = {"train": "stsa.fine.train", "valid": "stsa.fine.dev", "test": "stsa.fine.test"}


def _check_label(label: object, where: str) -> str:
    if not isinstance(label, str) or len(label.split()) != 1 or label != label.strip():
        raise PrepError(f"{where}: a label must be one token without spaces, got {label!r}")
    return label


def clinc150(path: Path, split: str, with_oos: bool) -> Iterator[Example]:
    """CLINC150 ``data_full.json``: ``[text, intent]`` items, plus the ``oos_*`` items when ``with_oos``
    (151 classes, as the AS-Softmax paper)."""
    document = json.loads(read_document(path, "CLINC150 data_full.json"))
    keys = [CLINC_KEYS[split]] + ([f"oos_{CLINC_KEYS[split]}"] if with_oos else [])
    for key in keys:
        items = document.get(key) if isinstance(document, dict) else None
        if not isinstance(items, list):
            raise PrepError(f"{path}: no '{key}' list (expected CLINC150's data_full.json)")
        for i, item in enumerate(items):
            where = f"{path}: {key}[{i}]"
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                raise PrepError(f"{where}: expected [text, intent], got {item!r}")
            yield where, item[0], [_check_label(item[1], where)]


def sst5(folder: Path, split: str, counts: SplitCounts, skip_invalid: bool) -> Iterator[Example]:
    """SST-5 ``stsa.fine.{train,dev,test}``: ``<label 0-4> <sentence>`` per line."""
    path = require_file(folder / SST_FILES[split], f"SST-5 {split}")
    for number, line in lines(path, counts, skip_invalid=skip_invalid):
        label, _, text = line.partition(" ")
        if label not in {"0", "1", "2", "3", "4"}:
            raise PrepError(f"{path}:{number}: expected '<label 0-4> <sentence>', got {line[:60]!r}")
        yield f"{path}:{number}", text, [label]


def tsv(path: Path, multi_label: bool, counts: SplitCounts, skip_invalid: bool) -> Iterator[Example]:
    """``text<TAB>label`` per line; with ``multi_label`` the label field is a space-separated list."""
    require_file(path, "TSV examples")
    for number, line in lines(path, counts, skip_invalid=skip_invalid):
        if "\t" not in line:
            raise PrepError(f"{path}:{number}: expected 'text<TAB>label', found no tab")
        text, field = line.rsplit("\t", 1)
        where = f"{path}:{number}"
        yield where, text, _labels(field.split() if multi_label else [field], multi_label, where)


def jsonl(path: Path, multi_label: bool, counts: SplitCounts, skip_invalid: bool) -> Iterator[Example]:
    """One JSON object per line: ``{"text": ..., "label": "x"}`` or, multi-label, ``"labels": [...]``."""
    require_file(path, "JSONL examples")
    for number, line in lines(path, counts, skip_invalid=skip_invalid):
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise PrepError(f"{where}: malformed JSON ({err.msg} at column {err.colno})") from None
        key = "labels" if multi_label else "label"
        if not isinstance(record, dict) or not isinstance(record.get("text"), str) or key not in record:
            raise PrepError(f"{where}: expected an object with 'text' and '{key}'")
        value = record[key]
        if multi_label and not isinstance(value, list):
            raise PrepError(f"{where}: 'labels' must be a list")
        yield where, record["text"], _labels(value if multi_label else [value], multi_label, where)


def _labels(labels: list, multi_label: bool, where: str) -> list[str]:
    if not multi_label and len(labels) != 1:
        raise PrepError(f"{where}: expected one label, got {len(labels)} (multi-label data needs --multi-label)")
    return [_check_label(label, where) for label in labels]


@dataclass
class LabelCounts:
    """How often each label of a split was written, and the ``file:line`` where each first occurs."""
    counts: Counter = field(default_factory=Counter)
    first: dict[str, str] = field(default_factory=dict)

    def add(self, label: str, where: str) -> None:
        self.counts[label] += 1
        self.first.setdefault(label, where)


def check_label_sets(labels: dict[str, LabelCounts], what: str = "label") -> None:
    """Every validation/test label must occur in training (fairseq would silently make it <unk>): the first
    that does not is refused where it occurs, with the split's other unseen ones named."""
    known = labels["train"].counts
    for split, seen in labels.items():
        unseen = [label for label in seen.first if label not in known]  # in the order they occur
        if unseen:
            first, rest = unseen[0], unseen[1:]
            also = f" (nor do {', '.join(rest[:10])}{', ...' if len(rest) > 10 else ''})" if rest else ""
            raise PrepError(f"{seen.first[first]}: the {what} {first!r} never occurs in train{also}")


def write_split(out: Path, split: str, examples: Iterator[Example], counts: SplitCounts, *, lowercase: bool,
                skip_invalid: bool) -> LabelCounts:
    """Write ``{split}.input0`` / ``{split}.label``; returns the labels written."""
    label_counts = LabelCounts()
    with PairWriter(out / split, counts, sides=("input0", "label")) as writer:
        for where, text, labels in examples:
            counts.read += 1
            text = normalize(text)
            if not text:
                counts.skip_or_raise(InvalidExample(f"{where}: empty text (use --skip-invalid to skip such "
                                                    "examples, counted)", "empty text"), skip_invalid)
                continue
            if not labels:
                counts.edited["examples without any label"] += 1
            writer.write(text.lower() if lowercase else text, " ".join(labels))
            for label in labels:
                label_counts.add(label, where)
    return label_counts


def binarize_classification(out: Path, splits: list[str], *, spm_model: Path | None, dictionary: Path | None,
                            options: SentencePieceOptions, workers: int = 1,
                            piece_labels: Callable[[Path, str], None] | None = None,
                            hf_tokenizer: Path | None = None) -> dict:
    """``{split}.input0`` → pieces → ``data-bin/input0``; ``{split}.label`` → ``data-bin/label`` (its
    dictionary built from the training labels, as fairseq's RoBERTa recipes do).

    ``piece_labels(out, split)``, when given, writes ``{split}.label`` once the pieces exist (token
    classification labels pieces, which sentencepiece decides). With ``hf_tokenizer`` (a pretrained
    checkpoint's folder) the pieces are that tokenizer's tokens instead (``hf_tokenizer.py``), and token
    labels follow its word alignment."""
    if hf_tokenizer is None:
        result = encode_splits(out, splits, ("input0",), spm_model=spm_model, dictionary=dictionary, options=options)
        for split in result["binarised_sentences"] if piece_labels else ():
            piece_labels(out, split)
        pieces = "spm"
    else:
        result = hf.encode_splits(out, splits, hf_tokenizer, token_level=piece_labels is not None)
        pieces = "hf"
    lines = result["binarised_sentences"]
    data_bin = out / "data-bin"
    fairseq_preprocess(["--only-source", "--srcdict", str(out / result["dictionary"]),
                        *split_prefixes(lambda split: out / f"{split}.{pieces}.input0", lines)],
                       data_bin / "input0", dict(lines), workers)
    fairseq_preprocess(["--only-source", *split_prefixes(lambda split: out / f"{split}.label", lines)],
                       data_bin / "label", dict(lines), workers)
    return {**result, "data_bin": data_bin.name}
