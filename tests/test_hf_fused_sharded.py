"""``FusedTrainerLoss`` under the sharding engines, each on two CPU processes (gloo) against one process
(``tests/fused_sharded.py`` runs them under torchrun): FSDP2 by hand with the output layer in the root unit, a unit of
its own (resharded after its forward, or kept) and tied to the embeddings, for every fused loss; three updates
through ``Trainer`` with DDP, with transformers' own FSDP2 plan and with DeepSpeed ZeRO-3; and 120 updates of each
fused loss against the unfused loss, on one process and sharded, as a convergence check."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from conftest import ROOT, skip_in_fast_tier  # noqa: E402

LOSSES = ("softmax", "sparse_softmax", "as_softmax")


def _run(tmp_path, *args, processes: int = 2, python=sys.executable) -> None:
    """``tests/fused_sharded.py ARGS`` on ``processes`` processes (torchrun) or one (plain Python)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    script = ROOT / "tests" / "fused_sharded.py"
    command = [python, script, *map(str, args)]
    if processes > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        command = [python, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                   "--master_port", str(port), script, *map(str, args)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_fully_shard_wherever_the_output_layer_is_equals_one_process(tmp_path):
    """The loss and every parameter's gradient of two FSDP2 ranks (each scoring half the batch) are the unfused loss's
    on the whole batch in one process, and torch warns of nothing (a view returned by a unit, a mixed DTensor); an
    output layer split by tensor parallelism is refused in one line."""
    skip_in_fast_tier("torchrun")
    _run(tmp_path, "fully_shard", tmp_path)
    report = json.loads((tmp_path / "fully_shard.json").read_text())
    assert report.pop("tensor-parallel") == (
        "the output layer's weight is a DTensor inside its forward (sharded by tensor parallelism, not FSDP): the "
        "fused output layer needs the whole weight; use TrainerLoss")
    assert sorted(report) == sorted(f"{p}/{n}" for p in ("root", "own", "own-kept", "tied") for n in LOSSES)
    for case, result in report.items():
        assert result["loss"] <= 1e-5, case
        assert max(result["gradients"].values()) <= 1e-6, (case, result["gradients"])
        assert result["warnings"] == [], case


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """Three updates of sparse_softmax, fused, on one process."""
    out = tmp_path_factory.mktemp("one")
    _run(out, "trainer", "none", "sparse_softmax", 3, out, processes=1)
    return torch.load(out / "none-sparse_softmax.pt")


def _with_deepspeed(folder) -> str:
    """A Python whose environment is the project's plus DeepSpeed (``requirements/deepspeed.txt``, which says why it
    is kept apart)."""
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    site, ours = (subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                 capture_output=True, text=True, check=True).stdout.strip()
                  for python in (venv / "bin" / "python", sys.executable))
    (Path(site) / "project.pth").write_text(ours + "\n")  # the project's packages, seen from the new environment
    proc = subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "-r",
                           ROOT / "requirements" / "deepspeed.txt"], capture_output=True, text=True, cwd=folder)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(venv / "bin" / "python")


@pytest.mark.parametrize("engine", ["ddp", "fsdp2", pytest.param("zero3", marks=pytest.mark.slow)])
def test_two_processes_make_the_updates_of_one_under_each_engine(engine, one_process, tmp_path):
    """Three updates of 4 rows, as 2 + 2 rows on two processes, end with the weights and logged losses of one process
    (the loss of each process divided by the items of the whole batch, as the Trainer expects). Under ZeRO-3 (slow:
    it installs DeepSpeed) every parameter is partitioned outside its module's forward."""
    skip_in_fast_tier("torchrun")
    python = _with_deepspeed(tmp_path) if engine == "zero3" else sys.executable
    _run(tmp_path, "trainer", engine, "sparse_softmax", 3, tmp_path, python=python)
    two = torch.load(tmp_path / f"{engine}-sparse_softmax.pt")
    assert two["weights"].keys() == one_process["weights"].keys()
    for key, value in one_process["weights"].items():
        torch.testing.assert_close(two["weights"][key], value, msg=key, rtol=1e-4, atol=1e-6)
    assert two["losses"] == pytest.approx(one_process["losses"], rel=1e-5)


def _curves_agree(name: str, fused: list[float], unfused: list[float]) -> None:
    """Softmax and sparse_softmax are continuous in the logits: the curves agree to 1e-4. AS-Softmax masks a row whose
    target probability passes a threshold, so a row at the threshold may be masked in one run and not in the other,
    which moves that update's loss by the row's share: most updates agree to 1e-4, none by more than 0.05."""
    gaps = torch.tensor(fused) - torch.tensor(unfused)
    assert len(gaps) == 120
    if name == "as_softmax":
        assert gaps.abs().median() <= 1e-4 and gaps.abs().max() <= 0.05, gaps
    else:
        assert gaps.abs().max() <= 1e-4, gaps


@pytest.mark.parametrize("name", LOSSES)
def test_over_120_updates_the_fused_loss_follows_the_unfused_curve(name, tmp_path):
    """The convergence check: 120 updates (AdamW, 16 rows learnt by heart) with the fused and the unfused loss on one
    process, and the fused loss on two FSDP2 processes: the same loss curve, which falls."""
    skip_in_fast_tier("120 updates, three times")
    for unfused in (False, True):
        _run(tmp_path, "trainer", "none", name, 120, tmp_path, *(["--unfused"] if unfused else []), processes=1)
    _run(tmp_path, "trainer", "fsdp2", name, 120, tmp_path)
    fused, unfused, sharded = (torch.load(tmp_path / f"{run}.pt")["losses"]
                               for run in (f"none-{name}", f"none-{name}-unfused", f"fsdp2-{name}"))
    assert sum(fused[-10:]) < 0.5 * sum(fused[:10]), "the loss falls"
    _curves_agree(name, fused, unfused)
    _curves_agree(name, sharded, unfused)
