"""experiments/qg_scratch/qg_scratch.py end to end on a few hundred Du-format lines: one seed, its tiny scale (200
updates), two losses (the AS warm-up among them), every decoding. Checks the split by source sentence, that every
test example gets the question decoded for its sentence, and that the table's scores are the BLEU of those
predictions against Du's references, per example and grouped by sentence."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import qg_scratch  # experiments/qg_scratch (pyproject.toml's pytest pythonpath)
import generation_runs
from conftest import ROOT, run_script
from measure import command_line, machine
from sparse_softmax.scoring import bleu

METHODS = ["cross_entropy", "as_softmax"]
DECODINGS = ["beam 1", "beam 5", "beam 5, top-5 mask", "beam 5, source mask"]


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def assert_scores_are_bleu(scores: dict, hyps: list[str], references: list[str], sources: list[str]) -> None:
    """``scores`` (a run's record of one decoding) hold the coco BLEU of ``hyps``: per example against its own
    reference, and grouped by source line (the last prediction of each source against all of its references)."""
    per_example = bleu.corpus_bleu(bleu.collect_stats(hyps, [[ref] for ref in references]))
    groups: dict[str, list[int]] = {}
    for i, source in enumerate(sources):
        groups.setdefault(source, []).append(i)
    grouped = bleu.corpus_bleu(bleu.collect_stats([hyps[ids[-1]] for ids in groups.values()],
                                                  [[references[i] for i in ids] for ids in groups.values()]))
    for n in range(4):
        assert scores["per example"][f"BLEU-{n + 1}"] == pytest.approx(100 * per_example[n])
        assert scores["grouped"][f"BLEU-{n + 1}"] == pytest.approx(100 * grouped[n])


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> tuple[Path, Path]:
    """Du-format dev/test files made from the toy corpus (test sentences repeated with other questions, as
    Du's test has them), and the experiment's output folder."""
    root = tmp_path_factory.mktemp("qg")
    subprocess.run([sys.executable, ROOT / "data-prep" / "make_toy_data.py", root / "raw", "--train", "300",
                    "--valid", "10", "--test", "40"], check=True, capture_output=True)
    du = root / "du"
    du.mkdir()
    dev_src, dev_tgt = lines(root / "raw/train.src"), lines(root / "raw/train.tgt")
    test_src, test_tgt = lines(root / "raw/test.src"), lines(root / "raw/test.tgt")
    test_src += test_src[:15]  # 15 sentences with a second question (another sentence's)
    test_tgt += test_tgt[15:30]
    for name, src, tgt in (("dev", dev_src, dev_tgt), ("test", test_src, test_tgt)):
        (du / f"src-{name}.txt").write_text("\n".join(src) + "\n", encoding="utf-8")
        (du / f"tgt-{name}.txt").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    out = root / "out"
    run_script("experiments/qg_scratch/qg_scratch.py", *experiment_args(du, out, METHODS))
    return du, out


def experiment_args(du: Path, out: Path, methods: list[str]) -> list:
    return ["--du2017-dir", du, "--out", out, "--seeds", "1", "--methods", *methods, "--scale", "tiny",
            "--spm-vocab-size", "100"]


def test_train_and_valid_share_no_sentence_and_lose_no_pair(experiment):
    du, out = experiment
    split = out / "work" / "split"
    train, valid = lines(split / "src-train.txt"), lines(split / "src-dev.txt")
    assert not set(train) & set(valid)
    assert sorted(zip(train + valid, lines(split / "tgt-train.txt") + lines(split / "tgt-dev.txt"))) == \
        sorted(zip(lines(du / "src-dev.txt"), lines(du / "tgt-dev.txt")))
    assert 0.05 < len(set(valid)) / len(set(train + valid)) < 0.15
    assert sorted(lines(split / "src-test.txt")) == sorted(set(lines(du / "src-test.txt")))


def test_scores_are_those_of_the_decoded_questions(experiment):
    du, out = experiment
    sources, references = lines(du / "src-test.txt"), lines(du / "tgt-test.txt")
    runs = json.loads((out / "runs.json").read_text())
    assert sorted(r["method"] for r in runs) == sorted(METHODS)
    for r in runs:
        assert list(r["scores"]) == DECODINGS
        folder = out / "work" / f"{r['method']}-seed1"
        for decoding in DECODINGS:
            hyps = lines(folder / r["scores"][decoding]["predictions"])
            assert len(hyps) == len(sources)
            question = {}
            for source, hyp in zip(sources, hyps):
                assert question.setdefault(source, hyp) == hyp  # one question per sentence
            assert_scores_are_bleu(r["scores"][decoding], hyps, references, sources)
        assert r["scores"]["beam 5"]["grouped"]["BLEU-1"] > 5  # the model learnt something: not zeros compared


def test_table_and_plot(experiment):
    _, out = experiment
    table = (out / "results.md").read_text()
    assert table.startswith("`python experiments/qg_scratch/qg_scratch.py --du2017-dir")
    for method in METHODS:
        for decoding in DECODINGS:
            assert table.count(f"| {method} | {decoding} | ") == 2  # grouped and per example
    assert (out / "curves.png").stat().st_size > 10_000


def test_du_files_missing_or_misaligned_is_one_line_error(tmp_path):
    (tmp_path / "src-dev.txt").write_text("a b\n")
    proc = run_script("experiments/qg_scratch/qg_scratch.py", "--du2017-dir", tmp_path, "--out", tmp_path / "out", check=False)
    assert proc.returncode == 2 and "no tgt-dev.txt (expected Du et al.'s" in proc.stderr.splitlines()[-1]
    for name, text in (("tgt-dev.txt", "q\n"), ("src-test.txt", "a b\nc d\n"), ("tgt-test.txt", "q\n")):
        (tmp_path / name).write_text(text)
    proc = run_script("experiments/qg_scratch/qg_scratch.py", "--du2017-dir", tmp_path, "--out", tmp_path / "out", check=False)
    assert proc.returncode == 2 and "src-test.txt has 2 lines, tgt-test.txt 1" in proc.stderr.splitlines()[-1]
    assert "Traceback" not in proc.stderr


def test_source_mask_allows_the_most_frequent_question_pieces(tmp_path):
    (tmp_path / "data-bin").mkdir()
    for name, text in (("train.spm.tgt", "▁what ▁is ▁x ▁?\n▁what ▁?\n▁who ▁?\n"),
                       ("valid.spm.src", "▁x ▁is ▁big\n▁y\n"), ("valid.spm.tgt", "▁what ▁is ▁x ▁?\n▁who ▁y ▁?\n")):
        (tmp_path / name).write_text(text, encoding="utf-8")
    data = tmp_path / "data-bin"
    assert qg_scratch.question_pieces(data, 2) == ["▁?", "▁what"]
    assert qg_scratch.mask_coverage(data, set()) == (3 / 7, 0)
    assert qg_scratch.mask_coverage(data, {"▁?", "▁what"}) == (6 / 7, 1 / 2)


def test_negative_question_pieces_is_one_line_error(tmp_path):
    proc = run_script("experiments/qg_scratch/qg_scratch.py", "--question-pieces", "-1", "--out", tmp_path, check=False)
    assert proc.returncode == 2 and "--question-pieces: expected a count >= 0, got -1" in proc.stderr.splitlines()[-1]


def test_training_seconds_add_up_the_parts_of_a_resumed_run():
    """From the time stamps: each fairseq-train of the log from its config line to its last line, without the time
    between a stopped part and its resumption, nor lines without a stamp."""
    log = ("2026-01-01 10:00:00 | INFO | fairseq_cli.train | {'_name': None}\n"
           '2026-01-01 10:01:40 | INFO | train_inner | {"wall": "100"}\n'
           "Traceback (most recent call last): the machine stopped\n"
           "2026-01-01 12:00:00 | INFO | fairseq_cli.train | {'_name': None}\n"
           '2026-01-01 12:00:30 | INFO | train_inner | {"wall": "0"}\n'
           "2026-01-01 12:01:00 | INFO | fairseq_cli.train | done training in 59.8 seconds\n")
    assert generation_runs.training_seconds(log) == 100 + 60
    assert generation_runs.training_seconds(log.split("Traceback")[0]) == 100 and generation_runs.training_seconds("") == 0


def test_a_resumed_run_counts_what_it_trained_again_once():
    """The second part goes on from the checkpoint the first saved at 10:01:00 (update 20): the first part's 40 s
    after that save were trained again, so the first part counts up to the save."""
    def saved(at: str, update: int) -> str:
        return (f"2026-01-01 {at} | INFO | fairseq.checkpoint_utils | Saved checkpoint c/checkpoint_1_{update}.pt "
                f"(epoch 1 @ {update} updates, score 4.0) (writing took 1.0 seconds)\n")

    log = ("2026-01-01 10:00:00 | INFO | fairseq_cli.train | {'_name': None}\n" + saved("10:00:50", 10)
           + saved("10:01:00", 20) + '2026-01-01 10:01:40 | INFO | train_inner | {"wall": "100"}\n'
           "2026-01-01 12:00:00 | INFO | fairseq_cli.train | {'_name': None}\n"
           "2026-01-01 12:00:10 | INFO | fairseq.trainer | Loaded checkpoint c/checkpoint_last.pt "
           "(epoch 1 @ 20 updates)\n"
           "2026-01-01 12:01:00 | INFO | fairseq_cli.train | done training in 59.8 seconds\n")
    assert generation_runs.training_seconds(log) == 60 + 60
    # resumed from a checkpoint the first part did not save: nothing tells what was trained again, so all counts
    assert generation_runs.training_seconds(log.replace("@ 20 updates)", "@ 30 updates)")) == 100 + 60


def test_a_results_file_names_its_command_as_typed_in_the_repository():
    """The script and the arguments that are paths inside the repository relative to it, the others as given, all
    quoted for the shell: the command runs from the root on any machine."""
    argv = ["--out", str(ROOT / "experiments" / "qg_scratch" / "k 2"), "--du2017-dir", "/elsewhere/du", "--seeds", "1"]
    assert command_line(ROOT / "experiments" / "qg_scratch" / "qg_scratch.py", argv) == (
        "python experiments/qg_scratch/qg_scratch.py --out 'experiments/qg_scratch/k 2' --du2017-dir /elsewhere/du "
        "--seeds 1")


@pytest.mark.skipif(not Path("/proc/sys/kernel/random/boot_id").exists(), reason="reads Linux's boot id and cpuinfo")
def test_a_record_names_the_machine_and_its_processor():
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    cpuinfo = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines())
    names = [value.strip() for key, value in cpuinfo.items() if key.strip() in ("model name", "cpu family")]
    assert machine().startswith(f"{boot_id} (") and all(name in machine() for name in names), machine()
    assert machine().endswith(f", {len(os.sched_getaffinity(0))} cores)")


def test_a_stopped_run_goes_on_from_its_last_checkpoint_to_the_same_result(experiment, tmp_path):
    """The cross_entropy run killed after its first checkpoint, then the same command again: it resumes there (fairseq
    says so in the log) and ends where the uninterrupted run ended, the same valid curve and test scores."""
    du, out = experiment
    copy = tmp_path / "out"
    for prepared in ("split", "data"):
        shutil.copytree(out / "work" / prepared, copy / "work" / prepared)
    args = experiment_args(du, copy, ["cross_entropy"])
    proc = subprocess.Popen([sys.executable, ROOT / "experiments" / "qg_scratch" / "qg_scratch.py", *map(str, args)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    folder = copy / "work" / "cross_entropy-seed1"
    while not list((folder / "checkpoints").glob("checkpoint_*_*.pt")):
        assert proc.poll() is None, "the run ended before its first checkpoint"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert "done training" not in (folder / "train.log").read_text() and not (folder / "result.json").exists()

    run_script("experiments/qg_scratch/qg_scratch.py", *args)
    log = (folder / "train.log").read_text()
    assert log.count("done training") == 1
    resumed_at = [line for line in log.splitlines() if "Loaded checkpoint" in line]
    assert len(resumed_at) == 1 and "@ 0 updates" not in resumed_at[0]
    [resumed] = json.loads((copy / "runs.json").read_text())
    whole = next(r for r in json.loads((out / "runs.json").read_text()) if r["method"] == "cross_entropy")
    assert resumed["scores"] == whole["scores"]
    assert resumed["final_valid_nll"] == whole["final_valid_nll"]
    assert not list((folder / "checkpoints").iterdir())  # the weights deleted once scored


def test_resume_point_is_the_newest_checkpoint_that_loads(tmp_path):
    older, newer = tmp_path / "checkpoint_1_20.pt", tmp_path / "checkpoint_last.pt"
    for path in (older, newer):
        torch.save({"model": torch.ones(3)}, path)
        time.sleep(0.02)  # distinct modification times
    assert generation_runs.resume_point(tmp_path) == newer
    newer.write_bytes(newer.read_bytes()[:100])  # a copy stopped half-way
    assert generation_runs.resume_point(tmp_path) == older and not newer.exists()
    older.write_bytes(b"")
    assert generation_runs.resume_point(tmp_path) is None and not older.exists()


def test_a_checkpoint_cut_short_anywhere_is_passed_over(tmp_path):
    """However far a copy got, the checkpoint it left is deleted and the whole one before it resumed: torch's
    zip reader fails on a cut file with RuntimeError, EOFError or, at some lengths, OSError (EINVAL), which once
    ended a resumed run in the test suite."""
    whole, cut = tmp_path / "checkpoint_1_20.pt", tmp_path / "checkpoint_last.pt"
    torch.save({"model": {f"w{i}": torch.randn(100, 100) for i in range(4)}}, whole)
    data = whole.read_bytes()
    for length in range(0, len(data), 997):
        cut.write_bytes(data[:length])
        assert generation_runs.resume_point(tmp_path) == whole and not cut.exists(), f"cut at {length} of {len(data)} bytes"


def test_a_record_made_with_other_method_flags_is_found_out(experiment):
    """A run's logged criterion config against its method's flags: a method changed since is run again."""
    _, out = experiment
    log = (out / "work" / "as_softmax-seed1" / "train.log").read_text()
    flags = qg_scratch.METHODS["as_softmax"]
    assert generation_runs.contradicted(log, flags) == []
    changed = [*flags[:-1], "0.25"]
    assert generation_runs.contradicted(log, changed) == [f"{flags[-2]} 0.25"]
    assert generation_runs.contradicted(log, ["--criterion", "sparse_softmax", *flags[2:]]) == ["--criterion sparse_softmax"]


def test_a_run_made_again_for_changed_flags_starts_a_new_log(tmp_path):
    """record() with a stand-in training that logs its criterion config and one valid and train record: a
    record whose log lacks a flag is run again, its log is the new run's alone, and the next call reads it."""
    folder = tmp_path / "as_softmax-seed1"
    references, sources = tmp_path / "ref.txt", tmp_path / "src.txt"
    references.write_text("what is it ?\n")
    sources.write_text("it is a cat .\n")
    runs = []

    def train_with(warmup):
        def train(into: Path) -> None:
            runs.append(warmup)
            (into / "checkpoints").mkdir(exist_ok=True)
            (into / "checkpoints" / "checkpoint_last.pt").write_text("weights")
            with (into / "train.log").open("a") as log:  # fairseq-train appends, as a resumed run needs
                log.write(f"2026-01-01 10:00:00 | INFO | fairseq_cli.train | {{'criterion': {{'_name': "
                          f"'as_softmax', 'as_delta': 0.3, 'as_warmup_ratio': {warmup}}}}}\n"
                          f'| valid | {{"valid_loss": "5.0", "valid_nll_loss": "{4 + warmup}", '
                          f'"valid_num_updates": "10"}}\n'
                          f'2026-01-01 10:00:{10 * warmup:02.0f} | INFO | train | {{"loss": "5.0"}}\n'
                          '| done training\n')
        return train

    def decode(checkpoint: Path, decoding: str, into: Path) -> Path:
        (into / "pred.txt").write_text("what is it ?\n")
        return into / "pred.txt"

    flags = ["--criterion", "as_softmax", "--as-delta", "0.3", "--as-warmup-ratio", "0.1"]
    args = (decode, ["beam 1"], generation_runs.question_scoring(references, sources))
    generation_runs.record(folder, "as_softmax", flags[:4] + ["--as-warmup-ratio", "0.3"], 1, train_with(0.3), *args)
    again = generation_runs.record(folder, "as_softmax", flags, 1, train_with(0.1), *args)
    log = (folder / "train.log").read_text()
    assert runs == [0.3, 0.1] and log.count("fairseq_cli.train") == 1 and generation_runs.contradicted(log, flags) == []
    assert again["valid"] == [{"update": 10, "nll": 4.1}] and again["wall"] == 1 and again["machine"] == machine()
    generation_runs.record(folder, "as_softmax", flags, 1, train_with(0.1), *args)
    assert runs == [0.3, 0.1], "a record made with the method's flags is read, not run again"
