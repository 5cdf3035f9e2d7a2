"""SQuAD v1.1 JSON → answer-aware question generation examples.

Each question becomes one example: the passage (cut to a window around the answer when it is longer
than the budget) joined with the answer by a separator, and the question as the target. Both orders
the papers use are offered: UniLM's "passage [SEP] answer" and ProphetNet's "answer [SEP] passage".
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

from .ptb import tokenize  # PTB tokens with offsets, as Du et al.'s files
from .textio import InvalidExample, PrepError, SplitCounts, read_document

ORDERS = ("passage-answer", "answer-passage")


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
    separator: str = "[SEP]"
    lowercase: bool = True
    skip_invalid: bool = False


def _field(record: dict, key: str, kind: type, where: str):
    value = record.get(key) if isinstance(record, dict) else None
    if not isinstance(value, kind):
        raise BadRecord(where, f"missing or malformed '{key}'", f" (expected {kind.__name__})")
    return value


def examples(articles: list[Article], options: QGOptions, counts: SplitCounts) -> Iterator[tuple[str, str]]:
    """(source, question) for every question of ``articles``; a bad record is an error naming the file
    and the qa id (or its position), or with ``skip_invalid`` a counted skip."""
    for article in articles:
        origin = f"{article.path}: data[{article.index}]"
        for p, paragraph in enumerate(_field(article.record, "paragraphs", list, origin)):
            where = f"{origin}.paragraphs[{p}]"
            context = _field(paragraph, "context", str, where)
            tokens = tokenize(context)
            for q, qa in enumerate(_field(paragraph, "qas", list, where)):
                counts.read += 1
                qid = qa.get("id", f"#{q}") if isinstance(qa, dict) else f"#{q}"
                try:
                    yield _example(context, tokens, qa, options, counts, f"{where}: qa {qid}")
                except BadRecord as err:
                    counts.skip_or_raise(err, options.skip_invalid)


def _example(context: str, tokens, qa: dict, options: QGOptions, counts: SplitCounts, where: str) -> tuple[str, str]:
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
    answer_tokens = [tok for tok, _, _ in tokens[span[0]:span[-1] + 1]]
    budget = options.max_source_tokens - len(answer_tokens) - 1  # the separator takes one
    if budget < len(answer_tokens):
        # The passage window must hold the answer itself, so the least that works is 2 * answer + 1.
        raise BadRecord(where, "answer too long for --max-source-tokens",
                        f" ({options.max_source_tokens}; the answer has {len(answer_tokens)} tokens): the least that "
                        f"works is --max-source-tokens {2 * len(answer_tokens) + 1} (the answer in the passage, "
                        f"the separator, the answer again)")
    words = [tok for tok, _, _ in tokens]
    if len(words) > budget:
        # A window of `budget` tokens, the answer as central as the passage's ends allow.
        first = min(max(span[0] - (budget - len(answer_tokens)) // 2, 0), len(words) - budget)
        words = words[first:first + budget]
        counts.edited[f"passage cut to a {options.max_source_tokens}-token window around the answer"] += 1
    passage, answer_text = " ".join(words), " ".join(answer_tokens)
    target = " ".join(tok for tok, _, _ in tokenize(question))
    if options.lowercase:
        passage, answer_text, target = passage.lower(), answer_text.lower(), target.lower()
    parts = (passage, answer_text) if options.order == "passage-answer" else (answer_text, passage)
    return f"{parts[0]} {options.separator} {parts[1]}", target
