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
counts and the number of classes (pass it as ``--num-classes``). ``--hf-tokenizer DIR`` tokenises with a
pretrained checkpoint's tokenizer instead of sentencepiece (``{split}.hf.input0``, for ``--arch hf_encoder``).

    python data-prep/prepare_classification.py data/clinc --dataset clinc150 --input clinc150/data_full.json
"""
from __future__ import annotations

import argparse
import functools
from pathlib import Path

from preplib import hf_tokenizer, script
from preplib.classification import (binarize_classification, check_label_sets, clinc150, jsonl, sst5, tsv,
                                    write_split)
from preplib.textio import PrepError, SplitCounts

SPLITS = ("train", "valid", "test")


def readers(args: argparse.Namespace) -> dict:
    """split → (where its examples come from, a function of the split's counts returning its examples)."""
    skip = args.skip_invalid
    if args.dataset in ("clinc150", "sst5"):
        if args.input is None:
            raise PrepError(f"--dataset {args.dataset} needs --input")
        if args.dataset == "clinc150":
            return {split: (str(args.input), lambda counts, split=split: clinc150(args.input, split, args.oos))
                    for split in SPLITS}
        return {split: (str(args.input), lambda counts, split=split: sst5(args.input, split, counts, skip))
                for split in SPLITS}
    read = tsv if args.dataset == "tsv" else jsonl
    files = {split: getattr(args, split) for split in SPLITS}
    if files["train"] is None:
        raise PrepError(f"--dataset {args.dataset} needs --train (and usually --valid, --test)")
    return {split: (str(path), lambda counts, path=path: read(path, args.multi_label, counts, skip))
            for split, path in files.items() if path}


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
    script.add_arguments(parser)
    hf_tokenizer.add_argument(parser)
    args = parser.parse_args(argv)
    hf_tokenizer.check_options(parser, args)
    if args.multi_label and args.dataset not in ("tsv", "jsonl"):
        parser.error(f"--multi-label: {args.dataset} is single-label")
    with script.output_folder(parser, args) as out:
        counts, labels = {}, {}
        for split, (source, read) in readers(args).items():
            counts[split] = SplitCounts(source=source)
            labels[split] = write_split(out, split, read(counts[split]), counts[split], lowercase=args.lowercase,
                                        skip_invalid=args.skip_invalid)
        check_label_sets(labels)
        classes = len(labels["train"].counts)
        print(f"{classes} classes in train: --num-classes {classes}")
        script.finish(args, out, counts, {"dataset": args.dataset, "num_classes": classes,
                                          "label_counts": {split: dict(c.counts) for split, c in labels.items()}},
                      binarizer=functools.partial(binarize_classification, hf_tokenizer=args.hf_tokenizer))


if __name__ == "__main__":
    main()
