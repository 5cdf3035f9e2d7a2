#!/usr/bin/env python
r"""Gigaword headline generation → text splits, test references and a fairseq data-bin.

Input, auto-detected (or ``--input-format``):

* harvardnlp sumdata: ``train.article.txt`` / ``train.title.txt`` and ``valid.article.filter.txt`` /
  ``valid.title.filter.txt`` (in INPUT or INPUT/train), test ``Giga/input.txt`` / ``Giga/task1_ref0.txt``
  (INPUT/Giga or beside INPUT): 3.8M / 189k / 1,951 pairs;
* UniLM: ``{train,dev,test}.{src,tgt}.txt`` (in INPUT or INPUT/org_data), the same text.

A release without a validation split (a sample of the training pairs and the test set, as Gigaword-10k is
often shared) takes ``--valid-from-train N``: the last N training pairs (of the first ``--train-subset``
when given) become the valid split, the others the train split, and both are counted.

Output in OUT: ``{train,valid,test}.{src,tgt}`` (whitespace-normalised text), ``test.ref`` (the test
references exactly as read, for ``scripts/score_summaries.py --refs``), ``spm.model`` + ``dict.txt``,
``{split}.spm.{src,tgt}`` and ``data-bin/`` (``fairseq-preprocess --joined-dictionary``), and
``prep_summary.json`` with the counts printed at the end.

Unknown words: the data writes rare words as ``UNK`` (digits as ``#``). ``UNK`` stays an ordinary word
that the model learns to copy, so its output can be scored against the references as they are. A
literal ``<unk>`` in the input would become fairseq's unknown symbol (and come back as ``<unk>``), so
it is rewritten to ``--unk-token`` and counted.

``--hf-tokenizer DIR`` tokenises with a pretrained checkpoint's tokenizer instead of sentencepiece, for
``--arch hf_unilm --hf-model-dir DIR``: ``--max-target-tokens`` (by default the model's) then counts that
tokenizer's tokens, every split's binarised targets are cut to it and its sources to what the model's
positions leave (counted; ``test.ref`` keeps the references whole).

    python data-prep/prepare_gigaword.py sumdata/ data/giga                      # full data
    python data-prep/prepare_gigaword.py org_data/ data/giga10k --train-subset 10000
    python data-prep/prepare_gigaword.py org_data/ data/giga10k-minilm --train-subset 10000 \
        --hf-tokenizer models/all-MiniLM-L6-v2
    python data-prep/prepare_gigaword.py gigaword-10k/ data/giga10k --valid-from-train 500
"""
from __future__ import annotations

import argparse
import functools
from collections import deque
from pathlib import Path
from typing import Iterable, Iterator

from tqdm import tqdm

from preplib import binarize, hf_tokenizer, script
from preplib.textio import PairWriter, PrepError, SplitCounts, normalize, read_parallel, require_file, truncate

#: split → (source, target) file names, relative to the input folder, per input format.
HARVARD = {"train": ("train.article.txt", "train.title.txt"),
           "valid": ("valid.article.filter.txt", "valid.title.filter.txt"),
           "test": ("Giga/input.txt", "Giga/task1_ref0.txt")}
UNILM = {"train": ("train.src.txt", "train.tgt.txt"), "valid": ("dev.src.txt", "dev.tgt.txt"),
         "test": ("test.src.txt", "test.tgt.txt")}


def find_files(root: Path, fmt: str) -> tuple[str, dict[str, tuple[Path, Path]]]:
    """(format, split → (source, target) paths). harvardnlp's tar puts train/ and Giga/ side by side;
    either folder may be given, as may UniLM's org_data/ or its parent."""
    if not root.is_dir():
        raise PrepError(f"{root}: no such folder (expected harvardnlp's sumdata release or UniLM's org_data/)")
    harvard_dirs = [d for d in (root, root / "train") if (d / HARVARD["train"][0]).is_file()]
    unilm_dirs = [d for d in (root, root / "org_data") if (d / UNILM["train"][0]).is_file()]
    if fmt == "auto":
        found = (["harvard"] if harvard_dirs else []) + (["unilm"] if unilm_dirs else [])
        if len(found) != 1:
            raise PrepError(
                f"{root}: cannot tell the input format ({'both' if found else 'neither'} of "
                f"harvardnlp's {HARVARD['train'][0]} and UniLM's {UNILM['train'][0]} found, looked in "
                f"{root}, {root / 'train'}, {root / 'org_data'}); name it with --input-format"
            )
        fmt = found[0]
    if fmt == "unilm":
        base = unilm_dirs[0] if unilm_dirs else root
        return fmt, {split: (base / s, base / t) for split, (s, t) in UNILM.items()}
    base = harvard_dirs[0] if harvard_dirs else root
    giga_parent = next((d for d in (base, base.parent) if (d / "Giga").is_dir()), base)
    files = {split: (base / s, base / t) for split, (s, t) in HARVARD.items() if split != "test"}
    files["test"] = tuple(giga_parent / name for name in HARVARD["test"])
    return fmt, files


def clean(text: str, unk_token: str, counts: SplitCounts) -> str:
    text = normalize(text)
    if "<unk>" in text:
        counts.edited[f"<unk> written as {unk_token}"] += text.count("<unk>")
        text = text.replace("<unk>", unk_token)
    return text


def all_but_last(items: Iterable, n: int, last: deque) -> Iterator:
    """Every item of ``items`` but the last ``n``, which are left in ``last``; streamed, so the items need not fit
    in memory and the number of items need not be known."""
    for item in items:
        last.append(item)
        if len(last) > n:
            yield last.popleft()


def prepare_split(split: str, src: Path, tgt: Path, out: Path, args: argparse.Namespace) -> dict[str, SplitCounts]:
    """Write one split's text files from its (source, target) files; the train split also writes the valid split
    with ``--valid-from-train``. Returns each written split's counts."""
    counts = SplitCounts(source=f"{src} and {tgt}")
    limit = args.train_subset if split == "train" else None
    hold_out = args.valid_from_train if split == "train" else None

    def examples() -> Iterator[tuple[str, str, str]]:
        """(source, target, reference as read) of every usable pair, up to ``limit``."""
        pairs = read_parallel(src, tgt, counts, skip_invalid=args.skip_invalid)
        for taken, (raw_source, raw_target) in enumerate(tqdm(pairs, desc=split, unit=" pairs", total=limit,
                                                              disable=None, mininterval=1), 1):
            source = truncate(clean(raw_source, args.unk_token, counts), args.max_source_tokens, counts, "source")
            target = clean(raw_target, args.unk_token, counts)
            if split != "test" and args.hf_tokenizer is None:  # with it: in its tokens, every split, when binarised
                target = truncate(target, args.max_target_tokens, counts, "target")
            yield source, target, raw_target
            if taken == limit:
                return

    held: deque = deque()
    written = {split: counts}
    with PairWriter(out / split, counts, references=out / "test.ref" if split == "test" else None) as writer:
        for source, target, reference in all_but_last(examples(), hold_out or 0, held):
            writer.write(source, target, reference=reference)
    taken = counts.written + len(held)
    if limit is not None and taken < limit:
        raise PrepError(f"--train-subset {limit}: {src} has only {taken} usable pairs")
    if hold_out:
        if counts.written == 0:
            raise PrepError(f"--valid-from-train {hold_out}: {src} has only {taken} usable pairs, and the train "
                            "split needs some")
        counts.moved[f"held out as the valid split (--valid-from-train {hold_out})"] = len(held)
        valid = written["valid"] = SplitCounts(source=f"the last {len(held)} pairs of {src} and {tgt}",
                                               read=len(held))
        with PairWriter(out / "valid", valid) as writer:
            for source, target, _ in held:
                writer.write(source, target)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", type=Path, help="harvardnlp sumdata folder (or its train/) or UniLM org_data/")
    parser.add_argument("out", type=Path, help="output folder")
    parser.add_argument("--input-format", choices=("auto", "harvard", "unilm"), default="auto",
                        help="the layout of INPUT (default: %(default)s = whichever is found)")
    parser.add_argument("--train-subset", type=int, metavar="N",
                        help="keep the first N training pairs (10000 = UniLM's Gigaword-10k train.*.10k)")
    parser.add_argument("--valid-from-train", type=int, metavar="N",
                        help="make the valid split of the last N training pairs (after --train-subset), for a "
                        "release without one; the train split keeps the others")
    parser.add_argument("--max-source-tokens", type=int, metavar="N",
                        help="truncate articles to N whitespace tokens (every split; counted)")
    parser.add_argument("--max-target-tokens", type=int, metavar="N",
                        help="truncate training/validation titles to N tokens (counted; test references never); "
                        "with --hf-tokenizer: N of its tokens, every split's binarised titles (default: that of --arch "
                        "hf_unilm's --max-target-tokens; test.ref keeps them whole)")
    parser.add_argument("--unk-token", default="UNK", help="what a literal <unk> in the input is written as "
                        "(default: %(default)s, the data's own spelling)")
    script.add_arguments(parser)
    hf_tokenizer.add_argument(parser)
    args = parser.parse_args(argv)
    hf_tokenizer.check_options(parser, args)
    if args.hf_tokenizer is not None:
        args.max_target_tokens = hf_tokenizer.max_target_tokens(args)
    for name in ("train_subset", "valid_from_train", "max_source_tokens", "max_target_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')}: expected a positive number, got {value}")
    with script.output_folder(parser, args) as out:
        fmt, files = find_files(args.input, args.input_format)
        if args.valid_from_train:
            del files["valid"]
        for split, (src, tgt) in files.items():
            require_file(src, f"{fmt} {split} source")
            require_file(tgt, f"{fmt} {split} target")
        counts: dict[str, SplitCounts] = {}
        for split, (src, tgt) in files.items():
            counts.update(prepare_split(split, src, tgt, out, args))
        script.finish(args, out, counts, {"input": args.input, "input_format": fmt},
                      binarizer=functools.partial(binarize.binarize, hf_tokenizer=args.hf_tokenizer,
                                                  max_target_tokens=args.max_target_tokens))


if __name__ == "__main__":
    main()
