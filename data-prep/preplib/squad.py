"""SQuAD v1.1 JSON → answer-aware question generation examples.

Each question becomes one example: the passage, or the sentence that holds the answer (Du et al. 2017's unit),
cut to a window around the answer when it is longer than the budget, joined with the answer by a separator
(or alone: Du et al.'s sentence → question), and the question as the target. Both orders the papers use are
offered: UniLM's "passage [SEP] answer" and ProphetNet's "answer [SEP] passage".
The text is our PTB tokens (Du et al.'s convention), or for a pretrained checkpoint's tokenizer the original
text, measured in that tokenizer's tokens; the reference kept for scoring is the PTB-tokenised question either way.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

from sparse_softmax.scoring.ptb import sentences, tokenize  # PTB tokens with offsets, as Du et al.'s files
from .textio import InvalidExample, PrepError, SplitCounts, read_document

ORDERS = ("passage-answer", "answer-passage")
UNITS = ("passage", "sentence")


class Article(NamedTuple):
    """One entry of a SQuAD file's ``data`` list, with where it came from (for error messages)."""

    path: Path
    index: int
    record: dict

    @property
    def title(self):
        return self.record.get("title") if isinstance(self.record, dict) else None


def load_articles(path: Path) -> list[Article]:
    """The ``data`` list of a SQuAD JSON file; malformed JSON or non-UTF-8 is an error with its position."""
    try:
        document = json.loads(read_document(path, "SQuAD JSON"))
    except json.JSONDecodeError as err:
        raise PrepError(f"{path}:{err.lineno}:{err.colno}: malformed JSON ({err.msg})") from None
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise PrepError(f"{path}: expected the SQuAD layout {{'data': [articles]}}")
    return [Article(path, i, record) for i, record in enumerate(document["data"])]


class BadRecord(InvalidExample):
    """A record that cannot become an example; ``reason`` is what --skip-invalid counts it under."""

    def __init__(self, where: str, reason: str, detail: str = "") -> None:
        super().__init__(f"{where}: {reason}{detail}", reason)


@dataclass
class QGOptions:
    max_source_tokens: int = 464
    order: str = "passage-answer"
    #: the text the question is asked about: the passage, or the sentence the answer starts in
    unit: str = "passage"
    #: the answer joined to the text by the separator (False: the text alone, Du et al.'s setting)
    with_answer: bool = True
    separator: str = "[SEP]"
    lowercase: bool = True
    skip_invalid: bool = False
    #: the length of a piece of text in the source's tokens (None: one per PTB token). Given for a pretrained
    #: checkpoint's tokenizer, which also reads the original text rather than our PTB tokens
    tokenizer_length: Callable[[str], int] | None = None


def _field(record: dict, key: str, kind: type, where: str):
    value = record.get(key) if isinstance(record, dict) else None
    if not isinstance(value, kind):
        raise BadRecord(where, f"missing or malformed '{key}'", f" (expected {kind.__name__})")
    return value


def examples(articles: list[Article], options: QGOptions, counts: SplitCounts) -> Iterator[tuple[str, str, str]]:
    """(source, question, reference) for every question of ``articles``; the reference is the question as Du et
    al.'s files write it (PTB tokens, lower-cased unless ``--no-lowercase``), whatever the target's form. A bad
    record is an error naming the file and the qa id (or its position), or with ``skip_invalid`` a counted skip."""
    for article in articles:
        origin = f"{article.path}: data[{article.index}]"
        for p, paragraph in enumerate(_field(article.record, "paragraphs", list, origin)):
            where = f"{origin}.paragraphs[{p}]"
            context = _field(paragraph, "context", str, where)
            tokens = tokenize(context)
            length = options.tokenizer_length
            costs = [1] * len(tokens) if length is None else [length(context[s:e]) for _, s, e in tokens]
            units = [(0, len(tokens))] if options.unit == "passage" else sentences(tokens)
            for q, qa in enumerate(_field(paragraph, "qas", list, where)):
                counts.read += 1
                qid = qa.get("id", f"#{q}") if isinstance(qa, dict) else f"#{q}"
                try:
                    yield _example(context, tokens, costs, units, qa, options, counts, f"{where}: qa {qid}")
                except BadRecord as err:
                    counts.skip_or_raise(err, options.skip_invalid)


def window(costs: list[int], first: int, end: int, budget: int) -> tuple[int, int]:
    """The widest run of tokens around ``first:end`` whose costs sum to at most ``budget``, grown a token at a
    time on the right, then the left, and so on (with one token each: the answer as central as the passage's
    ends allow, the right side taking the odd one)."""
    left, right, room = first, end, budget - sum(costs[first:end])
    grew = True
    while grew:
        grew = False
        if right < len(costs) and costs[right] <= room:
            room, right, grew = room - costs[right], right + 1, True
        if left > 0 and costs[left - 1] <= room:
            room, left, grew = room - costs[left - 1], left - 1, True
    return left, right


def _example(context: str, tokens, costs: list[int], units: list[tuple[int, int]], qa: dict, options: QGOptions,
             counts: SplitCounts, where: str) -> tuple[str, str, str]:
    question = _field(qa, "question", str, where)
    answers = _field(qa, "answers", list, where)
    if not answers:
        raise BadRecord(where, "no answer")
    answer = answers[0]  # dev questions have several crowd answers; the first is the one shown in the paper
    text = _field(answer, "text", str, where)
    start = _field(answer, "answer_start", int, where)
    if context[start:start + len(text)] != text:
        raise BadRecord(where, "answer_start does not match the context",
                        f" (answer {text!r}, the context has {context[start:start + len(text)]!r} at {start})")
    span = [i for i, (_, s, e) in enumerate(tokens) if s < start + len(text) and e > start]
    if not span or not question.split():
        raise BadRecord(where, "empty answer or question")
    first, end = span[0], span[-1] + 1
    lo, hi = next((lo, hi) for lo, hi in units if lo <= first < hi)  # the unit where the answer starts
    inside = min(end, hi)  # the answer's part in it, around which a window is cut
    if end > hi:  # Du et al.'s files keep that sentence alone too
        counts.edited["answer runs past its sentence: the source is the sentence where it starts"] += 1
    length = options.tokenizer_length
    answer_cost = sum(costs[first:end])
    appended = answer_cost + (1 if length is None else length(options.separator)) if options.with_answer else 0
    held = sum(costs[first:inside])  # what of the answer the window must keep
    budget = options.max_source_tokens - appended
    if budget < held:
        raise _too_long(where, options, answer_cost, held + appended)

    def fit(budget: int) -> tuple[int, int]:
        if sum(costs[lo:hi]) <= budget:
            return lo, hi
        left, right = window(costs[lo:hi], first - lo, inside - lo, budget)
        return lo + left, lo + right

    left, right = fit(budget)
    reference = " ".join(tok for tok, _, _ in tokenize(question))
    if options.lowercase:
        reference = reference.lower()
    if length is None:  # PTB tokens, as Du et al.'s files
        text, answer_text = (" ".join(tok for tok, _, _ in tokens[i:j]) for i, j in ((left, right), (first, end)))
        if options.lowercase:
            text, answer_text = text.lower(), answer_text.lower()
        source, target = _join(text, answer_text, options), reference
    else:
        # the original text, which the pretrained tokenizer splits (and lower-cases) as it was trained to; a
        # token's pieces alone may differ from its pieces in context, so the window shrinks until the source fits
        answer_text = context[tokens[first][1]:tokens[end - 1][2]]
        while True:
            source = _join(context[tokens[left][1]:tokens[right - 1][2]], answer_text, options)
            over = length(source) - options.max_source_tokens
            if over <= 0:
                break
            if (left, right) == (first, inside):
                raise _too_long(where, options, answer_cost, held + appended + over)
            budget -= over
            left, right = fit(budget)
        target = question
    if (left, right) != (lo, hi):
        counts.edited[f"{options.unit} cut to a {options.max_source_tokens}-token window around the answer"] += 1
    return source, target, reference


def _too_long(where: str, options: QGOptions, answer_cost: int, least: int) -> BadRecord:
    parts = f"the answer in the {options.unit}" + (", the separator, the answer again" if options.with_answer else "")
    return BadRecord(where, "answer too long for --max-source-tokens",
                     f" ({options.max_source_tokens}; the answer has {answer_cost} tokens): the least that works is "
                     f"--max-source-tokens {least} ({parts})")


def _join(text: str, answer: str, options: QGOptions) -> str:
    if not options.with_answer:
        return text
    parts = (text, answer) if options.order == "passage-answer" else (answer, text)
    return f"{parts[0]} {options.separator} {parts[1]}"
