#!/usr/bin/env python
"""Score generated questions: corpus BLEU-1..4 as the QG papers report them, optional ROUGE-L and sacrebleu.

BLEU follows the coco-caption / qgevalcap scorer used by Du et al. 2017, UniLM and ProphetNet (see
``sparse_softmax/scoring/bleu.py``): clipped corpus counts, no smoothing, closest-reference brevity penalty,
whitespace tokens, no lower-casing unless ``--lowercase``. Two ways to form the scored items:

* per example (default, as UniLM): each hypothesis against its own reference;
* ``--group-by-source SRC``, as Du et al.'s script: examples with the same source line form one item
  with all their questions as references, scored against the *last* prediction made for that source.

A model that writes a BERT tokenizer's tokens (``--arch hf_unilm``) is scored with ``--remove-bpe wordpiece
--ptb-hypotheses``: its punctuation split as the PTB references split it (``sparse_softmax/scoring/ptb.py``).

    python scripts/score_questions.py generate-test.txt --remove-bpe sentencepiece
    python scripts/score_questions.py pred.txt --refs tgt-test.txt --group-by-source src-test.txt --json scores.json
"""
from __future__ import annotations

import argparse

import numpy as np

from sparse_softmax.scoring import bleu, ptb, report
from sparse_softmax.scoring.inputs import InputError, read_lines
from sparse_softmax.scoring.rouge import coco_rouge_l
from sparse_softmax.userinput import exit_on_error

BLEU_NAMES = [f"BLEU-{n}" for n in range(1, bleu.MAX_N + 1)]


def group_by_source(sources: list[str]) -> dict[str, list[int]]:
    """Example ids per exact source line (Du et al. key on the line as it is), in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for index, source in enumerate(sources):
        groups.setdefault(source, []).append(index)
    return groups


def scored_items(args: argparse.Namespace, hyps: list[str], refs: list[str], notes: list[str]):
    """(hypothesis, references, JSON key) per scored item: one per example, or one per source line."""
    if not args.group_by_source:
        return hyps, [[r] for r in refs], [{"example": i} for i in range(len(hyps))]
    sources = read_lines(args.group_by_source, notes)
    if len(sources) != len(hyps):
        raise InputError(f"{len(sources)} source lines in {args.group_by_source} for {len(hyps)} examples: "
                         "the files must have one line per example")
    groups = group_by_source(sources)
    item_hyps = [hyps[ids[-1]] for ids in groups.values()]  # the last prediction wins, as in Du et al.
    item_refs = [[refs[i] for i in ids] for ids in groups.values()]
    return item_hyps, item_refs, [{"source": source, "examples": ids} for source, ids in groups.items()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_input_arguments(parser)
    parser.add_argument("--group-by-source", metavar="SRC_FILE",
                        help="source sentence of each example, one per line: examples sharing a source are "
                        "scored as one multi-reference item with the last prediction (Du et al. 2017)")
    parser.add_argument("--ptb-hypotheses", action="store_true",
                        help="re-tokenise the hypotheses as Du et al.'s PTB references: for a BERT tokenizer's "
                        "output (--arch hf_unilm, after --remove-bpe wordpiece), which splits off every punctuation "
                        "mark: notre dame ' s -> notre dame 's, 10 , 000 -> 10,000, u . s . -> u.s.")
    parser.add_argument("--lowercase", action="store_true",
                        help="lower-case hypotheses and references first (the scorer itself does not)")
    parser.add_argument("--no-rouge-l", dest="rouge_l", action="store_false",
                        help="skip coco's ROUGE-L (F_beta with beta = 1.2, best precision and recall over refs)")
    parser.add_argument("--sacrebleu", action="store_true",
                        help="also print sacrebleu's corpus BLEU (13a tokenisation, exp smoothing; not "
                        "comparable with the coco numbers) with its signature")
    args = parser.parse_args(argv)
    with exit_on_error(parser):
        pairs = report.load(args, parser)
        hyps, refs = pairs.hypotheses, pairs.references
        if args.ptb_hypotheses:
            hyps = [ptb.from_bert(h) for h in hyps]
        if args.lowercase:
            hyps, refs = [h.lower() for h in hyps], [r.lower() for r in refs]
        item_hyps, item_refs, keys = scored_items(args, hyps, refs, pairs.notes)
    stats = bleu.collect_stats(item_hyps, item_refs,
                               report.progress(zip(item_hyps, item_refs), len(item_hyps), "BLEU"))
    scores = dict(zip(BLEU_NAMES, bleu.corpus_bleu(stats).tolist()))
    per_item = [bleu.item_bleu(stats)]
    names = list(BLEU_NAMES)
    if args.rouge_l:
        rouge_l = np.array([coco_rouge_l(h, r) for h, r in
                            report.progress(zip(item_hyps, item_refs), len(item_hyps), "ROUGE-L")])
        scores["ROUGE-L"] = float(rouge_l.mean())
        per_item.append(rouge_l[:, None])
        names.append("ROUGE-L")
    per_item = np.concatenate(per_item, axis=1)

    result = report.Report(
        title=f"{args.hypotheses}: BLEU as coco/qgevalcap, "
        + ("grouped by source (Du et al.)" if args.group_by_source else "per example"),
        scores=scores,
        counts={"examples": len(hyps), "scored_items": len(item_hyps),
                "empty_hypotheses": sum(not h.split() for h in item_hyps)},
        settings={**report.common_settings(args), "group_by_source": args.group_by_source,
                  "ptb_hypotheses": args.ptb_hypotheses, "lowercase": args.lowercase},
        per_example=[{**key, **report.percent_rows(names, row)} for key, row in zip(keys, per_item)],
        notes=list(pairs.notes),
    )
    # Corpus BLEU from the resampled counts; ROUGE-L is a mean of per-item scores.
    result.add_bootstrap(lambda w: np.concatenate(
        [bleu.corpus_bleu(stats, w), w @ per_item[:, bleu.MAX_N:] / len(item_hyps)], axis=1),
        len(item_hyps), args.bootstrap, args.seed)
    if args.sacrebleu:
        import sacrebleu

        streams = max(len(r) for r in item_refs)
        ref_streams = [[r[k] if k < len(r) else None for r in item_refs] for k in range(streams)]
        metric = sacrebleu.BLEU()
        sacre = metric.corpus_score(item_hyps, ref_streams)
        result.extra_lines.append(f"sacrebleu: {sacre} ({metric.get_signature()})")
        result.settings["sacrebleu"] = {"score": sacre.score, "signature": str(metric.get_signature())}
    result.emit(args.json)


if __name__ == "__main__":
    main()
