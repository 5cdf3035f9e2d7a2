"""tools/fused_versus_commit.py: the fused output layer's time in this checkout against a commit's, each
from its own tree."""
from __future__ import annotations

import re
import subprocess

import pytest

from conftest import ROOT, run_script

pytestmark = pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout: no commit to compare with")


def worktrees() -> list[str]:
    out = subprocess.run(["git", "-C", str(ROOT), "worktree", "list", "--porcelain"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if line.startswith("worktree ")]


def test_times_both_trees_and_leaves_no_worktree():
    before = worktrees()
    out = run_script("tools/fused_versus_commit.py", "HEAD", "--case", "64x16x300", "--rounds", "2",
                     "--repeats", "1").stdout
    rounds = re.findall(r"^round (\d), (then|now): (.*)$", out, flags=re.M)
    assert [(r, who) for r, who, _ in rounds] == [("1", "then"), ("1", "now"), ("2", "then"), ("2", "now")]
    rows = re.findall(r"^\| (\w+) \| (\d+) \| (\d+) \| ([\d.]+) \|$", out, flags=re.M)
    assert [name for name, *_ in rows] == ["cross_entropy", "sparse_softmax", "as_softmax"]
    for name, then, now, ratio in rows:
        minima = {who: min(int(re.search(rf"{name} (\d+) ms", times)[1]) for r, w, times in rounds if w == who)
                  for who in ("then", "now")}
        assert (int(then), int(now)) == (minima["then"], minima["now"]), f"{name}: the minimum of its rounds"
        assert float(ratio) > 0
    assert worktrees() == before, "the commit's worktree is removed"


def test_an_unknown_commit_is_one_line_and_exit_2():
    proc = run_script("tools/fused_versus_commit.py", "no-such-commit", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("error: no commit 'no-such-commit' in " + str(ROOT))
