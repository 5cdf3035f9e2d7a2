"""tools/kernel_tuning.py on the CPU, its kernels in Triton's interpreter: every setting of every section
runs and lands in the table. The script's real runs are on a GPU, rare and short, where a fault in it would lose
the run."""
from __future__ import annotations

import re

import pytest

from conftest import run_script

pytest.importorskip("triton", reason="Triton is not installed")
import kernel_tuning  # noqa: E402  (its lists of settings; its kernels run in the script's own process)

SECTIONS = {  # title → the rows each case must have
    "Sparse-softmax layer, forward with gradient pairs (bf16)": 2,
    "Sparse-softmax row kernel, forward with gradient pairs (bf16 logits)": 2 + len(kernel_tuning.ROW_SETTINGS),
    "AS row kernel, loss and gradient (bf16 logits)": 2 + len(kernel_tuning.AS_SETTINGS),
    f"Sparse-softmax layer's backward from {kernel_tuning.K + 1} gradient pairs a row (bf16)":
        2 * (1 + len(kernel_tuning.PIECES)),
}


def test_every_setting_runs_and_is_tabled(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "tuning.md"
    run_script("tools/kernel_tuning.py", "--device", "cpu", "--cases", "4x16x64", "--repeats", "1", "--out", out)
    text = out.read_text(encoding="utf-8")
    assert text.startswith("Device: CPU")
    bodies = dict(re.findall(r"^## (.+)\n\n((?:\|.*\n)+)", text, flags=re.M))
    assert list(bodies) == [*SECTIONS, "Fused block path, forward + backward (bf16)"]
    for title, body in bodies.items():
        rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in body.splitlines()[2:]]
        assert {row[0] for row in rows} <= {"N=4 H=16 V=64", "N=4 V=64"}, title
        assert float(rows[0][3]) == 1.0, f"{title}: the first row is the one the others are divided by"
        assert all(float(row[2]) > 0 for row in rows), title
        if title in SECTIONS:
            assert len(rows) == SECTIONS[title], f"{title}: {len(rows)} rows"
        else:  # at 4 rows every block budget makes one block of them
            names = [row[1] for row in rows]
            assert names == ["F.linear + F.cross_entropy", *(
                f"{loss}, fused, blocks of 2^{budget.bit_length() - 1} logits (4 rows)"
                for budget in kernel_tuning.BLOCK_BUDGETS for loss in ("cross_entropy", "as_softmax"))]


def test_the_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    proc = run_script("tools/kernel_tuning.py", "--device", "cpu", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("set TRITON_INTERPRET=1")
