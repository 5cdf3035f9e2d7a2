"""scripts/score_questions.py and scripts/score_summaries.py as users run them: on a real fairseq-generate
output, on plain text files, with each output option, and on bad input."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import N_TEST, ROOT, output_lines, run_cli, run_script

BLEU_NAMES = ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4"]


def score(script: str, *args, check: bool = True) -> subprocess.CompletedProcess:
    return run_script(f"scripts/{script}", *args, check=check)


def score_json(script: str, *args) -> dict:
    return json.loads(score(script, *args, "--json", "-").stdout)


def table_value(output: str, name: str) -> str:
    """The score printed for ``name`` in the table."""
    for line in output.splitlines():
        if line.split("  ")[0].strip() == name:
            return line[len(name):].split()[0]
    raise AssertionError(f"no {name} row in:\n{output}")


@pytest.fixture(scope="module")
def generated(toy_data, checkpoint, tmp_path_factory) -> Path:
    """fairseq-generate output (beam 5, top-5 masked decoding, n-best 2) for the 30 toy test sentences."""
    out = run_cli("fairseq-generate", toy_data, "--user-dir", ROOT / "user_dir", "--task", "sparse_seq2seq",
                  "--path", checkpoint, "--cpu", "--batch-size", "16", "--gen-subset", "test", "--beam", "5",
                  "--nbest", "2", "--decoding-topk", "5").stdout
    path = tmp_path_factory.mktemp("generated") / "generate-test.txt"
    path.write_text(out, encoding="utf-8")
    return path


def test_questions_on_fairseq_generate_output(generated, toy_data):
    pytest.importorskip("pycocoevalcap", reason="pycocoevalcap (the coco scorer compared with) is not installed")
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.rouge.rouge import Rouge

    text = generated.read_text(encoding="utf-8")
    hyps = {i: h[0][1] for i, h in output_lines(text, "H").items()}  # the best of the n-best list
    refs = {i: t[0][0] for i, t in output_lines(text, "T").items()}
    assert sorted(hyps) == list(range(N_TEST))
    gts, res = {i: [refs[i]] for i in range(N_TEST)}, {i: [hyps[i]] for i in range(N_TEST)}
    coco_bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    coco_rouge, _ = Rouge().compute_score(gts, res)

    proc = score("score_questions.py", generated)
    assert table_value(proc.stdout, "BLEU-4") == f"{100 * coco_bleu[3]:.2f}"
    assert f"{N_TEST} n-best hypotheses after the first" in proc.stdout
    ours = score_json("score_questions.py", generated)
    np.testing.assert_allclose([ours["scores"][n] / 100 for n in BLEU_NAMES], coco_bleu, atol=1e-6, rtol=0)
    assert ours["scores"]["ROUGE-L"] / 100 == pytest.approx(coco_rouge, abs=1e-6)
    assert ours["counts"] == {"examples": N_TEST, "scored_items": N_TEST, "empty_hypotheses": 0}
    # The references file fairseq-preprocess read gives the same numbers as the T- lines (no unknown words).
    with_refs = score_json("score_questions.py", generated, "--refs", toy_data.parent / "raw" / "test.tgt")
    assert with_refs["scores"] == ours["scores"]


def test_summaries_on_fairseq_generate_output(generated):
    from rouge_score import rouge_scorer

    text = generated.read_text(encoding="utf-8")
    hyps = {i: h[0][1] for i, h in output_lines(text, "H").items()}
    refs = {i: t[0][0] for i, t in output_lines(text, "T").items()}
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    expected = np.mean([[s.fmeasure for s in scorer.score(refs[i], hyps[i]).values()] for i in range(N_TEST)], 0)
    ours = score_json("score_summaries.py", generated)
    np.testing.assert_allclose([ours["scores"][n] / 100 for n in ("ROUGE-1", "ROUGE-2", "ROUGE-L")], expected,
                               atol=1e-12, rtol=0)
    assert len(ours["per_example"]) == N_TEST


def write(tmp_path: Path, name: str, lines: list[str] | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(lines if isinstance(lines, bytes) else ("\n".join(lines) + "\n").encode("utf-8"))
    return path


def test_questions_table_by_hand(tmp_path):
    # unigrams 5/6, bigrams 3/5, trigrams 1/4, no 4-gram: 83.33, 70.71, 50.00, and coco's
    # (0.125 · 1e-15 / 3)^(1/4) = 8.0e-5, printed ×100 as 0.01. LCS 5: P = R = 5/6 for ROUGE-L.
    hyp = write(tmp_path, "hyp.txt", ["the cat sat on the mat"])
    ref = write(tmp_path, "ref.txt", ["the cat is on the mat"])
    out = score("score_questions.py", hyp, "--refs", ref).stdout
    printed = [table_value(out, name) for name in [*BLEU_NAMES, "ROUGE-L"]]
    assert printed == ["83.33", "70.71", "50.00", "0.01", "83.33"]


def test_grouping_keeps_the_last_prediction_per_source(tmp_path):
    # Source s1 has predictions "x y" then "a b" and references "a b", "c d"; s2 predicts "c d" for "c d".
    # Grouped: "a b" and "c d" both match fully: 100. Per example: 2 of 6 unigrams match: 33.33.
    hyp = write(tmp_path, "hyp.txt", ["x y", "c d", "a b"])
    ref = write(tmp_path, "ref.txt", ["a b", "c d", "c d"])
    src = write(tmp_path, "src.txt", ["s1", "s2", "s1"])
    grouped = score_json("score_questions.py", hyp, "--refs", ref, "--group-by-source", src)
    assert grouped["scores"]["BLEU-1"] == pytest.approx(100)
    assert grouped["counts"] == {"examples": 3, "scored_items": 2, "empty_hypotheses": 0}
    assert [row["examples"] for row in grouped["per_example"]] == [[0, 2], [1]]
    per_example = score_json("score_questions.py", hyp, "--refs", ref)
    assert per_example["scores"]["BLEU-1"] == pytest.approx(100 / 3)


def test_ptb_hypotheses_rejoin_what_a_bert_tokenizer_split(tmp_path):
    hyp = write(tmp_path, "hyp.txt", ["who is notre dame ' s 1 , 000th student ?"])
    ref = write(tmp_path, "ref.txt", ["who is notre dame 's 1,000th student ?"])
    assert score_json("score_questions.py", hyp, "--refs", ref)["scores"]["BLEU-1"] < 70
    fixed = score_json("score_questions.py", hyp, "--refs", ref, "--ptb-hypotheses")
    assert fixed["scores"]["BLEU-4"] == pytest.approx(100) and fixed["settings"]["ptb_hypotheses"]


def test_empty_hypotheses_are_scored_as_zero_and_reported(tmp_path):
    hyp = write(tmp_path, "hyp.txt", ["a b", ""])
    ref = write(tmp_path, "ref.txt", ["a b", "c d e"])
    proc = score("score_questions.py", hyp, "--refs", ref)
    assert "empty hypotheses: 1" in proc.stdout and "1 empty hypotheses, scored as zero" in proc.stdout
    # BLEU-1: 2/2 unigrams, penalty exp(1 - 5/2).
    assert table_value(proc.stdout, "BLEU-1") == f"{100 * np.exp(1 - 5 / 2):.2f}"
    summaries = score_json("score_summaries.py", hyp, "--refs", ref)
    assert summaries["counts"]["empty_hypotheses"] == 1
    assert [row["ROUGE-1"] for row in summaries["per_example"]] == [100.0, 0.0]


def test_json_file_bootstrap_and_sacrebleu(tmp_path, toy_data):
    import sacrebleu

    raw = toy_data.parent / "raw"
    hyps = [" ".join(line.split()[:4]) for line in (raw / "test.src").read_text().splitlines()]
    hyp = write(tmp_path, "hyp.txt", hyps)
    ref = raw / "test.tgt"
    out = tmp_path / "scores.json"
    proc = score("score_questions.py", hyp, "--refs", ref, "--bootstrap", "200", "--sacrebleu", "--json", out)
    result = json.loads(out.read_text())
    assert "95% CI" in proc.stdout
    for name, (low, high) in result["confidence_95"].items():
        assert low <= result["scores"][name] <= high and high - low > 0, name
    expected = sacrebleu.corpus_bleu(hyps, [ref.read_text().splitlines()])
    assert result["settings"]["sacrebleu"]["score"] == pytest.approx(expected.score)
    assert f"sacrebleu: {expected}" in proc.stdout
    again = score_json("score_questions.py", hyp, "--refs", ref, "--bootstrap", "200")
    assert again["confidence_95"] == result["confidence_95"], "the same seed gives the same interval"


def test_summaries_options(tmp_path):
    hyp = write(tmp_path, "hyp.txt", ["Police kill <unk> in 12 raids"])
    ref = write(tmp_path, "ref.txt", ["police kill UNK in ## raids"])
    # rouge-score drops '#': the digits are the only difference before --digits-to-hash.
    # Hypothesis [police kill unk in 12 raid] vs [police kill unk in raid]: P 5/6, R 1.
    plain = score_json("score_summaries.py", hyp, "--refs", ref, "--precision-recall")
    assert plain["scores"]["ROUGE-1 P"] == pytest.approx(500 / 6)
    assert plain["scores"]["ROUGE-1 R"] == pytest.approx(100)
    mapped = score_json("score_summaries.py", hyp, "--refs", ref, "--lowercase", "--map-unk", "--digits-to-hash",
                        "--rouge-types", "rouge1,rougeL")
    assert mapped["scores"] == {"ROUGE-1": pytest.approx(100), "ROUGE-L": pytest.approx(100)}
    proc = score("score_summaries.py", hyp, "--refs", ref, "--rouge-types", "rouge3", check=False)
    assert proc.returncode == 2 and "--rouge-types: unknown ['rouge3']" in proc.stderr


def test_sentencepiece_output_is_decoded(tmp_path):
    gen = write(tmp_path, "gen.txt", ["H-1\t-0.2\t\u2581what \u2581is \u2581it", "H-0\t-0.1\t\u2581who \u2581w as",
                                      "T-1\t\u2581what \u2581is \u2581it", "T-0\t\u2581who \u2581was"])
    ours = score_json("score_questions.py", gen, "--remove-bpe", "sentencepiece")
    assert ours["scores"]["BLEU-1"] == pytest.approx(100)
    undecoded = score_json("score_questions.py", gen, "--allow-subwords")
    assert undecoded["scores"]["BLEU-1"] < 100


@pytest.mark.parametrize("script, metric", [("score_questions.py", "BLEU-4"), ("score_summaries.py", "ROUGE-2")])
def test_a_byte_order_mark_does_not_change_the_scores(tmp_path, script, metric):
    text = ["what is the capital of france ?", "who wrote the book ?"]
    plain = write(tmp_path, "plain.txt", text)
    marked = write(tmp_path, "marked.txt", b"\xef\xbb\xbf" + plain.read_bytes())
    proc = score(script, marked, "--refs", plain)
    assert table_value(proc.stdout, metric) == "100.00"
    assert f"note: {marked}: UTF-8 byte-order mark removed" in proc.stdout


@pytest.mark.parametrize("script", ["score_questions.py", "score_summaries.py"])
def test_forgotten_subword_removal_is_refused(tmp_path, script):
    gen = write(tmp_path, "gen.txt", ["H-0\t-0.1\t\u2581the \u2581c at", "T-0\t\u2581the \u2581c at"])
    proc = score(script, gen, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"{script}: error: {gen}: 1 of 1 hypotheses contain sentencepiece subword markers")
    assert "score with --remove-bpe sentencepiece, or pass --allow-subwords" in proc.stderr


@pytest.mark.parametrize("script", ["score_questions.py", "score_summaries.py"])
def test_bad_input_exits_with_a_message(tmp_path, script):
    hyp = write(tmp_path, "hyp.txt", ["a b", "c"])
    short = write(tmp_path, "short.txt", ["a b"])
    proc = score(script, hyp, "--refs", short, check=False)
    assert proc.returncode == 2
    assert "error: 2 hypotheses in" in proc.stderr and "but 1 references in" in proc.stderr
    latin1 = write(tmp_path, "latin1.txt", "caf\xe9\nb\n".encode("latin-1"))
    proc = score(script, hyp, "--refs", latin1, check=False)
    assert proc.returncode == 2 and "latin1.txt:1: not UTF-8" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_group_by_source_file_is_checked(tmp_path):
    hyp = write(tmp_path, "hyp.txt", ["a b", "c"])
    src = write(tmp_path, "src.txt", ["s"])
    proc = score("score_questions.py", hyp, "--refs", hyp, "--group-by-source", src, check=False)
    assert proc.returncode == 2 and "1 source lines in" in proc.stderr and "for 2 examples" in proc.stderr
    proc = score("score_questions.py", hyp, "--refs", hyp, "--group-by-source", tmp_path / "none.txt", check=False)
    assert proc.returncode == 2 and "none.txt: no such file" in proc.stderr
