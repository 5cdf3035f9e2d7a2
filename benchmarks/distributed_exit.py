#!/usr/bin/env python
"""How often a rank of a finished two-process ``fairseq-train`` crashes at exit on a loaded machine.

fairseq leaves gloo's worker threads (and its batch thread) to Python's shutdown, where one that still needs the
interpreter aborts its process after a finished training (docs/training.md, "Every rank of a finished distributed
run exits 0"). Whether it does depends on how the threads are scheduled, so a test run passes almost always; this
script runs the test suite's two-rank training (toy corpus, transformer_tiny, as_softmax, 6 updates, two CPU
processes over gloo, ``PYTHONFAULTHANDLER`` set) ``--runs`` times beside ``--busy`` processes that keep the CPU
busy as the rest of a test suite does, and counts the runs in which a rank did not exit 0.

    python benchmarks/distributed_exit.py --runs 50 --busy 2     # ~20 minutes on 2 cores

OUT (default ``benchmarks/results/distributed_exit``) gets ``results.md`` (the command and the count); the output
of each rank of a failed run stays in OUT/work.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from measure import BIN, ROOT, device_name, run

TRAIN = ("--user-dir", ROOT / "user_dir", "--cpu", "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "1500",
         "--seed", "3", "--no-epoch-checkpoints", "--dropout", "0.0", "--num-workers", "0", "--arch",
         "transformer_tiny", "--criterion", "as_softmax", "--max-update", "6", "--distributed-world-size", "2",
         "--distributed-no-spawn", "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp")


def toy_corpus(folder: Path) -> Path:
    """The test suite's toy corpus (600 training pairs), binarised in ``folder``."""
    run([sys.executable, ROOT / "data-prep" / "make_toy_data.py", folder / "raw", "--train", 600, "--valid", 40,
         "--test", 30])
    run([BIN / "fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref",
         folder / "raw/train", "--validpref", folder / "raw/valid", "--destdir", folder / "bin",
         "--joined-dictionary", "--workers", 1])
    return folder / "bin"


def train_two_ranks(data: Path, folder: Path) -> list[int]:
    """Both ranks' exit statuses (negative: killed by that signal); their output in ``folder``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [BIN / "fairseq-train", data, *TRAIN, "--save-dir", folder / "checkpoints",
               "--distributed-init-method", f"tcp://127.0.0.1:{port}"]
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}  # a crash prints every thread's Python stack
    logs = [open(folder / f"rank{rank}.log", "w") for rank in (0, 1)]
    try:
        ranks = [subprocess.Popen([*map(str, command), "--distributed-rank", str(rank)], stdout=log,
                                  stderr=subprocess.STDOUT, env=env, start_new_session=True)
                 for rank, log in zip((0, 1), logs)]
        return [rank.wait(timeout=600) for rank in ranks]
    finally:
        for log in logs:
            log.close()


def spin() -> None:
    """A process's worth of CPU load."""
    while True:
        pass


def status(code: int) -> str:
    """An exit status as the shell would name it: 0, 1, SIGABRT, ..."""
    return signal.Signals(-code).name if code < 0 else str(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="two-rank trainings to run, one after the other")
    parser.add_argument("--busy", type=int, default=2, help="processes that spin on the CPU meanwhile")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/distributed_exit")
    args = parser.parse_args()
    work = args.out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    failed = {}  # run number: its ranks' exit statuses
    with tempfile.TemporaryDirectory() as tmp:
        data = toy_corpus(Path(tmp))
        spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
        for p in spinners:
            p.start()
        try:
            for number in range(1, args.runs + 1):
                folder = work / f"run{number}"
                folder.mkdir()
                codes = train_two_ranks(data, folder)
                statuses = " ".join(map(status, codes))
                print(f"run {number}/{args.runs}: ranks exit {statuses}", flush=True)
                if codes == [0, 0]:
                    shutil.rmtree(folder)
                else:
                    shutil.rmtree(folder / "checkpoints", ignore_errors=True)  # the ranks' output stays
                    failed[number] = statuses
        finally:
            for p in spinners:
                p.terminate()
    summary = f"{len(failed)} of {args.runs} runs had a rank that did not exit 0" + "".join(
        f"\n- run {number}: {statuses} (output in work/run{number})" for number, statuses in failed.items())
    command = f"python benchmarks/distributed_exit.py --runs {args.runs} --busy {args.busy}"
    machine = f"{device_name('cpu')}, {os.cpu_count()} cores; torch {torch.__version__}, Python {sys.version.split()[0]}"
    (args.out / "results.md").write_text(f"# Two-rank fairseq-train, exit statuses\n\n    {command}\n\n"
                                         f"{machine}\n\n{summary}\n")
    print(summary)


if __name__ == "__main__":
    main()
