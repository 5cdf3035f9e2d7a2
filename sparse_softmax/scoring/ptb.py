"""Penn Treebank (PTB) tokenisation with character offsets, for SQuAD question generation; and a BERT
tokenizer's output brought back to PTB tokens for scoring against Du et al.'s references (``from_bert``).

Du et al. 2017's sentence-level files were made with the Stanford PTB tokenizer, so text prepared from
the SQuAD JSON is split the same way: the two kinds of data then share a vocabulary, and scores against
Du et al.'s references mean the same thing. The rules are a few regular expressions of our own rather
than nltk's TreebankWordTokenizer, which reads an already-tokenised '' back as an opening quote, splits
AT&T and US$, and splits only the period at the very end of the text (a SQuAD passage has several
sentences; nltk's punkt sentence splitter would need a model download). The PTB conventions kept:

* words keep their inner periods, hyphens, slashes, apostrophes and & (U.S.  3.5  e-mail  and/or
  O'Brien  AT&T); commas and colons inside numbers stay (1,000  10:30); a hyphen at a word's edge
  (-selling, six- and, "Mastiff"-type) and a slash not between ASCII letters or digits (/ˈʃoʊpæn/,
  singers/ dancers) are split off;
* clitics are split: didn't -> did n't, can't -> ca n't, cannot -> can not, building's -> building 's
  (also 'll 're 've 'm 'd); a trailing ' (the students') is a token of its own; ’ is spelled ';
* quotes: an opening “, or " before an ASCII letter or digit, becomes ``, any other " or ” '' (Stanford's
  rule: "[...] and "'03 open with ''); an opening ' or ‘ becomes `, a closing ' stays; `` and '' already
  in PTB form are left as they are (so Du et al.'s lines come back unchanged);
* brackets ( ) [ ] { } become -LRB- -RRB- -LSB- -RSB- -LCB- -RCB- (lower-cased: Du et al.'s -lrb- ...);
  en and em dashes become --, … becomes ..., ½ becomes 1/2, £ # and € $ (as Stanford's tokenizer wrote
  them in Du et al.'s files); zero-width spaces, joiners and marks separate words;
* ? ! ; @ # % < > * ° − (°C and °F stay whole), $ (with up to three letters right before it: US$), a
  comma or colon not followed by a digit, a + not followed by one (500+, nike+ipod; +3 stays), an & not
  between letters or digits and a page cited after a word (ago.:104) are tokens of their own (runs of ?!
  stay together);
* a sentence-final period is split off: a period at the end of the text (closing quotes or brackets
  may follow), before a citation mark (fast.[3]) or before whitespace, unless its word is an
  abbreviation: letters in ones and twos between periods (U.S. Ph.D.), a common title or abbreviation
  (Mr. St. etc.), one used before numbers when a number follows (No. 5), or a single letter before more
  text (the initial in J. Doe; at the end of the text, World War I. loses its period). Abbreviations that
  may end a sentence (Inc. Ltd. Jr. etc. and US states) do so at the end of the text or before a capital,
  and get the second period Stanford's tokenizer writes there (Ltd. . The): that token's span is empty.

``sentences`` splits the tokens into sentences as Stanford's splitter did for Du et al.'s files. Measured
against them (tools/du2017_rebuild.py), 98.9 % of their test sentences come back identical from SQuAD.

Tokens come with (start, end) offsets into the original text; text[start:end] is what the token was
made from ("(" for -LRB-, "’s" for 's, nothing for a repeated period), so an answer span can be located
among them.
"""
from __future__ import annotations

import difflib
import re
import sys
import unicodedata
from typing import Callable, Iterable

_OPENERS = r"\s(\[{<`“‘\-–—"  # what may precede an opening quote (besides the start of the text)
# Every match is a token of its own (the group says how it is spelled); the text between matches is cut
# at whitespace. [^\W_] is a letter or digit, [^\W\d_] a letter.
_ISOLATE = re.compile(rf"""
    (?P<ptb>``|''|-[LR][RSC]B-)                                         # already PTB: kept
  | (?P<open2>“|(?<![^{_OPENERS}])"(?=[A-Za-z0-9]))                     # -> `` (before [ ' ... É: '' as PTB)
  | (?P<close2>["”])                                                    # -> ''
  | (?P<clitic>(?<=[^\W_])n['’]t(?![^\W_])|['’](?:s|m|d|ll|re|ve)(?![^\W_]))
  | (?P<open1>[`‘]|(?<![^{_OPENERS}])'(?=[^\W\d_]))                     # -> ` (not '90s)
  | (?P<close1>(?<=\S)['’](?![^\W_]))                                   # -> ' (not O'Brien)
  | (?P<bracket>[()\[\]{{}}])                                           # -> -LRB- ...
  | (?P<dash>-{{2,}}|[–—])                                              # -> --
  | (?P<ellipsis>\.\.\.|…)                                              # -> ...
  | (?P<page>(?<=[^\W\d_]|\.):\d[\d,]*)                                  # his abilities.:33 (a page cited)
  | (?P<fraction>[\u00bc-\u00be\u2150-\u215e])                                 # ½ -> 1/2
  | (?P<cannot>(?<![^\W_])can(?=not(?![^\W_])))                         # can|not
  | (?P<currency>(?<![^\W\d_])[^\W\d_]{{1,3}}\$|[$£€])                  # US$, $ (£ -> #, € -> $)
  | (?P<hyphen>(?:^|(?<=[\s"”'’)\]}}]))-(?=[^\W\d_])|(?<=[^\W_])-(?![^\W_]))  # -selling "Mastiff"-type six- and
  | (?P<punct>[?!]+|\*+|°[CF](?![^\W_])|[;@#%<>°−]|\+(?!\d)|[,:](?!\d)|(?<![^\W_])&|&(?![^\W_])
                 |(?<![A-Za-z0-9])/|/(?![A-Za-z0-9]))  # °C; AT&T and/or stay, not samādhi/bhāvana
""", re.VERBOSE | re.IGNORECASE)
_BRACKETS = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-"}
_SPELLING = {"open2": "``", "close2": "''", "open1": "`", "close1": "'", "dash": "--", "ellipsis": "...", "£": "#",
             "€": "$"}
_WORD = re.compile(r"[^\s\u200b-\u200f\u2060\ufeff]+")  # zero-width spaces, joiners and marks separate words too
# After a word's period: closing quotes/brackets, then the end of the text, a citation mark ([3]), or whitespace,
# opening quotes/brackets and the next word's first character (or an ellipsis).
_AFTER_PERIOD = re.compile(r"""([)\]}"'”’]*)(?:\s*\Z|\[|\s+[(\[{"'“‘`]*(\w|\.\.\.|…))""")
# U.S.  e.g.  Ph.D.  a.m.: letters in ones and twos between periods (lifeandtimes.com. ends a sentence)
_DOTTED = re.compile(r"(?:[^\W\d_]{1,2}\.)+[^\W\d_]{1,2}\.")
# Abbreviations (general English usage, not taken from any data set): their period ends no sentence, but those of
# _MAY_END end one at the end of the text or before a capital, where PTB writes a second period (Ltd. . The). Fr.
# (Father) is not one: Stanford's tokenizer, and so Du et al.'s files, end a sentence there.
_ABBREVIATIONS = frozenset("""mr mrs ms dr prof rev st mt ft gen col lt capt sgt gov sen rep pres hon vs
    jan feb mar apr jun jul aug sep sept oct nov dec al cf est""".split())
_MAY_END = frozenset("""etc inc ltd co corp plc bros jr sr
    ala ariz ark calif colo conn fla ga kan kans ky md mass mich minn mo mont neb nev okla ore tenn tex va vt wis wyo
    """.split())  # companies, a son, US states
_BEFORE_NUMBERS = frozenset("no nos op vol vols ca approx fig figs pp".split())  # abbreviations only there: No. 5

Token = tuple[str, int, int]


def _spell(match: re.Match) -> str:
    kind, raw = match.lastgroup, match.group()
    if kind == "bracket":
        return _BRACKETS[raw]
    if kind == "ptb":
        return raw.upper()
    if kind == "fraction":
        return unicodedata.normalize("NFKC", raw).replace("\u2044", "/")
    return _SPELLING.get(kind, _SPELLING.get(raw, raw.replace("’", "'")))


def _final_period(text: str, word: str, end: int) -> str:
    """What becomes of the period of ``word`` (which ends at ``end`` in ``text``): ``"split"`` off, as a sentence's
    end (before whitespace, a citation mark ``[3]`` or the end of the text, unless the word is an abbreviation or a
    single letter before more text: ``J. Doe``, ``p. 12``; at the end, ``World War I.`` loses it); ``"kept"`` with
    the word; or ``"repeated"``: kept, and a sentence-final one added (``Ltd. The``, see _MAY_END)."""
    after = _AFTER_PERIOD.match(text, end)
    if after is None:
        return "kept"
    abbreviation = word[:-1].lower()
    if abbreviation in _MAY_END and not after.group(1) and (after.group(2) is None or after.group(2).isupper()):
        return "repeated"
    if _DOTTED.fullmatch(word) or abbreviation in _ABBREVIATIONS or abbreviation in _MAY_END:
        return "kept"
    if abbreviation in _BEFORE_NUMBERS and after.group(2) is not None and after.group(2).isdigit():
        return "kept"
    return "split" if after.group(2) is None or not (len(word) == 2 and word[0].isalpha()) else "kept"


def _words(text: str, start: int, end: int) -> Iterable[Token]:
    """The whitespace-separated words of ``text[start:end]``, a sentence-final period split off (or added)."""
    for match in _WORD.finditer(text, start, end):
        word, s, e = match.group().replace("’", "'"), match.start(), match.end()
        period = "kept"
        if len(word) > 1 and word.endswith(".") and not word.endswith(".."):
            period = _final_period(text, word, e)
        if period == "split":
            yield word[:-1], s, e - 1
            yield ".", e - 1, e
        else:
            yield word, s, e
        if period == "repeated":
            yield ".", e, e


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


_CLOSERS = frozenset(["''", "'", "-RRB-", "-RSB-", "-RCB-"])


def sentences(tokens: list[Token]) -> list[tuple[int, int]]:
    """The sentences of ``tokenize``'s tokens as ``[start, end)`` token ranges, split as Stanford's splitter split
    the PTB tokens of Du et al.'s files: after each sentence-final ``.``, ``?`` or ``!`` (``tokenize`` decides which
    periods end a sentence) with the closing quotes and brackets right after it."""
    ranges, start, i = [], 0, 0
    while i < len(tokens):
        token = tokens[i][0]
        i += 1
        if token == "." or (token[0] in "?!" and set(token) <= {"?", "!"}):
            while i < len(tokens) and tokens[i][0] in _CLOSERS:
                i += 1
            ranges.append((start, i))
            start = i
    if start < len(tokens):
        ranges.append((start, len(tokens)))
    return ranges


# BERT's basic tokenizer splits off every punctuation mark; these put back together what the PTB keeps together
# (numbers, abbreviations, hyphenated words, names with an apostrophe) or splits its own way (clitics).
_BERT_JOINS = [
    (re.compile(r"(?<=\d) (,) (?=\d{3}(?!\d))|(?<=\d) ([.:]) (?=\d)"), r"\1\2"),      # 10 , 000   88 . 9   10 : 30
    (re.compile(r"\b(?:[^\W\d_] \. ){2,}"), lambda m: m.group().replace(" ", "") + " "),  # u . s . -> u.s.
    (re.compile(r"(?<=[^\W_]) \.(?= \S)"), "."),  # st . john: tokenize splits it again unless an abbreviation
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
