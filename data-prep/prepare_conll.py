#!/usr/bin/env python
"""CoNLL-format token classification (e.g. CoNLL-2003 NER) → fairseq's RoBERTa layout for
``--task text_classification --token-level``.

Input: ``--train`` / ``--valid`` / ``--test`` CoNLL files (for CoNLL-2003: eng.train, eng.testa,
eng.testb): one ``word ... tag`` line per token, blank lines between sentences, ``-DOCSTART-`` lines
between documents (dropped and counted). ``--label-column`` picks the tag column (default: the last).

Output in OUT: ``{split}.input0`` (the words), ``{split}.word_label`` (their tags), ``{split}.label``
(a tag per sentencepiece piece: a word's first piece has its tag, the others ``X``), ``spm.model``,
``dict.txt``, ``data-bin/{input0,label}`` and ``prep_summary.json``. Every validation/test tag must
occur in training. ``--hf-tokenizer DIR`` splits the words with a pretrained checkpoint's tokenizer instead
(``{split}.hf.input0``; a word's first token has its tag), for ``--arch hf_encoder``.

    python data-prep/prepare_conll.py data/conll --train eng.train --valid eng.testa --test eng.testb
"""
from __future__ import annotations

import argparse
import functools
from pathlib import Path

from preplib import hf_tokenizer, script
from preplib.classification import binarize_classification, check_label_sets
from preplib.conll import piece_labels, read_conll, write_split
from preplib.textio import SplitCounts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="output folder")
    parser.add_argument("--train", type=Path, required=True, help="CoNLL training file")
    parser.add_argument("--valid", type=Path, help="CoNLL validation file")
    parser.add_argument("--test", type=Path, help="CoNLL test file")
    parser.add_argument("--label-column", type=int, default=-1,
                        help="column of the tag, 0-based; negative counts from the end (default: the last)")
    script.add_arguments(parser)
    hf_tokenizer.add_argument(parser)
    args = parser.parse_args(argv)
    hf_tokenizer.check_options(parser, args)
    with script.output_folder(parser, args) as out:
        counts, tags = {}, {}
        for split in ("train", "valid", "test"):
            path = getattr(args, split)
            if path is not None:
                counts[split] = SplitCounts(source=str(path))
                sentences = read_conll(path, args.label_column, counts[split], args.skip_invalid)
                tags[split] = write_split(out, split, sentences, counts[split])
        check_label_sets(tags, "tag")
        for split, written in tags.items():
            print(written.summary(split))
        print(f"{len(tags['train'].counts)} tags in train: {' '.join(sorted(tags['train'].counts))}")
        script.finish(args, out, counts, {"dataset": "conll", "num_classes": len(tags["train"].counts),
                                          "label_counts": {split: dict(t.counts) for split, t in tags.items()},
                                          "tokens": {split: t.tokens for split, t in tags.items()},
                                          "entities": {split: dict(t.entities) for split, t in tags.items()}},
                      binarizer=functools.partial(binarize_classification, piece_labels=piece_labels,
                                                  hf_tokenizer=args.hf_tokenizer))


if __name__ == "__main__":
    main()
