"""Masked decoding end to end: fairseq-train --task sparse_seq2seq, then fairseq-generate and
fairseq-interactive with the masking flags, on the toy corpus (every target word occurs in its source)."""
from __future__ import annotations

import pytest

from conftest import N_TEST, ROOT, TRAIN_COMMON, output_lines, run_cli

USER_DIR = ("--user-dir", ROOT / "user_dir")
MASKS = {
    "topk": ["--decoding-topk", "5"],
    "source": ["--source-vocab-mask"],
    "topk+source": ["--decoding-topk", "5", "--source-vocab-mask"],
    "topk<beam, finite fill": ["--decoding-topk", "3", "--decoding-mask-fill", "-10000"],
}


def _generate(data, checkpoint, *flags, task="sparse_seq2seq"):
    return run_cli("fairseq-generate", data, *USER_DIR, "--task", task, "--path", checkpoint, "--cpu",
                   "--batch-size", "16", "--gen-subset", "test", *flags)


def _check(output: str, sources: dict[int, str], flags: list[str], nbest: int = 1) -> dict[int, list[list[str]]]:
    """Every input has 1..nbest hypotheses; with --source-vocab-mask each word occurs in its source."""
    hypotheses = output_lines(output, "H")
    assert sorted(hypotheses) == sorted(sources), "one entry per input sentence, none dropped"
    assert all(1 <= len(h) <= nbest for h in hypotheses.values())
    if "--source-vocab-mask" in flags:
        for i, hyps in hypotheses.items():
            for _score, text in hyps:
                assert set(text.split()) <= set(sources[i].split()), (sources[i], text)
    return hypotheses


@pytest.mark.parametrize("mask", sorted(MASKS))
def test_generate(mask, toy_data, checkpoint):
    out = _generate(toy_data, checkpoint, "--beam", "5", *MASKS[mask]).stdout
    sources = {i: s[0] for i, (s,) in output_lines(out, "S").items()}
    assert len(sources) == N_TEST
    _check(out, sources, MASKS[mask])


@pytest.mark.parametrize("mask", sorted(MASKS))
def test_interactive(mask, toy_data, checkpoint):
    lines = (toy_data.parent / "raw" / "test.src").read_text().splitlines()
    out = run_cli("fairseq-interactive", toy_data, *USER_DIR, "--task", "sparse_seq2seq", "--path", checkpoint,
                  "--cpu", "--source-lang", "src", "--target-lang", "tgt", "--beam", "5", "--batch-size", "4",
                  "--buffer-size", "8", "--input", toy_data.parent / "raw" / "test.src", *MASKS[mask]).stdout
    _check(out, dict(enumerate(lines)), MASKS[mask])


def test_interactive_empty_source(toy_data, checkpoint, tmp_path):
    """An empty line allows only EOS under --source-vocab-mask: with --min-len 0 its output is empty."""
    lines = (toy_data.parent / "raw" / "test.src").read_text().splitlines()[:3]
    lines.insert(1, "")
    (tmp_path / "input.txt").write_text("\n".join(lines) + "\n")
    out = run_cli("fairseq-interactive", toy_data, *USER_DIR, "--task", "sparse_seq2seq", "--path", checkpoint,
                  "--cpu", "--source-lang", "src", "--target-lang", "tgt", "--beam", "5", "--min-len", "0",
                  "--source-vocab-mask", "--decoding-topk", "5", "--input", tmp_path / "input.txt").stdout
    hypotheses = _check(out, dict(enumerate(lines)), ["--source-vocab-mask"])
    assert hypotheses[1] == [[hypotheses[1][0][0], ""]]


def test_topk_at_least_vocab_is_plain_beam_search(toy_data, checkpoint):
    """Identical H/P lines, decoded by stock --task translation without the flag."""
    def scored(out):
        return [line for line in out.splitlines() if line[:2] in ("H-", "P-", "D-")]

    plain = scored(_generate(toy_data, checkpoint, "--beam", "5", task="translation").stdout)
    assert len(plain) == 3 * N_TEST
    assert scored(_generate(toy_data, checkpoint, "--beam", "5", "--decoding-topk", "100000").stdout) == plain
    assert scored(_generate(toy_data, checkpoint, "--beam", "5", "--decoding-topk", "2").stdout) != plain


def test_checkpoint_trained_with_stock_translation_task(toy_data, tmp_path):
    run_cli("fairseq-train", toy_data, *TRAIN_COMMON, "--task", "translation", "--arch", "transformer_tiny",
            "--criterion", "sparse_softmax", "--max-update", "20", "--save-dir", tmp_path)
    out = _generate(toy_data, tmp_path / "checkpoint_last.pt", "--beam", "3", "--decoding-topk", "3",
                    "--source-vocab-mask").stdout
    sources = {i: s[0] for i, (s,) in output_lines(out, "S").items()}
    _check(out, sources, ["--source-vocab-mask"])


def test_masks_compose_with_generation_options(toy_data, checkpoint):
    flags = ["--decoding-topk", "5", "--source-vocab-mask", "--beam", "4", "--nbest", "3", "--lenpen", "1.2",
             "--no-repeat-ngram-size", "2", "--min-len", "2", "--max-len-b", "6", "--prefix-size", "1", "--unkpen", "1",
             "--print-alignment"]
    out = _generate(toy_data, checkpoint, *flags).stdout
    assert sum(map(len, output_lines(out, "A").values())) == sum(map(len, output_lines(out, "H").values()))
    sources = {i: s[0] for i, (s,) in output_lines(out, "S").items()}
    targets = {i: t[0] for i, (t,) in output_lines(out, "T").items()}
    for i, hyps in _check(out, sources, flags, nbest=3).items():
        for _score, text in hyps:
            words = text.split()
            assert 2 <= len(words) <= 6, text  # --min-len 2, --max-len-b 6 (EOS not printed)
            assert words[0] == targets[i].split()[0], "--prefix-size 1 forces the reference's first word"
            bigrams = list(zip(words, words[1:]))
            assert len(bigrams) == len(set(bigrams)), f"repeated bigram despite --no-repeat-ngram-size 2: {text}"


def test_other_searches_are_refused(toy_data, checkpoint):
    proc = run_cli("fairseq-generate", toy_data, *USER_DIR, "--task", "sparse_seq2seq", "--path", checkpoint, "--cpu",
                   "--gen-subset", "test", "--sampling", "--beam", "2", "--nbest", "2", "--decoding-topk", "5",
                   check=False)
    assert proc.returncode != 0
    assert "--decoding-topk / --source-vocab-mask work with plain beam search, not with --sampling" in proc.stderr
