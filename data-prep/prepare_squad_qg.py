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
Text is tokenised as the Penn Treebank, the conventions of Du et al.'s files (``preplib/ptb.py``), and
lower-cased (``--no-lowercase`` keeps case). A passage longer than ``--max-source-tokens`` (464 in the
Sparse-softmax paper) minus the answer and separator is cut to a window of that many tokens with the
answer as central as possible (counted).

Output as ``prepare_gigaword.py``: ``{train,valid,test}.{src,tgt}``, ``test.ref``, ``spm.model``,
``dict.txt``, ``data-bin/``, ``prep_summary.json``. The separator is kept as one sentencepiece piece.

    python data-prep/prepare_squad_qg.py data/squad-qg --train-json train-v1.1.json --dev-json dev-v1.1.json
    python data-prep/prepare_squad_qg.py data/du2017 --du2017-dir squad_qg_du2017 --text-only
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from preplib import script
from preplib.squad import ORDERS, Article, QGOptions, examples, load_articles
from preplib.textio import PairWriter, PrepError, SplitCounts, normalize, read_parallel, require_file

DU_SPLITS = {"train": "train", "valid": "dev", "test": "test"}  # our name → Du et al.'s file name


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


def write_split(split: str, pairs, out: Path, counts: SplitCounts) -> None:
    """Write normalised pairs; the test references also go to ``test.ref`` as they are."""
    with PairWriter(out / split, counts, references=out / "test.ref" if split == "test" else None) as writer:
        for source, target in tqdm(pairs, desc=split, unit=" ex", disable=None, mininterval=1):
            writer.write(normalize(source), normalize(target), reference=target)


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
    qg.add_argument("--order", choices=ORDERS, default="passage-answer",
                    help="passage-answer (UniLM, default) or answer-passage (ProphetNet)")
    qg.add_argument("--separator", default="[SEP]", help="token between passage and answer (default: %(default)s)")
    qg.add_argument("--max-source-tokens", type=int, default=464,
                    help="passage + separator + answer, in words (default: %(default)s, the paper's)")
    qg.add_argument("--no-lowercase", dest="lowercase", action="store_false", help="keep the case of the text")
    script.add_arguments(parser)
    args = parser.parse_args(argv)
    if (args.du2017_dir is None) == (args.train_json is None and args.dev_json is None):
        parser.error("give either --du2017-dir or --train-json/--dev-json")
    if args.max_source_tokens < 3:
        parser.error(f"--max-source-tokens: expected at least 3, got {args.max_source_tokens}")
    if not args.separator or len(args.separator.split()) != 1:
        parser.error(f"--separator: expected one token, got {args.separator!r}")
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
                write_split(split, pairs, out, counts[split])
            if not counts:
                raise PrepError(f"{args.du2017_dir}: no src-/tgt-{{train,dev,test}}.txt files")
        else:
            options = QGOptions(max_source_tokens=args.max_source_tokens, order=args.order,
                                separator=args.separator, lowercase=args.lowercase, skip_invalid=args.skip_invalid)
            for split, (articles, source) in json_splits(args).items():
                counts[split] = SplitCounts(source=source)
                write_split(split, examples(articles, options, counts[split]), out, counts[split])
        script.finish(args, out, counts, {"input": str(args.du2017_dir or args.train_json or args.dev_json)},
                      user_symbols=[args.separator])


if __name__ == "__main__":
    main()
