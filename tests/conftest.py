"""Shared fixtures: a tiny toy corpus binarised once per session, and a runner for the real CLIs."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from filelock import FileLock

if not torch.cuda.is_available():
    # The Triton kernels run in Triton's interpreter on the CPU (impl="triton"). Triton reads this when a kernel is
    # decorated, i.e. when sparse_softmax.losses is first imported: before any test module imports it.
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the fairseq-* console scripts of the interpreter running the tests
N_TEST = 30  # not a multiple of 8: fairseq's default --required-batch-size-multiple would drop lines
SHARED_DATA = ROOT.parent / "shared" / "data"  # real data, present on the project's machines only


#: The devices of the device-parameterised tests (the ``device`` fixture): the CPU always, CUDA where
#: there is one, so the same assertions check both.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                reason="no CUDA device"))]


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true",
                     help="also run the tests marked slow (they build environments and need the package index)")
    parser.addoption("--fast", action="store_true",
                     help="the fast tier: a test skips where it would run a fairseq tool, a benchmark or a README "
                     "block (the loss math, decoding math, scorers and data prep run)")


_FAST = False  # --fast, set once the options are parsed


def pytest_configure(config):
    global _FAST
    _FAST = config.getoption("--fast")
    config.addinivalue_line("markers", "slow: minutes long and needs the package index; run with --run-slow")


def skip_in_fast_tier(what: str) -> None:
    """Where a test starts fairseq training, decoding or an experiment: not in the fast tier."""
    if _FAST:
        pytest.skip(f"fast tier (--fast): runs {what}")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow (minutes, needs the package index): "
                                   "bash scripts/run_tests.sh --run-slow -k <test name> runs it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


def run_cli(*args: str, cwd: Path = ROOT, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    if args[0] != "fairseq-preprocess":  # data prep belongs to the fast tier
        skip_in_fast_tier(args[0])
    cmd = [str(BIN / args[0]), *map(str, args[1:])]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # the plugin must load checkpoints by itself
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def run_script(script: str, *args, check: bool = True) -> subprocess.CompletedProcess:
    """``python <script> args...`` for a script of this repository (path relative to the root)."""
    if script.startswith(("benchmarks/", "experiments/", "tools/")):
        skip_in_fast_tier(script)
    proc = subprocess.run([sys.executable, str(ROOT / script), *map(str, args)], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-5000:]}")
    return proc


def train_two_ranks(*args) -> list[str]:
    """``fairseq-train ARGS`` as two CPU processes (gloo, one per rank, as the README shows); returns
    each rank's output after both succeeded."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [str(BIN / "fairseq-train"), *map(str, args), "--distributed-world-size", "2",
               "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-no-spawn",
               "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp"]
    ranks = run_together([command + ["--distributed-rank", str(r)] for r in (0, 1)], timeout=300, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    outputs = [rank.stdout for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    return outputs


def run_together(commands: list[list[str]], timeout: float, **popen) -> list[subprocess.CompletedProcess]:
    """Run the commands at once (text mode; ``popen`` as for ``subprocess.Popen``), each in a session of its
    own, and wait for all. Past ``timeout`` seconds in all, or when the wait is interrupted (Ctrl-C reaches the
    terminal's process group, not these sessions), every session is killed before the exception goes on, so the
    training jobs a command started die with it instead of running on and slowing the rest of the suite, or the
    machine after it (``subprocess.run``'s timeout kills the command alone and leaves them orphaned)."""
    skip_in_fast_tier(" and ".join(Path(command[0]).name for command in commands))
    procs = [subprocess.Popen(command, text=True, start_new_session=True, **popen) for command in commands]
    deadline = time.monotonic() + timeout
    try:
        outputs = [p.communicate(timeout=max(0.0, deadline - time.monotonic())) for p in procs]
    except BaseException:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
        raise
    return [subprocess.CompletedProcess(p.args, p.returncode, out, err) for p, (out, err) in zip(procs, outputs)]


def logged(caplog, logger: str) -> list[str]:
    """The messages ``caplog`` holds from ``logger`` (a module's ``__name__``), in order."""
    return [record.getMessage() for record in caplog.records if record.name == logger]


def json_logs(output: str | subprocess.CompletedProcess, tag: str) -> list[dict]:
    """The ``--log-format json`` records of one kind ("train_inner", "valid", ...) in a CLI's output."""
    if isinstance(output, subprocess.CompletedProcess):
        output = output.stdout + output.stderr
    records = []
    for line in output.splitlines():
        start = line.find("{")
        if f"| {tag} |" in line and start >= 0:
            records.append(json.loads(line[start:]))
    return records


def output_lines(output: str, kind: str) -> dict[int, list[list[str]]]:
    """fairseq-generate / fairseq-interactive lines of one kind ("S", "H", "P", ...) by sentence id,
    in printed order (the n-best list for "H"), each split at tabs after the id."""
    lines: dict[int, list[list[str]]] = {}
    for line in output.splitlines():
        if line.startswith(f"{kind}-"):
            ident, *rest = line.split("\t")
            lines.setdefault(int(ident[len(kind) + 1:]), []).append(rest)
    return lines


def made_once(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder ``name``, filled by ``make(folder)`` once per test run: the parallel workers share it (the first to
    ask makes it under a file lock, the others wait for it and read it). Tests only read it."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's own
    folder = base / name
    with FileLock(f"{folder}.lock"):
        if not (folder / ".made").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / ".made").touch()
    return folder


def _make_toy_data(root: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "data-prep" / "make_toy_data.py"), str(root / "raw"),
         "--train", "600", "--valid", "40", "--test", str(N_TEST)],
        check=True, capture_output=True,
    )
    run_cli(
        "fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
        "--trainpref", root / "raw/train", "--validpref", root / "raw/valid", "--testpref", root / "raw/test",
        "--destdir", root / "bin", "--joined-dictionary", "--workers", "1",
    )


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory) -> Path:
    """Toy corpus (train 600 / valid 40 / test 30 lines), binarised with a joined dictionary; made once per run."""
    return made_once(tmp_path_factory, "toy", _make_toy_data) / "bin"


TRAIN_COMMON = (
    "--user-dir", ROOT / "user_dir", "--cpu", "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "1500",
    "--log-format", "json", "--log-interval", "1", "--seed", "3", "--no-epoch-checkpoints",
    "--dropout", "0.0", "--num-workers", "0",
)


@pytest.fixture(scope="session")
def checkpoint(toy_data, tmp_path_factory) -> Path:
    """A transformer_tiny trained 150 updates with --task sparse_seq2seq and sparse_softmax on the toy corpus; trained
    once per run."""
    def train(save_dir: Path) -> None:
        run_cli("fairseq-train", toy_data, *TRAIN_COMMON, "--task", "sparse_seq2seq", "--arch", "transformer_tiny",
                "--criterion", "sparse_softmax", "--sparse-topk", "5", "--max-update", "150", "--save-dir", save_dir)

    return made_once(tmp_path_factory, "sparse_seq2seq", train) / "checkpoint_last.pt"
