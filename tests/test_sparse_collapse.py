"""experiments/sparse_collapse/sparse_collapse.py end to end on toy Du-format lines (20 updates, one warm-up): its probes are checked
against what fairseq-train itself measured on the valid split at the same checkpoints."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, json_logs, run_script

K = 10


@pytest.fixture(scope="module")
def collapse(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("collapse")
    subprocess.run([sys.executable, ROOT / "data-prep" / "make_toy_data.py", root / "raw", "--train", "300",
                    "--valid", "10", "--test", "20"], check=True, capture_output=True)
    du = root / "du"
    du.mkdir()
    for split, name in (("train", "dev"), ("test", "test")):
        for side, prefix in (("src", "src"), ("tgt", "tgt")):
            (du / f"{prefix}-{name}.txt").write_bytes((root / "raw" / f"{split}.{side}").read_bytes())
    out = root / "out"
    run_script("experiments/sparse_collapse/sparse_collapse.py", "--du2017-dir", du, "--out", out, "--scale", "tiny", "--updates",
               "20", "--warmups", "0.5", "--k", K)
    return out


def runs(out: Path) -> dict[str, dict]:
    return {run["name"]: run for run in json.loads((out / "probes.json").read_text(encoding="utf-8"))}


def valid_records(out: Path, name: str) -> dict[int, dict]:
    log = (out / "work" / name / "train.log").read_text(encoding="utf-8")
    return {int(r["valid_num_updates"]): r for r in json_logs(log, "valid")}


def test_probes_agree_with_fairseqs_own_validation(collapse):
    """At each probed checkpoint, the probe's valid cross-entropy is what fairseq-train's validation of the
    cross_entropy run logged there, and its Sparse-softmax loss at scale 1 what the sparse_softmax run's
    validation logged as its loss: the probe reads the same model on the same data."""
    found = runs(collapse)
    assert list(found) == ["cross_entropy", "sparse_softmax", "sparse_softmax after 50% softmax"]
    for name, folder, key in (("cross_entropy", "cross-entropy", "valid_loss"),
                              ("sparse_softmax", "sparse-softmax", "valid_loss")):
        logged = valid_records(collapse, folder)
        probes = found[name]["probes"]
        assert len(probes) >= 5 and {p["update"] for p in probes} <= set(logged)
        for p in probes:
            value = p["nll"] if name == "cross_entropy" else p["sparse_loss"]
            assert value == pytest.approx(float(logged[p["update"]][key]), abs=2e-3), (name, p["update"])


def test_the_warmup_run_is_the_softmax_run_until_it_switches(collapse):
    found = runs(collapse)
    warm, base = found["sparse_softmax after 50% softmax"], found["cross_entropy"]
    assert warm["switch"] == 10
    def nll(run: dict, after: bool) -> list[float]:
        return [p["nll"] for p in run["probes"] if (p["update"] > warm["switch"]) == after]

    assert nll(warm, False) and nll(warm, False) == pytest.approx(nll(base, False), rel=1e-4)  # softmax both
    assert nll(warm, True) != pytest.approx(nll(base, True), rel=1e-4)


def test_loss_by_scale_starts_at_log_k_and_its_minimum_is_reported(collapse):
    for run in runs(collapse).values():
        for p in run["probes"]:
            assert p["loss_by_scale"][0] == pytest.approx(math.log2(K))
            assert p["best_loss"] == pytest.approx(min(p["loss_by_scale"]))
            assert 0 <= p["topk"] - p["top1"] and p["topk"] <= 1
            if p["flat_slope"] >= 0:  # convex in the scale, starting upwards: flat is the best
                assert p["best_scale"] == 0.0


def test_table_plot_and_a_second_run_reads_the_records(collapse):
    table = (collapse / "results.md").read_text(encoding="utf-8")
    assert table.startswith("`python experiments/sparse_collapse/sparse_collapse.py --du2017-dir")
    warm = runs(collapse)["sparse_softmax after 50% softmax"]
    assert table.count("| sparse_softmax after 50% softmax | ") == len(warm["probes"])
    assert (collapse / "probes.png").stat().st_size > 10_000
    assert not list(collapse.glob("work/*/checkpoints/*.pt")), "the weights are deleted once probed"


def test_bad_input_is_one_line_error(tmp_path):
    proc = run_script("experiments/sparse_collapse/sparse_collapse.py", "--warmups", "1.5", "--out", tmp_path, check=False)
    assert proc.returncode == 2 and "--warmups: expected shares between 0 and 1" in proc.stderr.splitlines()[-1]
    (tmp_path / "du").mkdir()
    (tmp_path / "du" / "src-dev.txt").write_text("a b\n")
    proc = run_script("experiments/sparse_collapse/sparse_collapse.py", "--du2017-dir", tmp_path / "du", "--out", tmp_path / "out",
                      check=False)
    assert proc.returncode == 2 and "no tgt-dev.txt (expected Du et al.'s" in proc.stderr.splitlines()[-1]
    assert "Traceback" not in proc.stderr
