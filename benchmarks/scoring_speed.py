#!/usr/bin/env python
"""Wall-clock of the scoring scripts on ~100k lines against the reference scorers, timed in the same run.

Our side is the whole command as a user runs it (``python scripts/score_*.py ...`` in a subprocess:
start-up, reading and checking the files, scoring, per-example JSON). The baselines are only the
scoring calls of pycocoevalcap's ``Bleu(4)`` / ``Rouge()`` and of a plain rouge-score
``RougeScorer(use_stemmer=True)`` on lists already in memory, so the ratios favour the baselines.
Each timing is the minimum of ``--repeats`` runs, ours and the baseline interleaved.

Data: the Du et al. 2017 QG test split repeated to ``--lines`` (hypotheses = windows of the source
sentence) when ../shared/data is present, else a synthetic corpus of the same shape.

    python benchmarks/scoring_speed.py                 # table + benchmarks/results/scoring_speed.{md,png}
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DU2017 = ROOT.parent / "shared" / "data" / "squad_qg_du2017"


def make_corpus(lines: int, seed: int = 0) -> tuple[list[str], list[str], list[str], str]:
    """(sources, references, hypotheses, description) with ``lines`` examples."""
    rng = np.random.default_rng(seed)
    if DU2017.is_dir():
        sources = (DU2017 / "src-test.txt").read_text(encoding="utf-8").splitlines()
        refs = (DU2017 / "tgt-test.txt").read_text(encoding="utf-8").splitlines()
        what = f"Du et al. 2017 QG test ({len(sources):,} pairs) repeated"
    else:
        vocab = [f"w{i}" for i in range(5000)]
        sources = [" ".join(rng.choice(vocab, rng.integers(10, 40))) for _ in range(6000)]
        refs = [" ".join(s.split()[: rng.integers(5, 15)]) for s in sources]
        what = "synthetic 5000-word corpus"
    reps = -(-lines // len(sources))
    sources, refs = (sources * reps)[:lines], (refs * reps)[:lines]
    hyps = []
    for source in sources:
        words = source.split()
        start = int(rng.integers(0, max(1, len(words) - 6)))
        hyps.append(" ".join(words[start:start + int(rng.integers(4, 14))]))
    return sources, refs, hyps, what


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scoring_speed")
    args = parser.parse_args()

    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.rouge.rouge import Rouge
    from rouge_score import rouge_scorer

    sources, refs, hyps, what = make_corpus(args.lines)
    tmp = Path(tempfile.mkdtemp())
    files = {}
    for name, lines in (("src", sources), ("ref", refs), ("hyp", hyps)):
        files[name] = tmp / f"{name}.txt"
        files[name].write_text("\n".join(lines) + "\n", encoding="utf-8")

    def run(script: str, *extra: str) -> None:
        subprocess.run([sys.executable, str(ROOT / "scripts" / script), str(files["hyp"]), "--refs",
                        str(files["ref"]), "--json", str(tmp / "out.json"), *extra],
                       check=True, stdout=subprocess.DEVNULL)

    gts_grouped, res_grouped = {}, {}
    for source, ref, hyp in zip(sources, refs, hyps):
        gts_grouped.setdefault(source, []).append(ref)
        res_grouped[source] = [hyp]
    gts = {i: [r] for i, r in enumerate(refs)}
    res = {i: [h] for i, h in enumerate(hyps)}
    plain_rouge = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)

    cases = {
        "questions, per example (BLEU-1..4 + ROUGE-L)": (
            lambda: run("score_questions.py"),
            "pycocoevalcap Bleu(4) + Rouge()",
            lambda: (Bleu(4).compute_score(gts, res, verbose=0), Rouge().compute_score(gts, res)),
        ),
        "questions, --group-by-source": (
            lambda: run("score_questions.py", "--group-by-source", str(files["src"])),
            "pycocoevalcap Bleu(4) + Rouge()",
            lambda: (Bleu(4).compute_score(gts_grouped, res_grouped, verbose=0),
                     Rouge().compute_score(gts_grouped, res_grouped)),
        ),
        "summaries (ROUGE-1/2/L, stemmer)": (
            lambda: run("score_summaries.py"),
            "rouge-score RougeScorer",
            lambda: [plain_rouge.score(r, h) for h, r in zip(hyps, refs)],
        ),
    }
    rows = []
    for case, (ours, baseline_name, baseline) in cases.items():
        best_ours = best_base = float("inf")
        for _ in range(args.repeats):
            best_ours = min(best_ours, timed(ours))
            best_base = min(best_base, timed(baseline))
        rows.append((case, best_ours, baseline_name, best_base))
        print(f"{case}: ours {best_ours:.1f} s, {baseline_name} {best_base:.1f} s", file=sys.stderr)

    header = (f"Scoring {args.lines:,} lines ({what}); minimum of {args.repeats} runs; ours = the whole "
              "command (start-up, checks, per-example JSON), baseline = its scoring calls only.\n\n"
              "| case | ours (s) | baseline | baseline (s) | ours / baseline |\n|---|---|---|---|---|")
    table = "\n".join([header] + [f"| {c} | {o:.1f} | {bn} | {b:.1f} | {o / b:.2f} |" for c, o, bn, b in rows])
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(
        table + f"\n\nCommand: `python benchmarks/scoring_speed.py --lines {args.lines} --repeats {args.repeats}`\n",
        encoding="utf-8")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3))
    y = np.arange(len(rows))
    ax.barh(y - 0.2, [r[1] for r in rows], height=0.4, label="ours (whole command)")
    ax.barh(y + 0.2, [r[3] for r in rows], height=0.4, label="reference scorer (scoring only)")
    ax.set_yticks(y, [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds for {args.lines:,} lines")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=120)
    print(f"wrote {args.out.with_suffix('.md')} and .png", file=sys.stderr)


if __name__ == "__main__":
    main()
