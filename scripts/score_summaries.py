#!/usr/bin/env python
"""Score generated summaries with ROUGE-1/2/L F1 as the Gigaword tables report them.

rouge-score with Porter stemming (``--no-stemmer`` to turn it off), which matches ROUGE-1.5.5 run with
``-m`` as UniLM and the Sparse-softmax paper did; files2rouge omits ``-m`` and gives lower numbers.
Corpus scores are the means of per-example scores (ROUGE-1.5.5 ``-a``). For UniLM's Gigaword set-up
add ``--lowercase --map-unk`` (``--digits-to-hash`` if the model may output digits: the references
have ``#``); see ``sparse_softmax/scoring/rouge.py`` for what each does to rouge-score's numbers.

    python scripts/score_summaries.py generate-test.txt --refs test.tgt.ref --remove-bpe sentencepiece
    python scripts/score_summaries.py pred.txt --refs ref.txt --precision-recall --bootstrap 1000 --json -
"""
from __future__ import annotations

import argparse

from sparse_softmax.scoring import report
from sparse_softmax.scoring.rouge import ROUGE_TYPES, postprocess, rouge_scores
from sparse_softmax.userinput import exit_on_error

DISPLAY = {"rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L"}
PARTS = ("P", "R", "F1")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_input_arguments(parser)
    parser.add_argument("--rouge-types", default="rouge1,rouge2,rougeL",
                        help=f"comma-separated, from {', '.join(ROUGE_TYPES)} (default: %(default)s)")
    parser.add_argument("--no-stemmer", dest="stemmer", action="store_false",
                        help="no Porter stemming (ROUGE-1.5.5 without -m, as files2rouge)")
    parser.add_argument("--precision-recall", action="store_true", help="also report precision and recall")
    parser.add_argument("--lowercase", action="store_true", help="lower-case hypotheses and references")
    parser.add_argument("--map-unk", action="store_true",
                        help="write the model's <unk> as UNK, the Gigaword references' spelling")
    parser.add_argument("--digits-to-hash", action="store_true",
                        help="replace every digit by '#', as the Gigaword data does")
    args = parser.parse_args(argv)
    types = [t.strip() for t in args.rouge_types.split(",") if t.strip()]
    unknown = sorted(set(types) - set(ROUGE_TYPES))
    if not types or unknown:
        parser.error(f"--rouge-types: unknown {unknown or 'empty list'}; expected some of {', '.join(ROUGE_TYPES)}")
    with exit_on_error(parser):
        pairs = report.load(args, parser)

    def clean(text: str) -> str:
        return postprocess(text, lowercase=args.lowercase, map_unk=args.map_unk, digits_to_hash=args.digits_to_hash)

    hyps = [clean(h) for h in pairs.hypotheses]
    refs = [clean(r) for r in pairs.references]
    per_example = rouge_scores(hyps, refs, types, args.stemmer,
                               report.progress(zip(hyps, refs), len(hyps), "ROUGE"))  # (examples, types, P/R/F)
    parts = range(3) if args.precision_recall else [2]
    names = [f"{DISPLAY[t]} {PARTS[p]}" if args.precision_recall else DISPLAY[t] for t in types for p in parts]
    columns = per_example[:, :, list(parts)].reshape(len(hyps), -1)  # one column per reported name

    result = report.Report(
        title=f"{args.hypotheses}: rouge-score, {'Porter stemmer' if args.stemmer else 'no stemmer'}, "
        "mean of per-example scores",
        scores=dict(zip(names, columns.mean(axis=0).tolist())),
        counts={"examples": len(hyps), "empty_hypotheses": pairs.empty_hypotheses},
        settings={**report.common_settings(args), "rouge_types": types, "stemmer": args.stemmer,
                  "lowercase": args.lowercase, "map_unk": args.map_unk, "digits_to_hash": args.digits_to_hash},
        per_example=[{"example": i, **report.percent_rows(names, row)} for i, row in enumerate(columns)],
        notes=list(pairs.notes),
    )
    result.add_bootstrap(lambda w: w @ columns / len(hyps), len(hyps), args.bootstrap, args.seed)
    result.emit(args.json)


if __name__ == "__main__":
    main()
