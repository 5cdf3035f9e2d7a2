"""data-prep/prepare_gigaword.py and data-prep/prepare_squad_qg.py on the shipped fixtures (synthetic
Gigaword in both input formats, a hand-written SQuAD JSON), their refusals of bad input, fairseq-train
on what they produce, and the Du et al. 2017 files from ../shared/data when present."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SHARED_DATA, TRAIN_COMMON, json_logs, run_cli, run_script

FIXTURES = ROOT / "tests" / "fixtures"
GIGA_HARVARD = FIXTURES / "gigaword_harvard"
GIGA_UNILM = FIXTURES / "gigaword_unilm"
SQUAD = ("--train-json", FIXTURES / "squad_train.json", "--dev-json", FIXTURES / "squad_dev.json")
DU2017 = SHARED_DATA / "squad_qg_du2017"
GIGA10K = SHARED_DATA / "gigaword"


def prep(script: str, *args, check: bool = True) -> subprocess.CompletedProcess:
    return run_script(f"data-prep/{script}", *args, check=check)


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def summary(out: Path) -> dict:
    return json.loads((out / "prep_summary.json").read_text())


def train_briefly(data_bin: Path, save_dir: Path) -> list[dict]:
    proc = run_cli("fairseq-train", data_bin, *TRAIN_COMMON, "--task", "sparse_seq2seq", "--arch",
                   "transformer_tiny", "--share-all-embeddings", "--criterion", "sparse_softmax",
                   "--sparse-topk", "5", "--max-update", "6", "--save-dir", save_dir)
    return json_logs(proc, "train_inner")


# --- Gigaword -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def giga(tmp_path_factory) -> dict[str, Path]:
    outs = {}
    for fmt, root in (("harvard", GIGA_HARVARD), ("unilm", GIGA_UNILM)):
        outs[fmt] = tmp_path_factory.mktemp(f"giga_{fmt}")
        prep("prepare_gigaword.py", root, outs[fmt], "--spm-vocab-size", "80")
    return outs


def test_gigaword_formats_give_the_same_data(giga):
    harvard, unilm = giga["harvard"], giga["unilm"]
    assert summary(harvard)["input_format"] == "harvard" and summary(unilm)["input_format"] == "unilm"
    for name in ["train.src", "train.tgt", "valid.src", "test.tgt", "test.ref", "dict.txt",
                 "data-bin/train.src-tgt.src.bin", "data-bin/test.src-tgt.tgt.bin"]:
        assert (harvard / name).read_bytes() == (unilm / name).read_bytes(), name


def test_gigaword_counts_references_and_unk(giga):
    out = giga["harvard"]
    articles = lines(GIGA_HARVARD / "train" / "train.article.txt")
    assert lines(out / "train.src") == [a.replace("<unk>", "UNK") for a in articles]
    assert lines(out / "train.tgt") == lines(GIGA_HARVARD / "train" / "train.title.txt")
    assert lines(out / "test.ref") == lines(GIGA_HARVARD / "Giga" / "task1_ref0.txt")
    splits = summary(out)["splits"]
    assert {s: (c["read"], c["written"]) for s, c in splits.items()} == {
        "train": (40, 40), "valid": (6, 6), "test": (5, 5)}
    assert splits["train"]["edited"] == {"<unk> written as UNK": 1}
    assert summary(out)["binarised_sentences"] == {"train": 40, "valid": 6, "test": 5}


def test_gigaword_subset_and_truncation(tmp_path):
    prep("prepare_gigaword.py", GIGA_UNILM / "org_data", tmp_path, "--train-subset", "10",
         "--max-source-tokens", "12", "--max-target-tokens", "4", "--text-only")
    articles = lines(GIGA_UNILM / "org_data" / "train.src.txt")[:10]
    assert lines(tmp_path / "train.src") == [" ".join(a.split()[:12]).replace("<unk>", "UNK") for a in articles]
    titles = lines(GIGA_UNILM / "org_data" / "train.tgt.txt")[:10]
    assert lines(tmp_path / "train.tgt") == [" ".join(t.split()[:4]) for t in titles]
    assert lines(tmp_path / "test.ref") == lines(GIGA_UNILM / "org_data" / "test.tgt.txt"), "references untouched"
    edited = summary(tmp_path)["splits"]["train"]["edited"]
    assert edited["source truncated to 12 tokens"] == 10
    assert edited["target truncated to 4 tokens"] == sum(len(t.split()) > 4 for t in titles)
    assert not (tmp_path / "data-bin").exists()


def test_gigaword_valid_split_held_out_of_train(tmp_path):
    root = tmp_path / "in"
    shutil.copytree(GIGA_HARVARD, root)
    for name in ("valid.article.filter.txt", "valid.title.filter.txt"):
        (root / "train" / name).unlink()  # a release without a valid split
    prep("prepare_gigaword.py", root, tmp_path / "out", "--train-subset", "10", "--valid-from-train", "3",
         "--text-only")
    articles = [a.replace("<unk>", "UNK") for a in lines(GIGA_HARVARD / "train" / "train.article.txt")]
    titles = lines(GIGA_HARVARD / "train" / "train.title.txt")
    assert lines(tmp_path / "out" / "train.src") == articles[:7] and lines(tmp_path / "out" / "train.tgt") == titles[:7]
    assert lines(tmp_path / "out" / "valid.src") == articles[7:10] and lines(tmp_path / "out" / "valid.tgt") == titles[7:10]
    splits = summary(tmp_path / "out")["splits"]
    assert {s: (c["read"], c["written"]) for s, c in splits.items()} == {
        "train": (10, 7), "valid": (3, 3), "test": (5, 5)}
    assert splits["train"]["moved"] == {"held out as the valid split (--valid-from-train 3)": 3}
    proc = prep("prepare_gigaword.py", root, tmp_path / "out2", "--train-subset", "4", "--valid-from-train", "4",
                "--text-only", check=False)
    assert proc.returncode == 2 and "--valid-from-train 4: " in proc.stderr and "Traceback" not in proc.stderr
    proc = prep("prepare_gigaword.py", root, tmp_path / "out3", "--text-only", check=False)
    assert proc.returncode == 2 and "valid.article.filter.txt: no such file" in proc.stderr, proc.stderr


def test_gigaword_help_keeps_its_examples_lines():
    text = prep("prepare_gigaword.py", "--help").stdout
    assert "--train-subset 10000 \\\n        --hf-tokenizer models/all-MiniLM-L6-v2" in text


def test_gigaword_10k_real_data_counts(tmp_path):
    """The shared Gigaword-10k files as the summarization experiment prepares them: 10,000 pairs in, 9,500 train
    and 500 valid out, the 1,951 test pairs with their references exactly as given."""
    if not GIGA10K.is_dir():
        pytest.skip(f"real data: {GIGA10K} is not present on this machine")
    prep("prepare_gigaword.py", GIGA10K, tmp_path, "--valid-from-train", "500", "--text-only")
    splits = summary(tmp_path)["splits"]
    assert {s: (c["read"], c["written"]) for s, c in splits.items()} == {
        "train": (10000, 9500), "valid": (500, 500), "test": (1951, 1951)}
    assert sum(splits["train"]["skipped"].values()) == 0 and splits["test"]["skipped"] == {}
    assert lines(tmp_path / "test.ref") == lines(GIGA10K / "Giga" / "task1_ref0.txt")
    assert lines(tmp_path / "valid.tgt") == lines(GIGA10K / "train" / "train.title.txt")[-500:]


def copy_giga(tmp_path: Path) -> Path:
    root = tmp_path / "in"
    shutil.copytree(GIGA_HARVARD, root)
    return root


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda r: (r / "train/train.title.txt").write_text("a\nb\n"),
         r"train.title.txt has 2 lines but .*train.article.txt has 40"),
        (lambda r: (r / "Giga/task1_ref0.txt").unlink(), r"task1_ref0.txt: no such file \(harvard test target\)"),
        (lambda r: (r / "train/train.article.txt").unlink(), r"cannot tell the input format"),
        (lambda r: shutil.rmtree(r), r"in: no such folder \(expected harvardnlp's sumdata release"),
        (lambda r: [(r / "Giga" / name).write_text("") for name in ("input.txt", "task1_ref0.txt")],
         r"the test split is empty \(test: 0 in, 0 out; from .*input.txt and .*task1_ref0.txt\): fairseq cannot"),
    ],
    ids=["line counts", "missing file", "no format", "no folder", "empty test split"],
)
def test_gigaword_refuses_bad_input(tmp_path, damage, message):
    root = copy_giga(tmp_path)
    damage(root)
    # not --text-only: with it an empty split is a warning (it binarises nothing); every refusal comes before
    # the binarising
    proc = prep("prepare_gigaword.py", root, tmp_path / "out", check=False)
    assert proc.returncode == 2 and re.search(message, proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists(), "a failed run writes nothing"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")], "no partial folder is left"


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_output_folder_is_replaced_only_by_a_run_that_succeeds(tmp_path):
    root = copy_giga(tmp_path)
    out = tmp_path / "out"
    prep("prepare_gigaword.py", root, out, "--spm-vocab-size", "80")
    before = tree(out)
    assert "data-bin/train.src-tgt.src.bin" in before and "spm.model" in before
    proc = prep("prepare_gigaword.py", root, out, "--text-only", check=False)
    assert proc.returncode == 2 and f"{out}: not empty; pass --overwrite" in proc.stderr
    (root / "Giga/task1_ref0.txt").write_text("one line too few\n")  # fails after the train split was written
    proc = prep("prepare_gigaword.py", root, out, "--overwrite", "--spm-vocab-size", "80", check=False)
    assert proc.returncode == 2 and "task1_ref0.txt has 1 lines" in proc.stderr
    assert tree(out) == before, "a failed re-run leaves the previous output exactly as it was"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"], "no partial folder is left"
    shutil.copy(GIGA_HARVARD / "Giga/task1_ref0.txt", root / "Giga/task1_ref0.txt")
    prep("prepare_gigaword.py", root, out, "--overwrite", "--text-only", "--train-subset", "10")
    assert len(lines(out / "train.src")) == 10 and not (out / "data-bin").exists(), "replaced, not merged"
    assert summary(out)["splits"]["train"]["written"] == 10


def test_byte_order_marks_are_removed_and_counted(tmp_path):
    root = copy_giga(tmp_path)
    for name in ("train/train.article.txt", "Giga/task1_ref0.txt"):
        (root / name).write_bytes(b"\xef\xbb\xbf" + (root / name).read_bytes())
    out, plain = tmp_path / "out", tmp_path / "plain"
    prep("prepare_gigaword.py", root, out, "--text-only")
    prep("prepare_gigaword.py", GIGA_HARVARD, plain, "--text-only")
    for name in ("train.src", "train.tgt", "test.src", "test.tgt", "test.ref"):
        assert (out / name).read_bytes() == (plain / name).read_bytes(), name
    splits = summary(out)["splits"]
    assert splits["train"]["edited"]["UTF-8 byte-order mark removed (train.article.txt)"] == 1
    assert splits["test"]["edited"]["UTF-8 byte-order mark removed (task1_ref0.txt)"] == 1
    assert "byte-order" not in json.dumps(splits["valid"])


def test_a_sentencepiece_vocabulary_too_small_names_the_minimum(tmp_path):
    proc = prep("prepare_gigaword.py", GIGA_HARVARD, tmp_path / "out", "--spm-vocab-size", "5", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert re.search(r"--spm-vocab-size 5 is too small for this training text: sentencepiece needs at least "
                     r"\d+ pieces", proc.stderr), proc.stderr
    minimum = int(re.search(r"at least (\d+) pieces", proc.stderr).group(1))
    prep("prepare_gigaword.py", GIGA_HARVARD, tmp_path / "ok", "--spm-vocab-size", str(minimum))
    proc = prep("prepare_gigaword.py", GIGA_HARVARD, tmp_path / "zero", "--spm-vocab-size", "0", check=False)
    assert proc.returncode == 2 and "--spm-vocab-size: expected a positive number, got 0" in proc.stderr


def test_a_sentencepiece_vocabulary_the_text_cannot_fill_is_reported(tmp_path):
    import sentencepiece as spm

    proc = prep("prepare_gigaword.py", GIGA_HARVARD, tmp_path / "out")  # --spm-vocab-size 32000 by default
    pieces = spm.SentencePieceProcessor(model_file=str(tmp_path / "out/spm.model")).get_piece_size()
    assert pieces < 32000 and summary(tmp_path / "out")["spm_pieces"] == pieces
    assert (f"warning: sentencepiece reached {pieces} pieces, not the 32000 of --spm-vocab-size (the training text "
            "holds no more)") in proc.stderr


def test_gigaword_test_references_are_kept_as_read(tmp_path):
    root = copy_giga(tmp_path)
    refs = lines(root / "Giga/task1_ref0.txt")
    refs[1] = "  police  arrest\t## suspects "
    (root / "Giga/task1_ref0.txt").write_text("\n".join(refs) + "\n")
    prep("prepare_gigaword.py", root, tmp_path / "out", "--text-only")
    assert lines(tmp_path / "out/test.ref")[1] == "  police  arrest\t## suspects "
    assert lines(tmp_path / "out/test.tgt")[1] == "police arrest ## suspects"


@pytest.mark.parametrize("bad_line, reason, message", [
    (b"   \n", "empty line", "train.title.txt:3: empty line"),
    (b"caf\xe9 news\n", "not UTF-8", "train.title.txt:3: not UTF-8 (byte 0xe9 at column 4)"),
])
def test_gigaword_bad_lines_stop_or_are_skipped_and_counted(tmp_path, bad_line, reason, message):
    root = copy_giga(tmp_path)
    titles = (root / "train/train.title.txt").read_bytes().splitlines(keepends=True)
    titles[2] = bad_line
    (root / "train/train.title.txt").write_bytes(b"".join(titles))
    proc = prep("prepare_gigaword.py", root, tmp_path / "out", "--text-only", check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    prep("prepare_gigaword.py", root, tmp_path / "out", "--text-only", "--skip-invalid")
    train = summary(tmp_path / "out")["splits"]["train"]
    assert (train["read"], train["written"], train["skipped"]) == (40, 39, {reason: 1})
    kept = [a for i, a in enumerate(lines(GIGA_HARVARD / "train/train.article.txt")) if i != 2]
    assert lines(tmp_path / "out/train.src") == [a.replace("<unk>", "UNK") for a in kept], "pairs stay aligned"


def generate_and_score(data_bin: Path, checkpoint: Path, out: Path, score_script: str, *score_args) -> dict:
    """The README's path after training: masked decoding with sentencepiece decoding, then scoring."""
    gen = run_cli("fairseq-generate", data_bin, "--user-dir", ROOT / "user_dir", "--task", "sparse_seq2seq",
                  "--path", checkpoint, "--cpu", "--beam", "3", "--decoding-topk", "5", "--gen-subset", "test",
                  "--max-len-b", "20", "--post-process", "sentencepiece").stdout
    (out / "gen.txt").write_text(gen, encoding="utf-8")
    assert "\u2581" not in "".join(line for line in gen.splitlines() if line.startswith("H-"))
    return json.loads(run_script(f"scripts/{score_script}", out / "gen.txt", *score_args, "--json", "-").stdout)


def test_fairseq_train_generate_score_on_prepared_gigaword(giga, tmp_path):
    records = train_briefly(giga["harvard"] / "data-bin", tmp_path)
    assert len(records) == 6 and all(r["loss"] == r["loss"] for r in records)
    scores = generate_and_score(giga["harvard"] / "data-bin", tmp_path / "checkpoint_last.pt", tmp_path,
                                "score_summaries.py", "--refs", giga["harvard"] / "test.ref",
                                "--lowercase", "--map-unk")
    assert scores["counts"]["examples"] == 5


# --- SQuAD question generation ------------------------------------------------------------------

def test_squad_examples_by_hand(tmp_path):
    prep("prepare_squad_qg.py", tmp_path, *SQUAD, "--text-only")
    src, tgt = lines(tmp_path / "train.src"), lines(tmp_path / "train.tgt")
    assert len(src) == 6 and len(lines(tmp_path / "valid.src")) == 2 and len(lines(tmp_path / "test.src")) == 2
    assert src[2] == ("the university is the major seat of the congregation of holy cross . it was founded in "
                      "1842 by edward sorin , who was also its first president . [SEP] 1842")
    assert tgt[2] == "when was the university founded ?"
    assert src[0].startswith("architecturally , the school has a catholic character . atop the main building 's")
    assert lines(tmp_path / "test.ref") == lines(tmp_path / "test.tgt")


def test_squad_window_around_the_answer_and_prophetnet_order(tmp_path):
    prep("prepare_squad_qg.py", tmp_path, *SQUAD, "--text-only", "--max-source-tokens", "16",
         "--order", "answer-passage", "--separator", "<sep>", "--no-lowercase")
    src = lines(tmp_path / "train.src")
    # nd-3: 16 - 1 (answer) - 1 (separator) = 14 passage words; "1842" is word 17 of 29, so the window
    # starts at 17 - (14 - 1) // 2 = 11.
    assert src[2] == "1842 <sep> Cross . It was founded in 1842 by Edward Sorin , who was also"
    # no-2: a 5-word answer leaves 10; centring would start at 32 - 2 = 30, past the last possible
    # start 38 - 10 = 28, so the window ends with the passage.
    assert src[5] == "Denmark , Iceland and Norway <sep> raiders and pirates from Denmark , Iceland and Norway ."
    assert all(len(s.split()) <= 16 for s in src)
    cut = summary(tmp_path)["splits"]["train"]["edited"]
    assert cut == {"passage cut to a 16-token window around the answer": 6}
    proc = prep("prepare_squad_qg.py", tmp_path / "short", *SQUAD, "--text-only", "--max-source-tokens", "10",
                check=False)
    assert proc.returncode == 2
    assert "qa nd-1: answer too long for --max-source-tokens (10; the answer has 7 tokens)" in proc.stderr


def test_squad_with_a_one_article_dev_file_is_refused_for_its_empty_test_split(tmp_path):
    dev = json.loads((FIXTURES / "squad_dev.json").read_text())
    dev["data"] = dev["data"][:1]
    (tmp_path / "dev.json").write_text(json.dumps(dev))
    args = ("prepare_squad_qg.py", tmp_path / "out", "--train-json", FIXTURES / "squad_train.json",
            "--dev-json", tmp_path / "dev.json")
    proc = prep(*args, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    empty = (f"the test split is empty (test: 0 in, 0 out; from the last 0 of the 1 articles of {tmp_path / 'dev.json'}"
             " (--split squad:")
    assert f"error: {empty}" in proc.stderr and "fairseq cannot binarise an empty split" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()
    proc = prep(*args, "--text-only")  # binarises nothing, so an empty split is only worth a warning
    assert f"warning: {empty}" in proc.stderr
    assert lines(tmp_path / "out/test.src") == [] and len(lines(tmp_path / "out/valid.src")) == 2


def test_summary_paths_are_relative_to_out(tmp_path):
    """prep_summary.json says its paths are relative to OUT: the inputs given relative to another working folder."""
    (tmp_path / "in").mkdir()
    for name in ("squad_train.json", "squad_dev.json"):
        shutil.copy(FIXTURES / name, tmp_path / "in" / name)
    subprocess.run([sys.executable, ROOT / "data-prep" / "prepare_squad_qg.py", "a/b/out", "--train-json",
                    "in/squad_train.json", "--dev-json", "in/squad_dev.json", "--text-only"], cwd=tmp_path, check=True,
                   capture_output=True)
    out = tmp_path / "a/b/out"
    assert [(out / path).resolve() for path in summary(out)["input"]] == [
        tmp_path / "in/squad_train.json", tmp_path / "in/squad_dev.json"]


def test_squad_sentence_unit_without_the_answer(tmp_path):
    """Du et al.'s setting: the sentence that holds the answer, alone, and the question."""
    prep("prepare_squad_qg.py", tmp_path / "out", *SQUAD, "--unit", "sentence", "--no-answer", "--text-only")
    src, tgt = lines(tmp_path / "out/train.src"), lines(tmp_path / "out/train.tgt")
    assert src[2] == "it was founded in 1842 by edward sorin , who was also its first president ."
    assert tgt[2] == "when was the university founded ?"
    assert src[0] == "atop the main building 's gold dome is a golden statue of the virgin mary ."
    proc = prep("prepare_squad_qg.py", tmp_path / "du", "--du2017-dir", tmp_path, "--unit", "sentence", check=False)
    assert proc.returncode == 2 and "--unit/--no-answer: Du et al.'s files are sentences already" in proc.stderr


def test_squad_doclist_split(tmp_path):
    doclists = tmp_path / "doclists"
    doclists.mkdir()
    for name, titles in (("train", ["University_of_Notre_Dame", "Amazon_rainforest"]), ("dev", ["Normans"]),
                         ("test", ["Warsaw"])):
        (doclists / f"doclist-{name}.txt").write_text("\n".join(titles) + "\n")
    prep("prepare_squad_qg.py", tmp_path / "out", *SQUAD, "--split", "doclist", "--doclist-dir", doclists,
         "--text-only")
    assert [len(lines(tmp_path / "out" / f"{s}.tgt")) for s in ("train", "valid", "test")] == [6, 2, 2]
    assert lines(tmp_path / "out/valid.tgt")[0] == "in what country is normandy located ?"
    (doclists / "doclist-test.txt").write_text("Warsaw\nAtlantis\n")
    proc = prep("prepare_squad_qg.py", tmp_path / "out", *SQUAD, "--split", "doclist", "--doclist-dir", doclists,
                "--text-only", "--overwrite", check=False)
    assert proc.returncode == 2 and "doclist-test.txt:2: article 'Atlantis' is in neither JSON file" in proc.stderr


def squad_copy(tmp_path: Path, edit) -> Path:
    data = json.loads((FIXTURES / "squad_train.json").read_text())
    edit(data)
    path = tmp_path / "train.json"
    path.write_text(json.dumps(data))
    return path


def test_squad_bad_answer_start_stops_or_is_skipped(tmp_path):
    def shift(data):
        data["data"][0]["paragraphs"][1]["qas"][1]["answers"][0]["answer_start"] += 3

    train = squad_copy(tmp_path, shift)
    args = ("prepare_squad_qg.py", tmp_path / "out", "--train-json", train, "--dev-json", FIXTURES / "squad_dev.json",
            "--text-only")
    proc = prep(*args, check=False)
    assert proc.returncode == 2
    assert "data[0].paragraphs[1]: qa nd-4: answer_start does not match the context" in proc.stderr
    assert "'Edward Sorin'" in proc.stderr
    prep(*args, "--skip-invalid")
    counts = summary(tmp_path / "out")["splits"]["train"]
    assert (counts["read"], counts["written"]) == (6, 5)
    assert counts["skipped"] == {"answer_start does not match the context": 1}


@pytest.mark.parametrize("content, message", [
    (b'{"data": [', r"train.json:1:\d+: malformed JSON"),
    (b'{"data": [{"title": "x", "paragraphs": [{"context": "caf\xe9"}]}]}', r"train.json:1: not UTF-8"),
    (b'{"version": "1.1"}', r"expected the SQuAD layout"),
    (b'{"data": [{"title": "x", "paragraphs": [{"qas": []}]}]}',
     r"data\[0\].paragraphs\[0\]: missing or malformed 'context'"),
])
def test_squad_malformed_files(tmp_path, content, message):
    import re

    (tmp_path / "train.json").write_bytes(content)
    proc = prep("prepare_squad_qg.py", tmp_path / "out", "--train-json", tmp_path / "train.json", "--dev-json",
                FIXTURES / "squad_dev.json", "--text-only", check=False)
    assert proc.returncode == 2 and re.search(message, proc.stderr), proc.stderr


def test_squad_missing_file(tmp_path):
    proc = prep("prepare_squad_qg.py", tmp_path / "out", "--train-json", tmp_path / "none.json", "--dev-json",
                FIXTURES / "squad_dev.json", check=False)
    assert proc.returncode == 2 and "none.json: no such file (SQuAD train JSON)" in proc.stderr


def test_fairseq_train_generate_score_on_prepared_squad(tmp_path):
    prep("prepare_squad_qg.py", tmp_path / "out", *SQUAD, "--spm-vocab-size", "150")
    assert summary(tmp_path / "out")["binarised_sentences"] == {"train": 6, "valid": 2, "test": 2}
    pieces = lines(tmp_path / "out/train.spm.src")
    assert all(line.split().count("[SEP]") == 1 for line in pieces), "the separator is one piece"
    records = train_briefly(tmp_path / "out/data-bin", tmp_path / "ckpt")
    assert len(records) == 6
    scores = generate_and_score(tmp_path / "out/data-bin", tmp_path / "ckpt/checkpoint_last.pt", tmp_path,
                                "score_questions.py", "--refs", tmp_path / "out/test.ref",
                                "--group-by-source", tmp_path / "out/test.src")
    assert (scores["counts"]["examples"], scores["counts"]["scored_items"]) == (2, 2)


# --- Du et al. 2017 sentence-level files --------------------------------------------------------

def test_du2017_files_without_train_binarise_with_a_given_model(tmp_path, giga):
    du = tmp_path / "du"
    du.mkdir()
    for split in ("dev", "test"):
        (du / f"src-{split}.txt").write_text("a b c .\nd e f .\n")
        (du / f"tgt-{split}.txt").write_text("what is a ?\nwhat is d ?\n")
    proc = prep("prepare_squad_qg.py", tmp_path / "out", "--du2017-dir", du, check=False)
    assert proc.returncode == 2 and "no training split to train sentencepiece on: pass --spm-model" in proc.stderr
    prep("prepare_squad_qg.py", tmp_path / "out", "--du2017-dir", du, "--spm-model", giga["harvard"] / "spm.model",
         "--dict", giga["harvard"] / "dict.txt")
    assert lines(tmp_path / "out/valid.src") == ["a b c .", "d e f ."]
    assert summary(tmp_path / "out")["binarised_sentences"] == {"valid": 2, "test": 2}
    assert (tmp_path / "out/data-bin/dict.src.txt").read_text() == (giga["harvard"] / "dict.txt").read_text()


def test_du2017_real_counts(tmp_path):
    if not DU2017.is_dir():
        pytest.skip(f"real data: {DU2017} is not present on this machine")
    prep("prepare_squad_qg.py", tmp_path, "--du2017-dir", DU2017, "--text-only")
    splits = summary(tmp_path)["splits"]
    assert {s: (c["read"], c["written"]) for s, c in splits.items()} == {
        "valid": (10570, 10570), "test": (11877, 11877)}
    assert len(set(lines(tmp_path / "test.src"))) == 6652
    assert lines(tmp_path / "test.ref") == lines(DU2017 / "tgt-test.txt")
