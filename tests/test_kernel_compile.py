"""tools/kernel_compile.py: every Triton kernel of the losses compiled for a GPU (sm_90) on the CPU, the
check that Triton's interpreter, which the other kernel tests run in, cannot make."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, skip_in_fast_tier

# Found, not imported: Triton reads TRITON_INTERPRET when imported, which the other kernel tests set first.
TRITON = importlib.util.find_spec("triton")
if TRITON is None:
    pytest.skip("Triton is not installed", allow_module_level=True)
if not (Path(TRITON.submodule_search_locations[0]) / "backends" / "nvidia" / "bin" / "ptxas").exists():
    pytest.skip("this Triton has no NVIDIA backend to compile with", allow_module_level=True)

KERNELS = ["Sparse-softmax row kernel", "Sparse-softmax row kernel, k = 128", "Sparse-softmax row kernel, no gradient",
           "Sparse-softmax row kernel, swept rows written",
           "AS row kernel, δ = 0.3", "AS row kernel, δ = 1 (cross_entropy)", "AS row kernel, δ = 0.3, no gradient",
           "layer's backward, weight gradient by atomic adds",
           "layer's backward, weight gradient by atomic adds, k = 128",
           "layer's backward, weight gradient by sorting", "sorted weight gradient, pieces",
           "sorted weight gradient, split classes' pieces added"]

#: A kernel that binds one name to two types across a branch taken at run time: the interpreter runs it,
#: Triton's compiler refuses it (the row kernel's lanes' sweep once had this fault).
REBINDS = '''
import torch, triton, triton.language as tl

@triton.jit
def rebinds(x_ptr):
    a, _ = tl.load(x_ptr), tl.load(x_ptr + 1)
    if a > 0:
        _ = tl.zeros([4], tl.float32)
    tl.store(x_ptr, a + 1)
'''


def python(script: Path, interpret: bool) -> subprocess.CompletedProcess:
    """``python script`` beside the benchmarks, in Triton's interpreter or not (whatever this process has set)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tools"), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)


def test_every_kernel_compiles_for_sm_90():
    skip_in_fast_tier("tools/kernel_compile.py")
    proc = python(ROOT / "tools" / "kernel_compile.py", interpret=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert list(lines) == KERNELS
    assert all(text.split()[1] == "registers," for text in lines.values()), proc.stdout
    spilling = {name for name, text in lines.items() if not text.split(", ")[1].startswith("spills 0 B stored")}
    assert not spilling, f"kernels that spill registers: {sorted(spilling)}"
    assert proc.stdout.splitlines()[-1] == "all compiled for sm_90"


def test_a_fault_the_interpreter_runs_is_refused(tmp_path):
    run = tmp_path / "run.py"  # a file: Triton reads a kernel's source from it
    run.write_text(REBINDS + "x = torch.ones(2)\nrebinds[(1,)](x)\nprint(float(x[0]))\n")
    ran = python(run, interpret=True)
    assert ran.returncode == 0 and ran.stdout.strip() == "2.0", ran.stderr
    compile_ = tmp_path / "compile.py"
    compile_.write_text(REBINDS + "from kernel_compile import compile_for\n"
                        "compile_for(rebinds, lambda: rebinds[(1,)](torch.ones(2)), 90)\n")
    compiled = python(compile_, interpret=False)
    assert compiled.returncode != 0
    assert "redefines it as" in compiled.stderr, compiled.stderr[-2000:]
