"""scripts/wheelhouse.py: the offline install. Fast tests check its one-line errors and freeze parsing;
the slow end-to-end test (opt-in: ``bash scripts/run_tests.sh --run-slow -k wheelhouse``, about eight minutes,
needs the package index) builds a wheelhouse, installs it into a fresh virtualenv with no package index
reachable, and trains and decodes a few updates with that environment's fairseq commands."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

import wheelhouse  # scripts/ (pyproject.toml's pytest pythonpath)
from conftest import N_TEST, ROOT, TRAIN_COMMON, output_lines, run_script

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def fails_with(*args, message: str) -> None:
    proc = run_script("scripts/wheelhouse.py", *args, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr  # usage line + the error


def test_read_freeze_keeps_versions_and_counts_editables(tmp_path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("# header\ntorch==2.11.0+cu130\nNumPy==2.5.2\n\n"
                      "-e git+https://example.org/x.git@abc#egg=my_pkg\nlocal-thing @ file:///tmp/lt\n")
    assert wheelhouse.read_freeze(freeze) == {
        "torch": "torch==2.11.0+cu130", "numpy": "NumPy==2.5.2", "my-pkg": "", "local-thing": ""}


def test_build_errors_are_one_line(tmp_path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("torch==2.11.0\nthis is not pip freeze\n")
    fails_with("build", tmp_path / "w1", "--python", "3.12", "--target-freeze", freeze,
               message=f"{freeze}:2: not a `pip freeze` line")
    freeze.write_text("numpy==2.5.2\n")
    fails_with("build", tmp_path / "w2", "--python", "3.12", "--target-freeze", freeze,
               message="lists no torch; use --torch pinned")
    freeze.write_text("torch==2.11.0\n")
    fails_with("build", tmp_path / "w3", "--python", "3.12", "--torch", "pinned", "--target-freeze", freeze,
               message="the target already has torch==2.11.0")
    fails_with("build", tmp_path / "w4", "--python", "3.12", "--target-freeze", tmp_path / "absent.txt",
               message="absent.txt")
    fails_with("build", tmp_path, "--python", "3.12", message="is not empty; give a new folder")
    fails_with("build", tmp_path / "w5", "--python", "3", message="--python must be MAJOR.MINOR")


def test_install_errors_are_one_line(tmp_path):
    fails_with("install", tmp_path, message="wheelhouse.json not found")
    manifest = {"python": "3.9", "glibc": "2.28", "arch": "x86_64", "torch": "present", "tests": False,
                "files": ["x-1.0-py3-none-any.whl"]}
    (tmp_path / "wheelhouse.json").write_text(json.dumps(manifest))
    fails_with("install", tmp_path, message="was built for Python 3.9, this is Python")
    manifest["python"] = PYTHON
    (tmp_path / "wheelhouse.json").write_text(json.dumps(manifest))
    fails_with("install", tmp_path, message="incomplete: 1 files missing, e.g. x-1.0-py3-none-any.whl")


def offline_env(venv: Path) -> dict[str, str]:
    """The environment of a machine without a package index: no pip configuration (it may name local
    wheel folders), an index and proxies that refuse connections, and the fresh venv first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and "proxy" not in k.lower()}
    unreachable = "http://127.0.0.1:9"
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": f"{unreachable}/simple",
            "http_proxy": unreachable, "https_proxy": unreachable, "PATH": f"{venv / 'bin'}:{env['PATH']}"}


def sh(*args, env: dict | None = None, cwd: Path = ROOT) -> str:
    proc = subprocess.run([str(a) for a in args], env=env, cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(map(str, args))}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout + proc.stderr


def installed(venv: Path) -> dict[str, str]:
    """{project: version} of what the virtualenv has."""
    listing = subprocess.run([venv / "bin/python", "-m", "pip", "list", "--format", "json"],
                             capture_output=True, text=True, check=True).stdout
    return {wheelhouse.canonical(p["name"]): p["version"] for p in json.loads(listing)}


@pytest.mark.slow
@pytest.mark.parametrize("torch_mode", ["present", "pinned"])
def test_offline_install_trains_and_decodes(torch_mode, tmp_path, toy_data):
    """A fresh virtualenv (with torch already in it, as on a GPU node, or bare) gets everything from the
    wheelhouse with no index reachable, keeps what it had (build tools only ever upgraded: a bare one's
    setuptools is too old for torch), and runs fairseq-train and masked fairseq-generate with the plugin."""
    venv, house = tmp_path / "venv", tmp_path / "wheelhouse"
    sh(sys.executable, "-m", "venv", venv)
    if torch_mode == "present":
        torch_pin = next(r for r in wheelhouse.requirement_lines("base.txt") if wheelhouse.project(r) == "torch")
        sh(venv / "bin/python", "-m", "pip", "install", "-q", torch_pin)
    (tmp_path / "freeze.txt").write_text(sh(venv / "bin/python", "-m", "pip", "freeze", "--all"))
    sh(sys.executable, ROOT / "scripts/wheelhouse.py", "build", house, "--python", PYTHON, "--torch", torch_mode,
       "--target-freeze", tmp_path / "freeze.txt")
    before = installed(venv)
    shipped = {wheelhouse.project(f) for f in json.loads((house / "wheelhouse.json").read_text())["files"]}
    assert not (shipped - wheelhouse.BUILD_TOOLS) & set(before), "the wheelhouse ships what the target has"
    assert ("torch" in shipped) == (torch_mode == "pinned")

    env = offline_env(venv)
    sh(venv / "bin/python", ROOT / "scripts/wheelhouse.py", "install", house, env=env)
    after = installed(venv)
    kept = {name: version for name, version in before.items() if name not in wheelhouse.BUILD_TOOLS}
    assert {name: after[name] for name in kept} == kept, "a package the target had was replaced"
    assert all(Version(after[name]) >= Version(before[name]) for name in wheelhouse.BUILD_TOOLS & set(before))
    assert shipped <= set(after), f"not installed: {shipped - set(after)}"

    save_dir = tmp_path / "checkpoints"
    train = sh(venv / "bin/fairseq-train", toy_data, *TRAIN_COMMON, "--task", "sparse_seq2seq",
               "--arch", "transformer_tiny", "--criterion", "sparse_softmax", "--sparse-topk", "5",
               "--max-update", "5", "--save-dir", save_dir, env=env)
    assert "done training" in train
    generate = sh(venv / "bin/fairseq-generate", toy_data, "--user-dir", ROOT / "user_dir", "--cpu",
                  "--task", "sparse_seq2seq", "--path", save_dir / "checkpoint_last.pt", "--beam", "3",
                  "--decoding-topk", "5", "--gen-subset", "test", env=env)
    assert len(output_lines(generate, "H")) == N_TEST
