#!/usr/bin/env python
"""SQuAD 1.1 answer-aware question generation → text splits, test references and a fairseq data-bin.

Three inputs (one per run):

* ``--train-json train-v1.1.json --dev-json dev-v1.1.json`` with ``--split squad``: SQuAD's own train set for
  training, its dev set cut in two by article (first half valid, second half test; Zhao et al. 2018's
  split-2 does this at random, we keep the article order so the split is reproducible);
* the same JSON files with ``--split doclist --doclist-dir DIR``: the article titles in Du et al. 2017's
  ``doclist-{train,dev,test}.txt`` choose the articles of each split (dev → valid);
* ``--du2017-dir DIR``: Du et al.'s sentence-level ``src-*.txt`` / ``tgt-*.txt`` (tokenised, lower-cased),
  taken as they are; missing splits are left out (e.g. only dev/test).

From JSON, each question is one example: source = passage and answer joined by ``--separator``, in
``--order passage-answer`` (UniLM, default) or ``answer-passage`` (ProphetNet); target = the question.
``--unit sentence`` takes the sentence that holds the answer instead of the passage, and ``--no-answer`` leaves
out the separator and answer: together they rebuild Du et al.'s sentence-level files (their train split too)
from SQuAD.
Text is tokenised as the Penn Treebank, the conventions of Du et al.'s files (``sparse_softmax/scoring/ptb.py``), and
lower-cased (``--no-lowercase`` keeps case). A passage longer than ``--max-source-tokens`` (464 in the
Sparse-softmax paper) minus the answer and separator is cut to a window of that many tokens with the
answer as central as possible (counted).

Output as ``prepare_gigaword.py``: ``{train,valid,test}.{src,tgt}``, ``test.ref``, ``spm.model``,
``dict.txt``, ``data-bin/``, ``prep_summary.json``. The separator is kept as one sentencepiece piece.

``--hf-tokenizer DIR`` prepares JSON input for ``--arch hf_unilm --hf-model-dir DIR`` (UniLM's input): the
original text instead of PTB tokens, tokenised by that checkpoint's tokenizer, its own separator token (BERT's
``[SEP]``), and the passage window measured in its tokens: ``--max-source-tokens`` defaults to all the room the
model's positions leave beside a target of ``--max-target-tokens`` (by default the model's). ``test.ref`` keeps
the PTB-tokenised questions, as Du et al.'s references, for scoring.

    python data-prep/prepare_squad_qg.py data/squad-qg --train-json train-v1.1.json --dev-json dev-v1.1.json
    python data-prep/prepare_squad_qg.py data/du2017 --du2017-dir squad_qg_du2017 --text-only
    python data-prep/prepare_squad_qg.py data/du2017-rebuilt --train-json train-v1.1.json --dev-json dev-v1.1.json \
        --split doclist --doclist-dir squad_v1.1 --unit sentence --no-answer
    python data-prep/prepare_squad_qg.py data/qg-minilm --train-json train-v1.1.json --dev-json dev-v1.1.json \
        --hf-tokenizer models/all-MiniLM-L6-v2
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from tqdm import tqdm

from preplib import binarize, hf_tokenizer, script
from preplib.squad import ORDERS, UNITS, Article, QGOptions, examples, load_articles
from preplib.textio import PairWriter, PrepError, SplitCounts, normalize, read_parallel, require_file
from sparse_softmax.userinput import exit_on_error

DU_SPLITS = {"train": "train", "valid": "dev", "test": "test"}  # our name → Du et al.'s file name
PTB_SOURCE_TOKENS = 464  # the Sparse-softmax paper's passage + separator + answer, in words


def json_splits(args: argparse.Namespace) -> dict[str, tuple[list[Article], str]]:
    """Articles per split from the SQuAD JSON files, with where they come from (for messages)."""
    train = load_articles(require_file(args.train_json, "SQuAD train JSON")) if args.train_json else []
    dev = load_articles(require_file(args.dev_json, "SQuAD dev JSON")) if args.dev_json else []
    if args.split == "squad":
        if not args.train_json or not args.dev_json:
            raise PrepError("--split squad needs --train-json and --dev-json")
        half = (len(dev) + 1) // 2
        cut = f"of the {len(dev)} articles of {args.dev_json} (--split squad: first half valid, second half test)"
        return {"train": (train, f"the {len(train)} articles of {args.train_json}"),
                "valid": (dev[:half], f"the first {half} {cut}"),
                "test": (dev[half:], f"the last {len(dev) - half} {cut}")}
    if args.doclist_dir is None:
        raise PrepError("--split doclist needs --doclist-dir (Du et al.'s doclist-{train,dev,test}.txt)")
    by_title: dict[str, Article] = {}
    for article in train + dev:
        by_title.setdefault(article.title, article)
    splits, used = {}, set()
    for split, du_name in DU_SPLITS.items():
        listing = require_file(args.doclist_dir / f"doclist-{du_name}.txt", f"Du et al. {du_name} article list")
        splits[split] = []
        for number, line in enumerate(listing.read_text(encoding="utf-8").splitlines(), 1):
            title = line.strip()
            if not title:
                continue
            if title not in by_title:
                raise PrepError(f"{listing}:{number}: article {title!r} is in neither JSON file")
            splits[split].append(by_title[title])
            used.add(title)
    unused = len(by_title) - len(used)
    if unused:
        print(f"note: {unused} articles of the JSON files are in no doclist and were not used", file=sys.stderr)
    return {split: (articles, f"the articles of {args.doclist_dir / f'doclist-{DU_SPLITS[split]}.txt'}")
            for split, articles in splits.items()}


def write_split(split: str, examples, out: Path, counts: SplitCounts) -> None:
    """Write normalised (source, target, reference) examples; the test references also go to ``test.ref`` as
    they are."""
    with PairWriter(out / split, counts, references=out / "test.ref" if split == "test" else None) as writer:
        for source, target, reference in tqdm(examples, desc=split, unit=" ex", disable=None, mininterval=1):
            writer.write(normalize(source), normalize(target), reference=reference)


def tokenizer_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """With --hf-tokenizer: the QGOptions its tokenizer sets (separator, source budget, token counts); also
    settles --max-target-tokens."""
    if args.hf_tokenizer is None:
        if args.max_target_tokens is not None:
            parser.error("--max-target-tokens: only with --hf-tokenizer (sentencepiece data is cut by the model)")
        return {"max_source_tokens": args.max_source_tokens or PTB_SOURCE_TOKENS, "separator": args.separator or "[SEP]"}
    if args.du2017_dir is not None:
        parser.error("--hf-tokenizer: Du et al.'s files are tokenised already; prepare from the SQuAD JSON files")
    with exit_on_error(parser):
        tokenizer, longest = hf_tokenizer.load(args.hf_tokenizer)
        args.max_target_tokens = hf_tokenizer.max_target_tokens(args)
        room = hf_tokenizer.source_room(longest, args.max_target_tokens)
    if args.separator not in (None, tokenizer.sep_token):
        parser.error(f"--separator {args.separator}: with --hf-tokenizer the separator is its tokenizer's "
                     f"{tokenizer.sep_token}")
    if args.max_source_tokens is not None and args.max_source_tokens > room:
        parser.error(f"--max-source-tokens {args.max_source_tokens}: the model's {longest} positions leave room "
                     f"for {room} source tokens beside a target of --max-target-tokens {args.max_target_tokens}")

    @functools.lru_cache(maxsize=1 << 20)
    def length(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return {"max_source_tokens": args.max_source_tokens or room, "separator": tokenizer.sep_token,
            "tokenizer_length": length}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="output folder")
    source = parser.add_argument_group("input (SQuAD JSON files, or Du et al. 2017 sentence-level files)")
    source.add_argument("--train-json", type=Path, help="SQuAD v1.1 train-v1.1.json")
    source.add_argument("--dev-json", type=Path, help="SQuAD v1.1 dev-v1.1.json")
    source.add_argument("--split", choices=("squad", "doclist"), default="squad",
                        help="how JSON articles become train/valid/test (default: %(default)s, see above)")
    source.add_argument("--doclist-dir", type=Path, help="folder with Du et al.'s doclist-{train,dev,test}.txt")
    source.add_argument("--du2017-dir", type=Path, help="folder with Du et al.'s src-/tgt-{train,dev,test}.txt")
    qg = parser.add_argument_group("examples from JSON")
    qg.add_argument("--unit", choices=UNITS, default="passage",
                    help="the text a question is asked about: the passage (UniLM, default) or the sentence that holds "
                    "the answer starts in (Du et al. 2017)")
    qg.add_argument("--no-answer", dest="with_answer", action="store_false",
                    help="the text alone as the source, without separator and answer (Du et al. 2017's files: "
                    "--unit sentence --no-answer)")
    qg.add_argument("--order", choices=ORDERS, default="passage-answer",
                    help="passage-answer (UniLM, default) or answer-passage (ProphetNet)")
    qg.add_argument("--separator", help="token between passage and answer (default: [SEP]; with --hf-tokenizer "
                    "its tokenizer's)")
    qg.add_argument("--max-source-tokens", type=int,
                    help=f"passage + separator + answer, in words (default: {PTB_SOURCE_TOKENS}, the paper's); with "
                    "--hf-tokenizer in its tokens (default: the room the model's positions leave beside the target)")
    qg.add_argument("--max-target-tokens", type=int, metavar="N",
                    help="with --hf-tokenizer: the longest question in its tokens; longer ones are cut in the "
                    "binarised data, counted (default: that of --arch hf_unilm's --max-target-tokens)")
    qg.add_argument("--no-lowercase", dest="lowercase", action="store_false", help="keep the case of the text")
    script.add_arguments(parser)
    hf_tokenizer.add_argument(parser)
    args = parser.parse_args(argv)
    if (args.du2017_dir is None) == (args.train_json is None and args.dev_json is None):
        parser.error("give either --du2017-dir or --train-json/--dev-json")
    if args.du2017_dir is not None and (args.unit != "passage" or not args.with_answer):
        parser.error("--unit/--no-answer: Du et al.'s files are sentences already; they apply to the SQuAD JSON files")
    for name in ("max_source_tokens", "max_target_tokens"):
        if (value := getattr(args, name)) is not None and value < (3 if name == "max_source_tokens" else 1):
            parser.error(f"--{name.replace('_', '-')}: expected at least {3 if name == 'max_source_tokens' else 1}, "
                         f"got {value}")
    if args.separator is not None and len(args.separator.split()) != 1:
        parser.error(f"--separator: expected one token, got {args.separator!r}")
    hf_tokenizer.check_options(parser, args)
    tokenizing = tokenizer_options(parser, args)
    with script.output_folder(parser, args) as out:
        counts: dict[str, SplitCounts] = {}
        if args.du2017_dir is not None:
            for split, du_name in DU_SPLITS.items():
                src, tgt = args.du2017_dir / f"src-{du_name}.txt", args.du2017_dir / f"tgt-{du_name}.txt"
                if not src.exists() and not tgt.exists():
                    continue
                counts[split] = SplitCounts(source=f"{src} and {tgt}")
                pairs = read_parallel(require_file(src, "Du source"), require_file(tgt, "Du target"),
                                      counts[split], skip_invalid=args.skip_invalid)
                write_split(split, ((source, target, target) for source, target in pairs), out, counts[split])
            if not counts:
                raise PrepError(f"{args.du2017_dir}: no src-/tgt-{{train,dev,test}}.txt files")
        else:
            options = QGOptions(order=args.order, unit=args.unit, with_answer=args.with_answer,
                                lowercase=args.lowercase, skip_invalid=args.skip_invalid, **tokenizing)
            for split, (articles, source) in json_splits(args).items():
                counts[split] = SplitCounts(source=source)
                write_split(split, examples(articles, options, counts[split]), out, counts[split])
        inputs = [args.du2017_dir] if args.du2017_dir else [
            path for path in (args.train_json, args.dev_json, args.split == "doclist" and args.doclist_dir) if path]
        script.finish(args, out, counts, {"input": inputs},
                      user_symbols=[tokenizing["separator"]],
                      binarizer=functools.partial(binarize.binarize, hf_tokenizer=args.hf_tokenizer,
                                                  max_target_tokens=args.max_target_tokens))


if __name__ == "__main__":
    main()
