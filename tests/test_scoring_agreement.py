"""The scoring scripts against independent implementations on realistic text: pycocoevalcap's Bleu and
Rouge (the scorer the QG papers used), nltk's corpus_bleu without smoothing, and rouge-score called
directly. Runs on the Du et al. 2017 SQuAD QG test split when ../shared/data is there, and always on a
synthetic corpus with repeated sources (multi-reference groups) and empty hypotheses."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED_DATA, run_script

DU2017 = SHARED_DATA / "squad_qg_du2017"
BLEU_NAMES = ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4"]


def score(script: str, *args) -> dict:
    return json.loads(run_script(f"scripts/{script}", *args, "--json", "-").stdout)


def synthetic_corpus(rng: np.random.Generator, size: int = 600) -> tuple[list[str], list[str], list[str]]:
    """Sources (each used 1-3 times), questions drawn from their source's words, noisy predictions."""
    vocab = [f"w{i}" for i in range(60)]
    sources, questions, predictions = [], [], []
    while len(sources) < size:
        source = list(rng.choice(vocab, rng.integers(8, 25)))
        for _ in range(rng.integers(1, 4)):
            question = [w if rng.random() < 0.7 else rng.choice(vocab) for w in source[: rng.integers(3, 12)]]
            prediction = [w for w in question if rng.random() < 0.8] + list(rng.choice(vocab, rng.integers(0, 3)))
            if rng.random() < 0.02:
                prediction = []
            sources.append(" ".join(source))
            questions.append(" ".join(question))
            predictions.append(" ".join(prediction))
    return sources, questions, predictions


@pytest.fixture(scope="module", params=["synthetic", "du2017"])
def qg_files(request, tmp_path_factory) -> tuple[Path, Path, Path]:
    """(sources, references, hypotheses) files; the du2017 hypotheses are made from the source
    sentences (a window of their words, with the question word of the reference put first)."""
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "synthetic":
        sources, refs, hyps = synthetic_corpus(np.random.default_rng(0))
    else:
        if not DU2017.is_dir():
            pytest.skip(f"real-data comparison: {DU2017} is not present on this machine")
        sources = (DU2017 / "src-test.txt").read_text(encoding="utf-8").splitlines()
        refs = (DU2017 / "tgt-test.txt").read_text(encoding="utf-8").splitlines()
        rng = np.random.default_rng(1)
        hyps = []
        for source, ref in zip(sources, refs):
            words = source.split()
            start = int(rng.integers(0, max(1, len(words) - 6)))
            hyps.append(" ".join([ref.split()[0], *words[start:start + int(rng.integers(4, 12))], "?"]))
    paths = tuple(root / name for name in ("src.txt", "ref.txt", "hyp.txt"))
    for path, lines in zip(paths, (sources, refs, hyps)):
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


def read(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def du_grouping(sources, refs, hyps):
    """Du et al.'s eval.py: key = source line, references appended, the last prediction kept."""
    gts, res = {}, {}
    for source, ref, hyp in zip(sources, refs, hyps):
        gts.setdefault(source, []).append(ref)
        res[source] = [hyp]
    return gts, res


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "per-example"])
def test_bleu_and_rouge_l_equal_pycocoevalcap(qg_files, grouped):
    pytest.importorskip("pycocoevalcap", reason="pycocoevalcap (the coco scorer compared with) is not installed")
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.rouge.rouge import Rouge

    src, ref, hyp = qg_files
    sources, refs, hyps = read(src), read(ref), read(hyp)
    if grouped:
        gts, res = du_grouping(sources, refs, hyps)
        ours = score("score_questions.py", hyp, "--refs", ref, "--group-by-source", src)
    else:
        gts = {i: [r] for i, r in enumerate(refs)}
        res = {i: [h] for i, h in enumerate(hyps)}
        ours = score("score_questions.py", hyp, "--refs", ref)
    coco_bleu, coco_item_bleu = Bleu(4).compute_score(gts, res, verbose=0)
    coco_rouge, coco_item_rouge = Rouge().compute_score(gts, res)
    assert ours["counts"]["scored_items"] == len(gts) and ours["counts"]["examples"] == len(hyps)
    np.testing.assert_allclose([ours["scores"][n] / 100 for n in BLEU_NAMES], coco_bleu, rtol=0, atol=1e-6)
    assert ours["scores"]["ROUGE-L"] / 100 == pytest.approx(coco_rouge, abs=1e-6)
    rows = ours["per_example"]
    np.testing.assert_allclose([[r[n] / 100 for n in BLEU_NAMES] for r in rows], np.array(coco_item_bleu).T,
                               rtol=0, atol=1e-6)
    np.testing.assert_allclose([r["ROUGE-L"] / 100 for r in rows], coco_item_rouge, rtol=0, atol=1e-9)


def test_bleu_equals_nltk_corpus_bleu_under_the_same_grouping(qg_files, tmp_path):
    """nltk counts a hypothesis without n-grams of order n as one guess (``max(1, count)``), coco as none,
    so the two agree when every scored hypothesis has at least 4 tokens: the comparison keeps those."""
    from nltk.translate.bleu_score import corpus_bleu

    src, ref, hyp = qg_files
    sources, refs, hyps = read(src), read(ref), read(hyp)
    gts, res = du_grouping(sources, refs, hyps)
    keep = {key for key in gts if len(res[key][0].split()) >= 4}
    assert len(keep) > 0.8 * len(gts)
    rows = [row for row in zip(sources, refs, hyps) if row[0] in keep]
    for path, column in zip((src, ref, hyp), zip(*rows)):
        (tmp_path / path.name).write_text("\n".join(column) + "\n", encoding="utf-8")
    references = [[r.split() for r in gts[key]] for key in gts if key in keep]
    hypotheses = [res[key][0].split() for key in gts if key in keep]
    expected = [corpus_bleu(references, hypotheses, weights=[1 / n] * n) for n in range(1, 5)]
    ours = score("score_questions.py", tmp_path / hyp.name, "--refs", tmp_path / ref.name,
                 "--group-by-source", tmp_path / src.name)
    np.testing.assert_allclose([ours["scores"][n] / 100 for n in BLEU_NAMES], expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("stemmer", [True, False], ids=["stemmer", "no-stemmer"])
def test_rouge_equals_rouge_score(qg_files, stemmer):
    from rouge_score import rouge_scorer

    _, ref, hyp = qg_files
    types = ["rouge1", "rouge2", "rougeL"]
    scorer = rouge_scorer.RougeScorer(types, use_stemmer=stemmer)
    expected = np.array([[[*scorer.score(r, h)[t]] for t in types] for h, r in zip(read(hyp), read(ref))])
    ours = score("score_summaries.py", hyp, "--refs", ref, "--precision-recall",
                 *([] if stemmer else ["--no-stemmer"]))
    names = [f"ROUGE-{t} {p}" for t in ("1", "2", "L") for p in ("P", "R", "F1")]
    rows = np.array([[row[n] / 100 for n in names] for row in ours["per_example"]])
    np.testing.assert_allclose(rows, expected.reshape(len(expected), -1), rtol=0, atol=1e-12)
    np.testing.assert_allclose([ours["scores"][n] / 100 for n in names], expected.reshape(len(expected), -1).mean(0),
                               rtol=0, atol=1e-12)
