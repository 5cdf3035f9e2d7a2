"""The frame every prep script shares: its common options, its output folder, its errors and its summary.

A prep script parses its options, then writes everything inside one block::

    with script.output_folder(parser, args) as out:
        counts = {split: write that split's text files into out ...}
        script.finish(args, out, counts, summary)

``output_folder`` refuses a non-empty ``OUT`` before any work unless ``--overwrite``, and hands the
block a new folder beside ``OUT``; only when the block succeeded does that folder replace ``OUT``. A
run that fails (bad input, an interrupted run) leaves ``OUT`` exactly as it was, never a mix of new
text files and an old data-bin. Bad input ends the script with ``<script>: error: <file>:<line>:
<what>`` and exit status 2.

``finish`` refuses an empty split (fairseq cannot binarise one, and an empty split is nearly always a
wrong file, or every example skipped; with ``--text-only`` it is a warning), prints what went in and came
out of each split, binarises,
and writes ``prep_summary.json`` with paths relative to ``OUT``, so the folder can be moved.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from sparse_softmax.userinput import exit_on_error

from . import binarize
from .textio import SKIP_INVALID_HELP, PrepError, SplitCounts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every prep script has: reading, the output folder, and tokenisation/binarisation."""
    parser.add_argument("--skip-invalid", action="store_true", help=SKIP_INVALID_HELP)
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUT if it is not empty (it is replaced only when the whole run succeeded)")
    binarize.add_arguments(parser)


@contextmanager
def output_folder(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Iterator[Path]:
    """A new folder beside ``args.out`` that replaces it when the block succeeds (see the module doc)."""
    final: Path = args.out
    with exit_on_error(parser):
        if final.exists() and not final.is_dir():
            raise PrepError(f"{final}: exists and is not a folder")
        if final.is_dir() and any(final.iterdir()) and not args.overwrite:
            raise PrepError(f"{final}: not empty; pass --overwrite to replace it (it is replaced only when "
                            "the whole run succeeded)")
        final.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
        try:
            yield work
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
            final.rename(old / final.name)
            work.rename(final)
            shutil.rmtree(old)
        else:
            work.rename(final)
    print(f"wrote {final} (summary: {final / 'prep_summary.json'})", file=sys.stderr)


def finish(args: argparse.Namespace, out: Path, counts: dict[str, SplitCounts], summary: dict,
           user_symbols: tuple[str, ...] | list[str] = (), binarizer: Callable[..., dict] = binarize.binarize) -> None:
    """Check and report the splits written to ``out``, binarise them as the options say (``binarizer``),
    and write ``out/prep_summary.json``."""
    for split, c in counts.items():
        print(c.summary(split), file=sys.stderr)
    for split in (split for split, c in counts.items() if c.written == 0):
        problem = (f"the {split} split is empty ({counts[split].summary(split)}; from "
                   f"{counts[split].source or 'the input'})")
        if not args.text_only:
            raise PrepError(f"{problem}: fairseq cannot binarise an empty split")
        print(f"warning: {problem}", file=sys.stderr)  # --text-only binarises nothing
    summary = {**summary, "splits": {split: c.as_dict() for split, c in counts.items()}}
    if not args.text_only:
        options = binarize.SentencePieceOptions(vocab_size=args.spm_vocab_size, model_type=args.spm_model_type,
                                                sample=args.spm_sample, user_symbols=tuple(user_symbols))
        result = binarizer(out, list(counts), spm_model=args.spm_model, dictionary=args.dict, options=options,
                           workers=args.workers)
        sentences = ", ".join(f"{split} {n}" for split, n in result["binarised_sentences"].items())
        print(f"binarised ({sentences} sentences) -> {args.out / 'data-bin'}", file=sys.stderr)
        for name, n in result["unknown_pieces"].items():
            print(f"note: {n} pieces of {name} are the tokenizer's unknown token (characters it has never seen; "
                  "fairseq <unk>)", file=sys.stderr)
        summary.update(result)
    summary = {key: relative_to(args.out, value) for key, value in summary.items()}
    (out / "prep_summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")


def relative_to(out: Path, value):
    """``value`` for the summary: a path (or a list of them) as seen from ``out``, so the folder can be moved."""
    if isinstance(value, list):
        return [relative_to(out, v) for v in value]
    return os.path.relpath(value.resolve(), out.resolve()) if isinstance(value, Path) else value
