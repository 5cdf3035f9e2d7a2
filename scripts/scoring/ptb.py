"""Penn Treebank (PTB) tokenisation with character offsets, for SQuAD question generation; and a BERT
tokenizer's output brought back to PTB tokens for scoring against Du et al.'s references (``from_bert``).

Du et al. 2017's sentence-level files were made with the Stanford PTB tokenizer, so text prepared from
the SQuAD JSON is split the same way: the two kinds of data then share a vocabulary, and scores against
Du et al.'s references mean the same thing. The rules are a few regular expressions of our own rather
than nltk's TreebankWordTokenizer, which reads an already-tokenised '' back as an opening quote, splits
AT&T and US$, and splits only the period at the very end of the text (a SQuAD passage has several
sentences; nltk's punkt sentence splitter would need a model download). The PTB conventions kept:

* words keep their inner periods, hyphens, slashes, apostrophes and & (U.S.  3.5  e-mail  and/or
  O'Brien  AT&T); commas and colons inside numbers stay (1,000  10:30);
* clitics are split: didn't -> did n't, can't -> ca n't, cannot -> can not, building's -> building 's
  (also 'll 're 've 'm 'd); a trailing ' (the students') is a token of its own; ’ is spelled ';
* quotes: an opening " or “ becomes ``, a closing one ''; an opening ' or ‘ becomes `, a closing ' stays;
  `` and '' already in PTB form are left as they are (so Du et al.'s lines come back unchanged);
* brackets ( ) [ ] { } become -LRB- -RRB- -LSB- -RSB- -LCB- -RCB- (lower-cased: Du et al.'s -lrb- ...);
  en and em dashes become --, and … becomes ...;
* ? ! ; @ # % < >, $ (with up to three letters right before it: US$), a comma or colon not followed by
  a digit, and an & not between letters or digits are tokens of their own (runs of ?! stay together);
* a sentence-final period is split off: a period at the end of the text (closing quotes or brackets
  may follow) or before whitespace and a capital letter, unless its word is an abbreviation: inner
  periods (U.S.), a common title or abbreviation (Mr. St. Inc. etc.), or, before a capital, a single
  letter (the initial in J. Doe; at the end of the text, World War I. loses its period). Lower-case
  text such as Du et al.'s files is never split inside a line. Unlike Stanford's tokenizer we add no
  second period after a sentence-final abbreviation (it writes "etc. ."): every token has its own span.

Tokens come with (start, end) offsets into the original text; text[start:end] is what the token was
made from ("(" for -LRB-, "’s" for 's), so an answer span can be located among them.
"""
from __future__ import annotations

import difflib
import re
import sys
from typing import Callable, Iterable

_OPENERS = r"\s(\[{<`“‘\-–—"  # what may precede an opening quote (besides the start of the text)
# Every match is a token of its own (the group says how it is spelled); the text between matches is cut
# at whitespace. [^\W_] is a letter or digit, [^\W\d_] a letter.
_ISOLATE = re.compile(rf"""
    (?P<ptb>``|''|-[LR][RSC]B-)                                         # already PTB: kept
  | (?P<open2>“|(?<![^{_OPENERS}])"(?=\S))                              # -> ``
  | (?P<close2>["”])                                                    # -> ''
  | (?P<clitic>(?<=[^\W_])n['’]t(?![^\W_])|['’](?:s|m|d|ll|re|ve)(?![^\W_]))
  | (?P<open1>[`‘]|(?<![^{_OPENERS}])'(?=[^\W\d_]))                     # -> ` (not '90s)
  | (?P<close1>(?<=\S)['’](?![^\W_]))                                   # -> ' (not O'Brien)
  | (?P<bracket>[()\[\]{{}}])                                           # -> -LRB- ...
  | (?P<dash>-{{2,}}|[–—])                                              # -> --
  | (?P<ellipsis>\.\.\.|…)                                              # -> ...
  | (?P<currency>(?<![^\W\d_])[^\W\d_]{{1,3}}\$|\$)                     # US$, $
  | (?P<cannot>(?<![^\W_])can(?=not(?![^\W_])))                         # can|not
  | (?P<punct>[?!]+|[;@#%<>]|[,:](?!\d)|(?<![^\W_])&|&(?![^\W_]))
""", re.VERBOSE | re.IGNORECASE)
_BRACKETS = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-"}
_SPELLING = {"open2": "``", "close2": "''", "open1": "`", "close1": "'", "dash": "--", "ellipsis": "..."}
_WORD = re.compile(r"\S+")
# After a word's period: closing quotes/brackets, then the end of the text or whitespace, opening
# quotes/brackets and the next word's first letter (a capital starts a sentence).
_AFTER_PERIOD = re.compile(r"""[)\]}"'”’]*(?:\s*\Z|\s+[(\[{"'“‘`]*(\w))""")
# Abbreviations that are commonly followed by a capitalised word (a name, a month's day, a company's
# next word): general English usage, not taken from any data set.
_ABBREVIATIONS = frozenset("""mr mrs ms dr prof rev fr st mt ft gen col lt capt sgt gov sen rep pres hon
    jr sr vs inc co corp ltd bros jan feb mar apr jun jul aug sep sept oct nov dec etc""".split())

Token = tuple[str, int, int]


def _spell(match: re.Match) -> str:
    kind, raw = match.lastgroup, match.group()
    if kind == "bracket":
        return _BRACKETS[raw]
    if kind == "ptb":
        return raw.upper()
    return _SPELLING.get(kind, raw.replace("’", "'"))


def _ends_sentence(text: str, word: str, end: int) -> bool:
    """Whether the period of ``word`` (which ends at ``end`` in ``text``) ends a sentence: it comes last
    or before a capital, and the word is no abbreviation; a single letter before a capital is an
    initial (``J. Doe``), at the end of the text a word (``World War I.``)."""
    after = _AFTER_PERIOD.match(text, end)
    if after is None or "." in word[:-1] or word[:-1].lower() in _ABBREVIATIONS:
        return False
    if after.group(1) is None:
        return True
    return after.group(1).isupper() and not (len(word) == 2 and word[0].isalpha())


def _words(text: str, start: int, end: int) -> Iterable[Token]:
    """The whitespace-separated words of ``text[start:end]``, a sentence-final period split off."""
    for match in _WORD.finditer(text, start, end):
        word, s, e = match.group().replace("’", "'"), match.start(), match.end()
        if len(word) > 1 and word.endswith(".") and not word.endswith("..") and _ends_sentence(text, word, e):
            yield word[:-1], s, e - 1
            yield ".", e - 1, e
        else:
            yield word, s, e


def tokenize(text: str) -> list[Token]:
    """PTB tokens of ``text`` as ``(token, start, end)``, offsets into ``text`` (see the module's doc)."""
    tokens: list[Token] = []
    position = 0
    for match in _ISOLATE.finditer(text):
        tokens.extend(_words(text, position, match.start()))
        tokens.append((_spell(match), match.start(), match.end()))
        position = match.end()
    tokens.extend(_words(text, position, len(text)))
    return tokens


# BERT's basic tokenizer splits off every punctuation mark; these put back together what the PTB keeps together
# (numbers, abbreviations, hyphenated words, names with an apostrophe) or splits its own way (clitics).
_BERT_JOINS = [
    (re.compile(r"(?<=\d) (,) (?=\d{3}(?!\d))|(?<=\d) ([.:]) (?=\d)"), r"\1\2"),      # 10 , 000   88 . 9   10 : 30
    (re.compile(r"\b(?:[^\W\d_] \. ){2,}"), lambda m: m.group().replace(" ", "") + " "),  # u . s . -> u.s.
    (re.compile(r"(?<=[^\W_]) \.(?= \S)"), "."),  # st . john, jr . return: no period ends a lower-case line inside
    (re.compile(r"(?<=[^\W_]) ([-/]) (?=[^\W_])"), r"\1"),                       # 2015 - 2016   and / or
    (re.compile(r"(?<=[^\W_]) ' (?=(?:s|d|m|t|ll|re|ve)\b)"), "'"),               # dame ' s   doesn ' t
    (re.compile(r"\b([^\W\d_]) ' (?=[^\W\d_])"), r"\1'"),                        # o ' hara
    (re.compile(r'" ([^"]*?) "'), r'"\1"'),                                      # " outstanding ? "
]


def from_bert(text: str) -> str:
    """A BERT tokenizer's words (WordPiece joined back) as PTB tokens, space-separated: ``notre dame ' s`` →
    ``notre dame 's``, ``10 , 000`` → ``10,000``, ``u . s .`` → ``u.s.``, quotes as `` and ''. Models that
    write in their tokenizer's tokens are otherwise scored against PTB references with a tokenisation
    mismatch on every clitic and number (UniLM's evaluation re-joins them too). Bracket tokens are
    lower-cased in lower-case text (-lrb-), as the references are."""
    joined = f" {text.strip()} "
    for pattern, replacement in _BERT_JOINS:
        joined = pattern.sub(replacement, joined)
    tokens = [token for token, _, _ in tokenize(joined.strip())]
    if not any(c.isupper() for c in text):
        tokens = [token.lower() if token in _BRACKETS.values() else token for token in tokens]
    return " ".join(tokens)


def agreement(lines: Iterable[str], tokenizer: Callable[[str], list[Token]] = tokenize) -> tuple[float, float]:
    """How far re-tokenising already PTB-tokenised, lower-cased lines (Du et al.'s files) keeps them.

    Returns ``(tokens kept, lines kept)``: for each line, the line's own tokens (``line.split()``) and
    the lower-cased tokens ``tokenizer`` makes of it are aligned with ``difflib.SequenceMatcher`` (no
    junk heuristic); tokens kept = the matched tokens over all lines ÷ the lines' own token count;
    lines kept = the fraction of lines whose re-tokenisation is exactly their own tokens.
    """
    kept = total = same = count = 0
    for line in lines:
        own = line.split()
        ours = [token.lower() for token, _, _ in tokenizer(line)]
        matcher = difflib.SequenceMatcher(None, own, ours, autojunk=False)
        kept += sum(block.size for block in matcher.get_matching_blocks())
        total += len(own)
        same += ours == own
        count += 1
    return kept / max(total, 1), same / max(count, 1)


if __name__ == "__main__":  # python -m scoring.ptb FILE... (from scripts/): the agreement figures of each file
    for name in sys.argv[1:]:
        with open(name, encoding="utf-8") as file:
            tokens_kept, lines_kept = agreement(file.read().splitlines())
        print(f"{name}: tokens kept {100 * tokens_kept:.3f} %, lines kept {100 * lines_kept:.3f} %")
