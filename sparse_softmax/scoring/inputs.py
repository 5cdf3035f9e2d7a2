"""Reading what is scored: plain text files or a fairseq-generate output, checked line by line.

Every problem is an :class:`InputError` that names the file and line. Nothing is skipped silently:
the only things dropped are lines a fairseq-generate output has that are not hypotheses or
references (``S-``/``D-``/``P-`` lines, logs), and extra n-best hypotheses, which are counted; a
UTF-8 byte-order mark at the start of a file is removed and noted. Text that still carries subword
markers (sentencepiece ``▁``, subword-nmt ``@@``) is refused unless asked for: scored as words it
gives meaningless numbers (ROUGE-1 6.37 instead of 64.31 on one Gigaword output).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..userinput import BOM_REMOVED, UserInputError, decode, without_bom

#: Subword markers that ``--remove-bpe`` undoes, with fairseq's ``--post-process`` semantics.
REMOVE_BPE = ("none", "sentencepiece", "subword_nmt", "wordpiece")
#: How a hypothesis file is read; auto = fairseq-generate output when it has ``H-<id>`` lines.
FORMATS = ("auto", "text", "fairseq")

_FAIRSEQ_LINE = re.compile(r"^([A-Z])-(\d+)\t")
#: Subword markers left in text, by the --remove-bpe scheme that removes them.
#: (Not WordPiece's ##: Gigaword writes digits as #, so "##th" is a word there.)
_SUBWORD_MARKERS = {"sentencepiece": re.compile("\u2581"), "subword_nmt": re.compile(r"\S@@(?= |$)")}
#: fairseq-generate writes an out-of-vocabulary reference word as this (``escape_unk=True``).
ESCAPED_UNK = "<<unk>>"


class InputError(UserInputError):
    """Bad input, with the file and line it was found at."""


def read_lines(path: str | Path, notes: list[str]) -> list[str]:
    """The lines of a UTF-8 text file without their line endings; refuses a missing, empty or non-UTF-8
    file. A byte-order mark at its start is removed, and said so in ``notes``."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    data, had_bom = without_bom(path.read_bytes())
    if had_bom:
        notes.append(f"{path}: {BOM_REMOVED}")
    text = decode(data, path)
    if not text:
        raise InputError(f"{path}: the file is empty")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def remove_bpe(text: str, scheme: str) -> str:
    """Undo subword segmentation exactly as fairseq's ``--post-process`` does for the same scheme (``wordpiece``,
    which fairseq has no post-processing for: as the Hugging Face tokenizer joins its pieces)."""
    if scheme == "sentencepiece":
        return text.replace(" ", "").replace("\u2581", " ").strip()
    if scheme == "subword_nmt":
        return (text + " ").replace("@@ ", "").rstrip()
    if scheme == "wordpiece":  # BERT's WordPiece (--hf-tokenizer data): a continuation piece starts with ##
        return (" " + text).replace(" ##", "").strip()
    if scheme == "none":
        return text
    raise ValueError(f"--remove-bpe: unknown scheme {scheme!r}; expected one of {', '.join(REMOVE_BPE)}")


def check_no_subwords(texts: list[str], path: str | Path, what: str, advice: str) -> None:
    """Refuse ``texts`` (one per example) when any still carries subword markers."""
    for scheme, marker in _SUBWORD_MARKERS.items():
        marked = [i for i, text in enumerate(texts) if marker.search(text)]
        if marked:
            raise InputError(
                f"{path}: {len(marked)} of {len(texts)} {what} contain {scheme} subword markers (example "
                f"{marked[0]}: {texts[marked[0]][:60]!r}); {advice.format(scheme=scheme)}, or pass "
                "--allow-subwords if they are meant to be scored as they are"
            )


def is_fairseq_output(lines: list[str]) -> bool:
    """True when the file looks like fairseq-generate/-interactive output (it has ``H-<id>`` lines)."""
    return any(line.startswith("H-") and _FAIRSEQ_LINE.match(line) for line in lines)


@dataclass
class FairseqOutput:
    """Hypotheses (``H-``) and references (``T-``) of a fairseq-generate output, in sentence-id order."""

    hypotheses: list[str]
    references: list[str] | None
    extra_hypotheses: int = 0  # n-best hypotheses after the first of each sentence, not scored
    escaped_unk_references: int = 0
    notes: list[str] = field(default_factory=list)


def parse_fairseq_output(path: str | Path, lines: list[str]) -> FairseqOutput:
    """Collect ``H-`` and ``T-`` lines by sentence id and check that ids 0..N-1 are all there.

    fairseq prints sentences in batch (length) order, and a dropped batch would leave a gap in the
    ids; a gap, a duplicated ``T-`` line or a malformed ``H-`` line is an error naming the line.
    """
    hyps: dict[int, str] = {}
    refs: dict[int, str] = {}
    extra = 0
    for number, line in enumerate(lines, 1):
        match = _FAIRSEQ_LINE.match(line)
        if not match:
            continue
        kind, sid = match.group(1), int(match.group(2))
        if kind == "H":
            parts = line.split("\t", 2)
            if len(parts) != 3:
                raise InputError(f"{path}:{number}: expected 'H-<id><TAB><score><TAB><text>', got {line!r}")
            if sid in hyps:
                extra += 1  # --nbest > 1: fairseq prints the best hypothesis first
            else:
                hyps[sid] = parts[2]
        elif kind == "T":
            if sid in refs:
                raise InputError(f"{path}:{number}: a second T-{sid} line")
            refs[sid] = line.split("\t", 1)[1]
    count = max(hyps, default=-1) + 1
    _check_ids(path, "H-", hyps, count)
    output = FairseqOutput([hyps[i] for i in range(count)], None, extra_hypotheses=extra)
    if refs:
        _check_ids(path, "T-", refs, count)
        orphans = sorted(refs.keys() - hyps.keys())
        if orphans:
            raise InputError(f"{path}: T- lines for ids without an H- line ({', '.join(map(str, orphans[:10]))})")
        output.references = [refs[i] for i in range(count)]
        output.escaped_unk_references = sum(ESCAPED_UNK in ref for ref in output.references)
    if extra:
        output.notes.append(f"{extra} n-best hypotheses after the first of each sentence were not scored")
    if output.escaped_unk_references:
        output.notes.append(
            f"{output.escaped_unk_references} T- references contain fairseq's {ESCAPED_UNK} for an "
            "out-of-vocabulary word: pass the original references with --refs for exact scores"
        )
    return output


def _check_ids(path: str | Path, kind: str, entries: dict[int, str], count: int) -> None:
    missing = sorted(set(range(count)) - entries.keys())
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise InputError(
            f"{path}: {len(missing)} of the sentence ids 0..{count - 1} have no {kind} line ({shown}); "
            "was a sentence dropped or the output cut short?"
        )


@dataclass
class Pairs:
    """Hypotheses and their references, one list entry per example, plus what was noted on the way."""

    hypotheses: list[str]
    references: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def empty_hypotheses(self) -> int:
        return sum(not hyp.split() for hyp in self.hypotheses)


def load_pairs(hyp_path: str | Path, ref_path: str | Path | None, *, fmt: str = "auto",
               bpe: str = "none", allow_subwords: bool = False) -> Pairs:
    """Hypotheses from a plain text file or a fairseq-generate output, references from a file or ``T-`` lines.

    ``bpe`` is undone on what the model produced (hypotheses and ``T-`` lines, which fairseq prints with
    the same post-processing); a ``--refs`` file is taken as it is. Empty references are refused: an
    example without a reference cannot be scored. Empty hypotheses are kept and score zero. Subword
    markers left in the hypotheses or references are refused unless ``allow_subwords``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    notes: list[str] = []
    lines = read_lines(hyp_path, notes)
    ref_path_used: str | Path = ref_path if ref_path is not None else hyp_path
    if fmt == "fairseq" or (fmt == "auto" and is_fairseq_output(lines)):
        parsed = parse_fairseq_output(hyp_path, lines)
        if not parsed.hypotheses:
            raise InputError(f"{hyp_path}: no H- lines")
        hyps = [remove_bpe(h, bpe) for h in parsed.hypotheses]
        notes += parsed.notes
        if ref_path is None:
            if parsed.references is None:
                raise InputError(f"{hyp_path}: no T- lines (run fairseq-generate on data with targets) and no --refs")
            refs = [remove_bpe(r, bpe) for r in parsed.references]
        else:
            refs = read_lines(ref_path, notes)
    else:
        if ref_path is None:
            raise InputError(f"{hyp_path}: plain text hypotheses need --refs")
        hyps = [remove_bpe(h, bpe) for h in lines]
        refs = read_lines(ref_path, notes)
    if len(hyps) != len(refs):
        raise InputError(
            f"{len(hyps)} hypotheses in {hyp_path} but {len(refs)} references in {ref_path_used}: "
            "the files must have one line per example"
        )
    for index, ref in enumerate(refs):
        if not ref.split():
            where = f"T- line of id {index}" if ref_path is None else f"line {index + 1}"
            raise InputError(f"{ref_path_used}: {where}: empty reference")
    if not allow_subwords:
        undo = ("score with --remove-bpe {scheme}" if bpe == "none" else
                f"--remove-bpe {bpe} did not remove them: is {{scheme}} the segmentation?")
        check_no_subwords(hyps, hyp_path, "hypotheses", undo)
        check_no_subwords(refs, ref_path_used, "references",
                          undo if ref_path is None else "pass the references as plain text (e.g. the prep's test.ref)")
    return Pairs(hyps, refs, notes)
