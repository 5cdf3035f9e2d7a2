"""Every command block of README.md and of the docs/ pages runs as printed, so the documentation cannot drift from
the code.

The ```bash blocks run in reading order — README.md, then the docs/ pages in the order its contents table links
them — each as one ``bash`` script with ``set -euo
pipefail``, in a sandbox: a folder whose entries link to the repository's (so ``scripts/...``,
``data-prep/...``, ``--user-dir user_dir`` and ``.venv`` resolve as they do in the repository) plus
tiny stand-ins, made here, for the data the commands name (``sumdata/``, ``train-v1.1.json``,
``clinc150/data_full.json``, ...). Later blocks use what earlier ones wrote, as a reader would. Every docs/ page
is in the contents, and every relative link of these pages points at a file and heading that exist.

The commands are changed in scale only, by ``SCALE`` below (and the demo's ``DEMO_MAX_UPDATE``): fewer
updates, epochs and training pairs, a tiny transformer for the base one, and a free port for the distributed
example. A block preceded by
``<!-- readme-test: skip (reason) -->`` is not run; the reason is required. Every fenced block is
``bash`` or ``text``, so none escapes the test by having no language. The commands the prose names
inline (``python benchmarks/loss_speed.py --device cuda``) must name scripts that exist and take
those options.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_together

README = ROOT / "README.md"
DOCS = ROOT / "docs"
FIXTURES = ROOT / "tests" / "fixtures"
VENV = Path(sys.executable).parent.parent
#: What the sandbox links to in the repository.
LINKED = ("sparse_softmax", "user_dir", "scripts", "data-prep", "benchmarks", "experiments", "tools", "examples",
          "requirements", "setup.py", "pyproject.toml", "README.md")
_FENCE = re.compile(r"^```(\w*)$")
_SKIP = re.compile(r"^<!-- readme-test: skip \((.+)\) -->$")


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


#: (pattern, replacement): the only changes made to the README's commands, all of scale.
SCALE = [
    (r"--max-update \d+", "--max-update 3"),
    (r"--max-steps \d+", "--max-steps 3"),
    (r"--max-epoch \d+", "--max-epoch 1"),
    (r"--train-subset \d+", "--train-subset 20"),
    (r"--valid-from-train \d+", "--valid-from-train 6"),
    (r"--arch transformer(?= )", "--arch transformer_tiny"),
    (r"tcp://127\.0\.0\.1:29500", "tcp://127.0.0.1:" + _free_port()),
]


def pages() -> list[Path]:
    """README.md, then the docs/ pages in the order its contents table links them."""
    contents = README.read_text(encoding="utf-8").split("\n## Contents\n", 1)[1].split("\n## ", 1)[0]
    linked = re.findall(r"(?m)^\| \[[^\]]+\]\(docs/([\w-]+\.md)\)", contents)
    return [README, *(DOCS / name for name in dict.fromkeys(linked))]


def readme_blocks() -> list[tuple[str, str, str, str | None]]:
    """(page:line of the opening fence, language, text, skip reason or None) for every fenced block, in reading
    order."""
    blocks = []
    for page in pages():
        lines, number = page.read_text(encoding="utf-8").splitlines(), 0
        while number < len(lines):
            fence = _FENCE.match(lines[number])
            if fence:
                skip = _SKIP.match(lines[number - 1]) if number else None
                end = lines.index("```", number + 1)
                blocks.append((f"{page.relative_to(ROOT)}:{number + 1}", fence.group(1),
                               "\n".join(lines[number + 1:end]), skip and skip.group(1)))
                number = end
            number += 1
    return blocks


def test_every_fenced_block_is_bash_or_text():
    untagged = [line for line, language, _, _ in readme_blocks() if language not in ("bash", "text")]
    assert not untagged, f"{untagged}: tag each block ```bash (run by this test) or ```text"


def test_every_docs_page_is_in_the_contents():
    assert sorted(pages()[1:]) == sorted(DOCS.glob("*.md"))


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of a page (outside code blocks)."""
    text = re.sub(r"(?ms)^```.*?^```$", "", page.read_text(encoding="utf-8"))
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"(?m)^#+ (.+)$", text)}


def test_relative_links_point_at_what_exists():
    broken = []
    for page in pages():
        prose = re.sub(r"(?ms)^```.*?^```$", "", page.read_text(encoding="utf-8"))
        for target in _LINK.findall(prose):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, fragment = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists() or (fragment and fragment not in anchors(file)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


# ----------------------------------------------------------------- tiny stand-ins for the data

def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _du2017(folder: Path, rng: random.Random) -> None:
    """Du et al.'s sentence-level layout: tokenised, lower-cased sentences and questions; a sentence may
    have several questions (the grouping of score_questions.py --group-by-source)."""
    things = ["the river", "the museum", "the treaty", "the library", "the bridge", "the festival"]
    for split, n in (("train", 60), ("dev", 10), ("test", 10)):
        src, tgt = [], []
        for i in range(n):
            thing, year = rng.choice(things), rng.randrange(1800, 2000)
            sentence = f"{thing} was built in {year} by the city council ."
            src += [sentence, sentence] if i % 3 == 0 else [sentence]
            tgt += [f"when was {thing} built ?", f"who built {thing} ?"] if i % 3 == 0 else [f"when was {thing} built ?"]
        _write(folder / f"src-{split}.txt", src)
        _write(folder / f"tgt-{split}.txt", tgt)


def _clinc150(path: Path, rng: random.Random) -> None:
    """CLINC150's data_full.json layout with its 150 intents and oos (151 classes, as the README trains)."""
    def items(intent: str, n: int) -> list[list[str]]:
        return [[f"please {intent.replace('_', ' ')} now {rng.choice(['today', 'quickly', 'again'])}", intent]
                for _ in range(n)]

    intents = [f"intent_{k}" for k in range(150)]
    data = {}
    for key, n in (("train", 2), ("val", 1), ("test", 1)):
        data[key] = [item for intent in intents for item in items(intent, n)]
        data[f"oos_{key}"] = [[f"what is the meaning of {rng.choice(['life', 'rain'])}", "oos"] for _ in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def _conll(path: Path, rng: random.Random, sentences: int) -> None:
    names, places = ["Anna", "Boris", "Chen"], ["Paris", "Lima", "Oslo"]
    lines = ["-DOCSTART- -X- -X- O", ""]
    for _ in range(sentences):
        lines += [f"{rng.choice(names)} NNP B-NP B-PER", "visited VBD B-VP O", f"{rng.choice(places)} NNP B-NP B-LOC",
                  ". . O O", ""]
    _write(path, lines)


def make_inputs(root: Path) -> None:
    rng = random.Random(0)
    shutil.copytree(FIXTURES / "gigaword_harvard", root / "sumdata")
    shutil.copytree(FIXTURES / "gigaword_unilm", root / "unilm")
    shutil.copytree(FIXTURES / "gigaword_harvard", root / "gigaword-10k")  # a sample and the test set, no valid split
    for name in ("valid.article.filter.txt", "valid.title.filter.txt"):
        (root / "gigaword-10k" / "train" / name).unlink()
    shutil.copy(FIXTURES / "squad_train.json", root / "train-v1.1.json")
    shutil.copy(FIXTURES / "squad_dev.json", root / "dev-v1.1.json")
    for split, titles in (("train", ["University_of_Notre_Dame", "Amazon_rainforest"]), ("dev", ["Normans"]),
                          ("test", ["Warsaw"])):
        _write(root / "du2017" / f"doclist-{split}.txt", titles)
    _du2017(root / "squad_qg_du2017", rng)
    _clinc150(root / "clinc150" / "data_full.json", rng)
    for split, n in (("train", 30), ("dev", 5), ("test", 5)):
        _write(root / "sst5" / f"stsa.fine.{split}",
               [f"{label} {rng.choice(['a', 'the'])} film was {word}" for label, word in
                (rng.choice([(0, "awful"), (2, "fine"), (4, "great")]) for _ in range(n))])
        _write(root / f"{split}.tsv", [f"{text}\t{labels}" for text, labels in
                                       (rng.choice([("stocks fell", "finance"), ("rain today", "weather"),
                                                    ("storm hits markets", "finance weather")]) for _ in range(n))])
    for name, n in (("eng.train", 30), ("eng.testa", 5), ("eng.testb", 5)):
        _conll(root / name, rng, n)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("readme")
    for name in LINKED:
        (root / name).symlink_to(ROOT / name)
    (root / ".venv").symlink_to(VENV)
    (root / ".tmp").mkdir()
    make_inputs(root)
    return root


# ----------------------------------------------------------------- running the blocks

def scaled(command: str) -> str:
    for pattern, replacement in SCALE:
        command = re.sub(pattern, replacement, command)
    return command


def test_every_scale_change_applies_to_some_command():
    """A pattern that no longer matches would silently stop shrinking a command."""
    text = "\n".join(block for _, language, block, skip in readme_blocks() if language == "bash" and not skip)
    unused = [pattern for pattern, _ in SCALE if not re.search(pattern, text)]
    assert not unused, f"SCALE patterns that match no README command: {unused}"


def test_readme_commands_run_as_printed(sandbox):
    env = {**os.environ, "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONUNBUFFERED": "1",
           "TMPDIR": str(sandbox / ".tmp"), "DEMO_MAX_UPDATE": "60"}  # scale, as SCALE: the demo's training
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # the plugin must load checkpoints by itself
    ran = 0
    for line, language, block, skip in readme_blocks():
        if language != "bash" or skip:
            continue
        script = sandbox / (".block-" + re.sub(r"[^\w.-]", "-", line) + ".sh")
        script.write_text("set -euo pipefail\n" + scaled(block) + "\n", encoding="utf-8")
        proc = run_together([["bash", str(script)]], timeout=900, cwd=sandbox, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)[0]
        assert proc.returncode == 0, (f"{line}: the block failed ({proc.returncode}):\n{block}\n"
                                      f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-5000:]}")
        ran += 1
    assert ran >= 10
    # What the reader gets at the end: scores for both tasks, every test sentence decoded.
    assert json.loads((sandbox / "rouge-source-vocab.json").read_text())["counts"]["examples"] == 5
    assert len(re.findall(r"^H-", (sandbox / "qg-gen.txt").read_text(), re.M)) == 10 + 4  # 10 sentences, 4 twice


@pytest.mark.parametrize("stop", [subprocess.TimeoutExpired, KeyboardInterrupt])
def test_a_stopped_block_takes_its_jobs_with_it(tmp_path, monkeypatch, stop):
    """Killing only the block's bash would leave the training it started running through the rest of the suite
    (past the block's timeout), or on after the suite (Ctrl-C, which the block's own session does not get)."""
    pid_file = tmp_path / "job.pid"
    if stop is KeyboardInterrupt:  # the user presses Ctrl-C while the block's job runs
        communicate = subprocess.Popen.communicate

        def interrupted(self, *args, timeout=None, **kwargs):
            if timeout is None:  # run_together reaping the killed session
                return communicate(self, *args, **kwargs)
            for _ in range(100):
                if pid_file.exists() and pid_file.read_text().strip():
                    raise KeyboardInterrupt
                time.sleep(0.1)
            pytest.fail("the block's job did not start")

        monkeypatch.setattr(subprocess.Popen, "communicate", interrupted)
    with pytest.raises(stop):
        run_together([["bash", "-c", f"sleep 600 > /dev/null 2>&1 & echo $! > {pid_file}; wait"]], timeout=2,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    job = int(pid_file.read_text())
    stat = Path(f"/proc/{job}/stat")
    for _ in range(50):  # a killed orphan may linger a moment as a zombie until it is reaped
        if not stat.exists() or stat.read_text().split(") ")[1].startswith("Z"):
            break
        time.sleep(0.1)
    else:
        os.kill(job, signal.SIGKILL)
        pytest.fail(f"the block's background job was still running after {stop.__name__}")


def test_blocks_not_run_say_why():
    skipped = [(line, skip) for line, language, _, skip in readme_blocks() if skip]
    assert skipped and all(len(reason.split()) >= 3 for _, reason in skipped), skipped


# ----------------------------------------------------------------- commands named in the prose

_INLINE = re.compile(r"`((?:python|bash) (?:scripts|benchmarks|experiments|tools|data-prep)/[^`]+)`")


def test_commands_in_the_prose_name_scripts_that_take_their_options():
    prose = re.sub(r"(?ms)^```.*?^```$", "", "\n".join(page.read_text(encoding="utf-8") for page in pages()))
    commands = _INLINE.findall(prose)
    assert len(commands) >= 5
    helps: dict[str, str] = {}
    for command in commands:
        runner, path, *args = command.split()
        script = ROOT / path
        assert script.is_file(), f"the documentation names {path}, which does not exist"
        options = [a.split("=")[0] for a in args if a.startswith("--")]
        if runner == "python" and options:
            if path not in helps:
                helps[path] = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True,
                                             text=True, check=True).stdout
            missing = [o for o in options if o not in helps[path]]
            assert not missing, f"`{command}`: {path} --help does not list {missing}"
