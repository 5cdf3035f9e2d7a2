"""The scoring library on cases small enough to work out by hand; every expected number below was
computed on paper from the definitions (coco BLEU, coco ROUGE-L, ROUGE-N/L F1), not by the code."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sparse_softmax.scoring import bleu
from sparse_softmax.scoring.inputs import InputError, load_pairs, parse_fairseq_output, read_lines, remove_bpe
from sparse_softmax.scoring.report import bootstrap_interval
from sparse_softmax.scoring.rouge import coco_rouge_l, lcs_length, postprocess, rouge_scores
from sparse_softmax.userinput import UserInputError


def corpus(hyps, refs):
    return bleu.corpus_bleu(bleu.collect_stats(hyps, refs))


# --- BLEU ---------------------------------------------------------------------------------------

def test_bleu_one_item_by_hand():
    # unigrams 5/6 (the×2 cat on mat), bigrams 3/5 (the cat, on the, the mat), trigrams 1/4 (on the mat),
    # 4-grams 0/3; equal lengths, no brevity penalty. BLEU-4 is not 0: coco keeps 1e-15 / (3 + 1e-9).
    scores = corpus(["the cat sat on the mat"], [["the cat is on the mat"]])
    assert scores[0] == pytest.approx(5 / 6, rel=1e-9)
    assert scores[1] == pytest.approx(math.sqrt(5 / 6 * 3 / 5), rel=1e-9)
    assert scores[2] == pytest.approx(0.5, rel=1e-9)
    assert scores[3] == pytest.approx((0.125 * 1e-15 / 3) ** 0.25, rel=1e-6)


def test_bleu_clips_by_the_largest_count_over_references():
    # 'the' ×4 in the hypothesis, at most ×2 in one reference: 2/4. Reference lengths 2 and 3; 3 is
    # closest to 4, so no brevity penalty.
    assert corpus(["the the the the"], [["the cat", "the the dog"]])[0] == pytest.approx(0.5, rel=1e-9)


def test_bleu_brevity_penalty_takes_the_closest_reference_and_the_shorter_on_ties():
    # |4 - 3| = |2 - 3|: the shorter (2) is used, ratio 3/2 >= 1, no penalty. No 4-gram can be guessed:
    # coco's precision is then 1e-15 / 1e-9.
    scores = corpus(["a b c"], [["a b c d", "a b"]])
    assert scores[:3] == pytest.approx([1.0, 1.0, 1.0], rel=1e-9)
    assert scores[3] == pytest.approx(1e-6 ** 0.25, rel=1e-6)
    # Only the 4-token reference: ratio 3/4, penalty exp(1 - 4/3).
    assert corpus(["a b c"], [["a b c d"]])[0] == pytest.approx(math.exp(1 - 4 / 3), rel=1e-9)


def test_bleu_brevity_penalty_is_corpus_level():
    # Hypothesis lengths 2 + 2 = 4 against closest references 4 + 2 = 6: ratio 2/3, penalty exp(-1/2);
    # unigrams 4/4.
    scores = corpus(["a b", "c d"], [["a b x y"], ["c d"]])
    assert scores[0] == pytest.approx(math.exp(1 - 6 / 4), rel=1e-9)


def test_bleu_sums_counts_over_the_corpus_not_scores():
    # 2/2 and 0/4 matched unigrams: corpus precision 2/6, not the mean (1 + 0) / 2.
    scores = corpus(["a b", "c d e f"], [["a b"], ["w x y z"]])
    assert scores[0] == pytest.approx(1 / 3, rel=1e-9)


def test_bleu_empty_hypothesis_adds_reference_length_only():
    # The empty hypothesis guesses nothing but its reference (3 tokens) still counts for the penalty:
    # unigrams 2/2, lengths 2 against 2 + 3.
    scores = corpus(["a b", ""], [["a b"], ["c d e"]])
    assert scores[0] == pytest.approx(math.exp(1 - 5 / 2), rel=1e-9)
    assert bleu.item_bleu(bleu.collect_stats([""], [["c d e"]]))[0] == pytest.approx([0, 0, 0, 0], abs=1e-12)


def test_item_bleu_applies_the_formula_to_each_item():
    stats = bleu.collect_stats(["a b", "a b c"], [["a b"], ["a b c d"]])
    per_item = bleu.item_bleu(stats)
    # "a b": no trigram or 4-gram to guess, each of those precisions is 1e-15 / 1e-9.
    assert per_item[0] == pytest.approx([1, 1, 1e-6 ** (1 / 3), 1e-12 ** (1 / 4)], rel=1e-6)
    assert per_item[1, 0] == pytest.approx(math.exp(1 - 4 / 3), rel=1e-9)


def test_bleu_weights_count_items_like_a_resampled_corpus():
    """Bootstrap resamples are weight vectors: the same numbers as scoring the resampled corpus."""
    rng = np.random.default_rng(0)
    words = "a b c d e f".split()
    hyps = [" ".join(rng.choice(words, rng.integers(0, 8))) for _ in range(30)]
    refs = [[" ".join(rng.choice(words, rng.integers(1, 8))) for _ in range(rng.integers(1, 4))] for _ in range(30)]
    stats = bleu.collect_stats(hyps, refs)
    draws = rng.integers(0, 30, size=(3, 30))
    weights = np.stack([np.bincount(d, minlength=30) for d in draws])
    expected = [corpus([hyps[i] for i in d], [refs[i] for i in d]) for d in draws]
    np.testing.assert_allclose(bleu.corpus_bleu(stats, weights), expected, rtol=1e-12)


def test_bootstrap_interval_brackets_the_estimate_and_is_reproducible():
    values = np.arange(100, dtype=float)[:, None]
    mean = lambda w: w @ values / 100  # noqa: E731
    low, high = bootstrap_interval(mean, 100, 400, seed=3)
    assert low[0] < 49.5 < high[0]
    # The standard error of the mean of 0..99 is about 2.9: a 95 % interval is about ±5.7 wide.
    assert 4 < 49.5 - low[0] < 8 and 4 < high[0] - 49.5 < 8
    assert bootstrap_interval(mean, 100, 400, seed=3)[0] == low[0]


# --- ROUGE --------------------------------------------------------------------------------------

def lcs_by_table(a, b):
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1][j + 1] = table[i][j] + 1 if x == y else max(table[i][j + 1], table[i + 1][j])
    return table[-1][-1]


def test_lcs_length_matches_the_dynamic_programme():
    rng = np.random.default_rng(1)
    for _ in range(500):
        a, b = (list(rng.choice(list("abcd"), rng.integers(0, 70))) for _ in range(2))  # > 64 bits too
        assert lcs_length(a, b) == lcs_by_table(a, b), (a, b)


def test_coco_rouge_l_by_hand():
    # LCS with "a c d e f" is 3 (P 3/4, R 3/5), with "b" 1 (P 1/4, R 1): best P and best R come from
    # different references; F = (1 + 1.2²)·P·R / (R + 1.2²·P).
    p, r = 3 / 4, 1.0
    assert coco_rouge_l("a b c d", ["a c d e f", "b"]) == pytest.approx((1 + 1.44) * p * r / (r + 1.44 * p))
    assert coco_rouge_l("x y", ["a b"]) == 0.0
    assert coco_rouge_l("", ["a b"]) == 0.0


def test_rouge_scores_by_hand_with_and_without_stemming():
    types = ["rouge1", "rouge2", "rougeL"]
    # Stemmed: cats -> cat; hypothesis [the cat sat], reference [the cat sat down].
    # ROUGE-1: P 1, R 3/4, F 6/7; ROUGE-2: 2 of 2 bigrams, of 3: F 0.8; ROUGE-L: LCS 3, as ROUGE-1.
    stemmed = rouge_scores(["the cats sat"], ["the cat sat down"], types, use_stemmer=True)[0]
    np.testing.assert_allclose(stemmed[:, 2], [6 / 7, 0.8, 6 / 7], rtol=1e-12)
    np.testing.assert_allclose(stemmed[0, :2], [1.0, 0.75], rtol=1e-12)
    # Unstemmed: 2 of 3 unigrams against 4 (F 4/7), no bigram in common.
    plain = rouge_scores(["the cats sat"], ["the cat sat down"], types, use_stemmer=False)[0]
    np.testing.assert_allclose(plain[:, 2], [4 / 7, 0.0, 4 / 7], rtol=1e-12, atol=1e-15)


def test_gigaword_postprocessing():
    text = "Police kill <unk> in 12 raids"
    assert postprocess(text) == text
    assert postprocess(text, lowercase=True, map_unk=True, digits_to_hash=True) == "police kill UNK in ## raids"
    # rouge-score drops '#', so a model's digits only match the references' '#'s after the mapping:
    # hypothesis [12 kill in blast] vs reference [kill in blast]: P 3/4, R 1, F 6/7; then identical.
    hyp, ref = "12 killed in blast", "## killed in blast"
    assert rouge_scores([hyp], [ref], ["rouge1"])[0, 0, 2] == pytest.approx(6 / 7)
    assert rouge_scores([postprocess(hyp, digits_to_hash=True)], [ref], ["rouge1"])[0, 0, 2] == pytest.approx(1.0)


# --- inputs -------------------------------------------------------------------------------------

GENERATE_OUTPUT = """\
2026-11-22 00:00:00 | INFO | fairseq_cli.generate | loading model(s)
S-2\tc d
T-2\tc\u2581d
H-2\t-0.5\t\u2581c \u2581d
H-2\t-0.9\t\u2581x
D-2\t-0.5\tc d
P-2\t-0.1 -0.2 -0.3
S-0\ta b
T-0\t\u2581a \u2581b
H-0\t-0.1\t\u2581a \u2581b
S-1\te
T-1\t\u2581e <<unk>>
H-1\t-1.0\t
Generate test with beam=5: BLEU4 = 50.00
"""


def test_fairseq_output_is_read_by_id_with_nbest_and_unk_noted(tmp_path):
    path = tmp_path / "gen.txt"
    path.write_text(GENERATE_OUTPUT, encoding="utf-8")
    parsed = parse_fairseq_output(path, read_lines(path, []))
    assert parsed.hypotheses == ["\u2581a \u2581b", "", "\u2581c \u2581d"]
    assert parsed.references == ["\u2581a \u2581b", "\u2581e <<unk>>", "c\u2581d"]
    assert parsed.extra_hypotheses == 1 and parsed.escaped_unk_references == 1
    pairs = load_pairs(path, None, bpe="sentencepiece")
    assert pairs.hypotheses == ["a b", "", "c d"]
    assert pairs.references == ["a b", "e<<unk>>", "c d"]
    assert pairs.empty_hypotheses == 1
    assert any("n-best" in note for note in pairs.notes) and any("<<unk>>" in note for note in pairs.notes)


@pytest.mark.parametrize("scheme", ["sentencepiece", "subword_nmt", "none"])
def test_remove_bpe_matches_fairseq_post_process(scheme):
    post_process = pytest.importorskip("fairseq.data.data_utils").post_process

    for text in ["\u2581the \u2581ca t \u2581sat", "the ca@@ t sat@@", " \u2581a  b ", "", "no@@ n@@ e"]:
        assert remove_bpe(text, scheme) == post_process(text, scheme), text


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


@pytest.mark.parametrize(
    "hyp_text, ref_text, message",
    [
        ("a\nb\n", "a\n", r"2 hypotheses in .*hyp.txt but 1 references in .*ref.txt"),
        ("a\nb\n", "a\n\n", r"ref.txt: line 2: empty reference"),
        ("a\nb\n", b"a\n\xffb\n", r"ref.txt:2: not UTF-8 \(byte 0xff at column 1\)"),
        (b"ok\nok \xe9t\xe9\n", "a\nb\n", r"hyp.txt:2: not UTF-8 \(byte 0xe9 at column 4\)"),
        ("", "a\n", r"hyp.txt: the file is empty"),
        ("H-0\t-1\ta\nH-2\t-1\tb\n", "a\nb\n", r"hyp.txt: 1 of the sentence ids 0..2 have no H- line \(1\)"),
        ("H-0\t-1\ta\nH-1\tb\n", "a\nb\n", r"hyp.txt:2: expected 'H-<id><TAB><score><TAB><text>'"),
        ("H-0\t-1\ta\nH-1\t-1\tb\nT-0\ta\n", None, r"hyp.txt: 1 of the sentence ids 0..1 have no T- line \(1\)"),
        ("H-0\t-1\ta\nT-0\ta\nT-4\tb\n", None, r"hyp.txt: T- lines for ids without an H- line \(4\)"),
        ("H-0\t-1\ta\nT-0\ta\nT-0\ta\n", None, r"hyp.txt:3: a second T-0 line"),
        ("H-0\t-1\ta\nT-0\t\n", None, r"hyp.txt: T- line of id 0: empty reference"),
        ("H-0\t-1\ta\n", None, r"hyp.txt: no T- lines"),
        ("a\n", None, r"plain text hypotheses need --refs"),
        ("a b\n\u2581c \u2581d\n", "a b\nc d\n",
         r"hyp.txt: 1 of 2 hypotheses contain sentencepiece subword markers \(example 1: .*--remove-bpe sentencepiece"),
        ("H-0\t-1\tab\nT-0\ta@@ b\n", None, r"hyp.txt: 1 of 1 references contain subword_nmt .*--remove-bpe subword_nmt"),
        ("a b\nc\n", "a b\n\u2581c\n", r"ref.txt: 1 of 2 references contain sentencepiece .*as plain text"),
    ],
)
def test_bad_input_is_refused_with_file_and_line(tmp_path, hyp_text, ref_text, message):
    hyp = write(tmp_path, "hyp.txt", hyp_text)
    ref = write(tmp_path, "ref.txt", ref_text) if ref_text is not None else None
    with pytest.raises(UserInputError, match=message):
        load_pairs(hyp, ref)


def test_subword_markers_left_by_the_wrong_scheme_are_refused_unless_allowed(tmp_path):
    hyp = write(tmp_path, "hyp.txt", "\u2581a \u2581b@@ c\n")
    ref = write(tmp_path, "ref.txt", "a bc\n")
    with pytest.raises(InputError, match=r"--remove-bpe subword_nmt did not remove them: is sentencepiece"):
        load_pairs(hyp, ref, bpe="subword_nmt")
    assert load_pairs(hyp, ref, bpe="sentencepiece").hypotheses == ["a b@@c"]  # '@@' not followed by a space
    assert load_pairs(hyp, ref, allow_subwords=True).hypotheses == ["\u2581a \u2581b@@ c"]


def test_byte_order_marks_are_removed_and_noted(tmp_path):
    hyp = write(tmp_path, "hyp.txt", b"\xef\xbb\xbfthe cat\nsat\n")
    ref = write(tmp_path, "ref.txt", b"\xef\xbb\xbfthe cat\nsat\n")
    pairs = load_pairs(hyp, ref)
    assert pairs.hypotheses == pairs.references == ["the cat", "sat"]
    assert pairs.notes == [f"{hyp}: UTF-8 byte-order mark removed", f"{ref}: UTF-8 byte-order mark removed"]
    plain = write(tmp_path, "plain.txt", "the cat\nsat\n")
    assert load_pairs(plain, ref).notes == [f"{ref}: UTF-8 byte-order mark removed"]
    assert load_pairs(plain, plain).notes == []


def test_missing_file_is_named(tmp_path):
    with pytest.raises(UserInputError, match=r"nope.txt: no such file"):
        load_pairs(tmp_path / "nope.txt", tmp_path / "ref.txt")


def test_plain_text_keeps_empty_hypotheses_and_windows_line_ends(tmp_path):
    hyp = write(tmp_path, "hyp.txt", "a b\r\n\r\nc\r\n")
    ref = write(tmp_path, "ref.txt", "a b\nx\nc")  # no final newline
    pairs = load_pairs(hyp, ref)
    assert pairs.hypotheses == ["a b", "", "c"] and pairs.references == ["a b", "x", "c"]
    assert pairs.empty_hypotheses == 1
