#!/usr/bin/env python
"""Text classification data → fairseq's RoBERTa layout (``data-bin/input0``, ``data-bin/label``).

Data sets (``--dataset``):

* ``clinc150 --input data_full.json``: CLINC150 intents (train / val / test), with the out-of-scope
  class ``oos`` by default (151 classes, as the AS-Softmax paper; ``--no-oos`` for the 150 in-scope);
* ``sst5 --input DIR``: SST-5 ``stsa.fine.{train,dev,test}`` (``<label 0-4> <sentence>`` lines);
* ``tsv --train F --valid F --test F``: ``text<TAB>label`` lines;
* ``jsonl --train F --valid F --test F``: ``{"text": ..., "label": ...}`` lines.

``--multi-label`` (TSV and JSONL): the TSV label field is a space-separated list, the JSONL key is
``"labels": [...]``; an example may have no label (counted). Labels must be single tokens, and every
validation/test label must occur in training.

Output in OUT: ``{train,valid,test}.input0`` (whitespace-normalised text, ``--lowercase`` optional) and
``.label``, ``spm.model``, ``dict.txt``, ``data-bin/{input0,label}`` and ``prep_summary.json`` with the
counts and the number of classes (pass it as ``--num-classes``).

    python data-prep/prepare_classification.py data/clinc --dataset clinc150 --input clinc150/data_full.json
"""
from __future__ import annotations

import argparse
from pathlib import Path

from preplib import binarize
from preplib.classification import (binarize_classification, check_label_sets, clinc150, jsonl, sst5, tsv,
                                    write_split)
from preplib.textio import PrepError, SplitCounts

SPLITS = ("train", "valid", "test")


def readers(args: argparse.Namespace) -> dict:
    """split → a function returning that split's examples, for the chosen data set."""
    if args.dataset in ("clinc150", "sst5"):
        if args.input is None:
            raise PrepError(f"--dataset {args.dataset} needs --input")
        if args.dataset == "clinc150":
            return {split: (lambda split=split: clinc150(args.input, split, args.oos)) for split in SPLITS}
        return {split: (lambda split=split: sst5(args.input, split)) for split in SPLITS}
    read = tsv if args.dataset == "tsv" else jsonl
    files = {split: getattr(args, split) for split in SPLITS}
    if files["train"] is None:
        raise PrepError(f"--dataset {args.dataset} needs --train (and usually --valid, --test)")
    return {split: (lambda path=path: read(path, args.multi_label)) for split, path in files.items() if path}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="output folder")
    parser.add_argument("--dataset", choices=("clinc150", "sst5", "tsv", "jsonl"), required=True)
    parser.add_argument("--input", type=Path, help="clinc150: data_full.json; sst5: the folder of stsa.fine.*")
    for split in SPLITS:
        parser.add_argument(f"--{split}", type=Path, help=f"tsv/jsonl: the {split} file")
    parser.add_argument("--no-oos", dest="oos", action="store_false",
                        help="clinc150: leave out the out-of-scope examples (150 classes instead of 151)")
    parser.add_argument("--multi-label", action="store_true", help="tsv/jsonl: each example has a label list")
    parser.add_argument("--lowercase", action="store_true", help="lower-case the text")
    parser.add_argument("--skip-invalid", action="store_true",
                        help="skip (and count) examples with an empty text instead of stopping")
    binarize.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.multi_label and args.dataset not in ("tsv", "jsonl"):
        parser.error(f"--multi-label: {args.dataset} is single-label")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        counts, labels = {}, {}
        for split, read in readers(args).items():
            counts[split] = SplitCounts()
            labels[split] = write_split(args.out, split, read(), counts[split], lowercase=args.lowercase,
                                        skip_invalid=args.skip_invalid)
        check_label_sets(labels)
        classes = len(labels["train"])
        print(f"{classes} classes in train: --num-classes {classes}")
        binarize.finish(args, counts, {"dataset": args.dataset, "num_classes": classes,
                                       "label_counts": labels}, binarizer=binarize_classification)
    except PrepError as err:
        parser.exit(2, f"error: {err}\n")


if __name__ == "__main__":
    main()
