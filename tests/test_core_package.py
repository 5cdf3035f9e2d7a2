"""The core package stands alone: ``import sparse_softmax`` (every module of it) works where fairseq cannot be
imported, and where fairseq is installed it imports nothing of fairseq's, so it patches nothing; the Hugging Face
adapters need transformers, never fairseq."""
from __future__ import annotations

import math
import pkgutil
import shutil
import subprocess
import sys

import pytest

import sparse_softmax
from conftest import ROOT

#: The core's tests, run again in a fresh virtualenv where the wheel is installed without fairseq.
CORE_TESTS = ["conftest.py", "test_core_package.py", "test_losses.py", "test_fused_output_layer.py",
              "test_schedules.py", "test_metrics.py", "test_scoring.py"]


def _modules() -> list[str]:
    return [info.name for info in pkgutil.walk_packages(sparse_softmax.__path__, "sparse_softmax.")]


def _core_modules() -> list[str]:
    """All but those that need an optional package: the Triton kernels, the Hugging Face adapters."""
    return [name for name in _modules()
            if not name.endswith("_triton") and not name.startswith("sparse_softmax.hf")]


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


BLOCK_FAIRSEQ = """
import importlib.abc, sys
class NoFairseq(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "fairseq":
            raise ModuleNotFoundError("No module named 'fairseq' (blocked by the test)")
sys.meta_path.insert(0, NoFairseq())
"""


def test_the_core_imports_and_computes_without_fairseq():
    modules = _core_modules()
    assert "sparse_softmax.losses.output_layer" in modules and "sparse_softmax.schedules" in modules
    code = BLOCK_FAIRSEQ + f"""
import importlib, torch
for name in {modules!r}:
    importlib.import_module(name)
from sparse_softmax import sparse_softmax_loss
loss = sparse_softmax_loss(torch.tensor([[3.0, 1.0, 0.0]]), torch.tensor([0]), k=2)
print(round(loss.item(), 6))
"""
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert float(proc.stdout) == round(math.log1p(math.exp(-2.0)), 6)  # −log(e³ / (e³ + e¹)): the top 2 only


def test_the_hugging_face_adapters_import_without_fairseq():
    pytest.importorskip("transformers")
    adapters = [name for name in _modules() if name.startswith("sparse_softmax.hf")]
    assert "sparse_softmax.hf.loss" in adapters
    code = BLOCK_FAIRSEQ + f"""
import importlib
for name in {adapters!r}:
    importlib.import_module(name)
"""
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_importing_the_core_imports_nothing_of_fairseq():
    code = f"""
import importlib, sys
for name in {_core_modules()!r}:
    importlib.import_module(name)
print(sorted({{m.split(".")[0] for m in sys.modules}} & {{"fairseq", "user_dir", "transformers"}}))
"""
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


def test_every_exported_name_resolves_to_its_module():
    for name in sparse_softmax.__all__:
        value = getattr(sparse_softmax, name)
        assert value.__module__.startswith("sparse_softmax."), (name, value.__module__)


def test_the_scorers_and_the_prep_helpers_start_without_torch():
    proc = _python("import sys, sparse_softmax.scoring.report, sparse_softmax.scoring.ptb, sparse_softmax.userinput; "
                   "print('torch' in sys.modules)")
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr[-3000:]


def _run(*command, cwd=None) -> str:
    proc = subprocess.run([str(c) for c in command], capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, f"{command} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
def test_the_wheel_installs_without_fairseq_and_the_core_tests_pass_there(tmp_path):
    """The wheel built from the repository, in a fresh virtualenv with torch and no fairseq: the core's tests (a
    copy, away from the repository, so the installed package is what they import) pass."""
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path / "dist",
         ROOT)
    [wheel] = (tmp_path / "dist").glob("sparse_softmax-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    torch_pin = next(line for line in (ROOT / "requirements/base.txt").read_text().splitlines()
                     if line.startswith("torch=="))
    _run(python, "-m", "pip", "install", "-q", torch_pin)
    _run(python, "-m", "pip", "install", "-q", f"{wheel}[test,scoring]")
    installed = _run(python, "-m", "pip", "list", "--format", "freeze").lower()
    assert "fairseq" not in installed and "transformers" not in installed, installed
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in CORE_TESTS:
        shutil.copy(ROOT / "tests" / name, tests / name)
    where = _run(python, "-c", "import sparse_softmax; print(sparse_softmax.__file__)", cwd=tmp_path)
    assert where.startswith(str(venv)), where
    report = _run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests, cwd=tmp_path)
    assert " passed" in report and "failed" not in report, report[-3000:]
