#!/usr/bin/env python
"""How closely ``prepare_squad_qg.py --unit sentence --no-answer`` rebuilds Du et al. 2017's sentence-level files
(the sentence that holds the answer → the question) from SQuAD v1.1 JSON and their article lists: the prep's
valid and test files against Du's ``src-/tgt-{dev,test}.txt``, line by line.

A source line that differs is one of two kinds: Du's sentence is another sentence of ours in the same paragraph,
where the answer's text occurs more than once (the answer start picked another occurrence: the offline SQuAD copy
estimates each answer start as the first occurrence, see its README), or our tokens or sentence split differ.
Writes ``tools/du2017_rebuild.md`` (the figures and the first differing lines of each kind).

    python tools/du2017_rebuild.py [--squad-dir DIR] [--du2017-dir DIR]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from preplib.squad import load_articles
from sparse_softmax.scoring.ptb import sentences, tokenize

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "benchmarks")]
from measure import ROOT, run  # noqa: E402  (benchmarks/)

SHARED = ROOT.parent / "shared" / "data"
SPLITS = {"test": "test", "valid": "dev"}  # the prep's split → Du et al.'s file name
KINDS = {"same": "identical", "answer start": "another of our sentences, the answer's text occurring again",
         "tokens": "tokens or sentence split differ"}


def du_lines(path: Path) -> list[str]:
    return [" ".join(line.split()) for line in path.read_text(encoding="utf-8").splitlines()]


def paragraphs(squad_dir: Path, du_name: str) -> list[tuple[list[str], str, str]]:
    """For each question of Du et al.'s ``du_name`` articles, in the prep's order: the lower-cased sentences of its
    paragraph, its answer's text and the paragraph (what a differing line is checked against)."""
    articles = {a.title: a for name in ("train", "dev") for a in load_articles(squad_dir / f"{name}-v1.1.json")}
    out = []
    for title in (squad_dir / f"doclist-{du_name}.txt").read_text(encoding="utf-8").split("\n"):
        if not title.strip():
            continue
        for paragraph in articles[title.strip()].record["paragraphs"]:
            tokens = tokenize(paragraph["context"])
            lines = [" ".join(t for t, _, _ in tokens[lo:hi]).lower() for lo, hi in sentences(tokens)]
            out += [(lines, qa["answers"][0]["text"], paragraph["context"]) for qa in paragraph["qas"]]
    return out


def compare(prepared: Path, squad_dir: Path, du_dir: Path, split: str) -> dict:
    """Line-by-line figures of one split: sources by kind (see the module's doc), questions identical."""
    du_name = SPLITS[split]
    ours, theirs = du_lines(prepared / f"{split}.src"), du_lines(du_dir / f"src-{du_name}.txt")
    questions = du_lines(prepared / f"{split}.tgt"), du_lines(du_dir / f"tgt-{du_name}.txt")
    if not len(ours) == len(theirs) == len(questions[0]) == len(questions[1]):
        sys.exit(f"{split}: {len(ours)} prepared lines, {len(theirs)} of Du et al.'s: the splits do not line up")
    kinds = {kind: [] for kind in KINDS}
    for i, (mine, du, (lines, answer, context)) in enumerate(zip(ours, theirs, paragraphs(squad_dir, du_name))):
        if mine == du:
            kinds["same"].append(i)
        elif du in lines and context.count(answer) > 1:
            kinds["answer start"].append(i)
        else:
            kinds["tokens"].append(i)
    return {"lines": len(ours), "kinds": {k: len(v) for k, v in kinds.items()},
            "questions same": sum(a == b for a, b in zip(*questions)),
            "examples": {k: [(ours[i], theirs[i]) for i in v[:8]] for k, v in kinds.items() if k != "same"}}


def report(command: str, figures: dict[str, dict]) -> str:
    kinds = " | ".join(f"source: {text}" for text in KINDS.values())
    rows = [f"| split | lines | {kinds} | questions identical |",
            "|---|---|" + "---|" * (len(KINDS) + 1)]
    for split, f in figures.items():
        cells = [f"{f['kinds'][k]:,} ({100 * f['kinds'][k] / f['lines']:.2f} %)" for k in KINDS]
        rows.append(f"| {split} ({SPLITS[split]}) | {f['lines']:,} | {' | '.join(cells)} | "
                    f"{f['questions same']:,} ({100 * f['questions same'] / f['lines']:.2f} %) |")
    text = f"`{command}`\n\n" + "\n".join(rows) + "\n"
    for split, f in figures.items():
        for kind, pairs in f["examples"].items():
            text += f"\nFirst {split} lines, {KINDS[kind]} (ours, then Du et al.'s):\n\n"
            text += "".join(f"- `{mine}`\n  `{du}`\n" for mine, du in pairs)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--squad-dir", type=Path, default=SHARED / "squad_v1.1",
                        help="SQuAD v1.1 {train,dev}-v1.1.json and Du et al.'s doclist-{train,dev,test}.txt")
    parser.add_argument("--du2017-dir", type=Path, default=SHARED / "squad_qg_du2017",
                        help="Du et al.'s src-/tgt-{dev,test}.txt")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".md"))
    args = parser.parse_args(argv)
    for path in (args.squad_dir / "train-v1.1.json", args.du2017_dir / "src-test.txt"):
        if not path.exists():
            parser.error(f"{path}: not found (see --squad-dir / --du2017-dir)")
    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / "du2017"
        run([sys.executable, ROOT / "data-prep" / "prepare_squad_qg.py", prepared, "--train-json",
             args.squad_dir / "train-v1.1.json", "--dev-json", args.squad_dir / "dev-v1.1.json", "--split", "doclist",
             "--doclist-dir", args.squad_dir, "--unit", "sentence", "--no-answer", "--text-only"])
        figures = {split: compare(prepared, args.squad_dir, args.du2017_dir, split) for split in SPLITS}
        train = json.loads((prepared / "prep_summary.json").read_text(encoding="utf-8"))["splits"]["train"]
    command = "python tools/du2017_rebuild.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = report(command.strip(), figures) + (
        f"\nThe rebuilt train split has {train['written']:,} pairs (Du et al. report 70,484; their train files are not "
        "here to compare with).\n")
    print(text)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
