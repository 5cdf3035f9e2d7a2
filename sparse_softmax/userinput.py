"""What the data-prep and scoring scripts share about the files users give them.

Both read user text and must treat it alike: bytes that are not UTF-8 are an error naming the file,
line and column; a UTF-8 byte-order mark at the start of a file (some editors write one) is removed
and reported, never left glued to the first token, where it silently changes the data and the
scores (BLEU-4 of a file against an identical copy drops to 98.21); and a problem with the input
stops the script with one line, ``<script>: error: <file>:<line>: <what>``, and exit status 2, as
argparse does for a bad option. The prep library (``data-prep/preplib``) and the scoring library
(``sparse_softmax.scoring``) raise ``UserInputError`` subclasses and their scripts run under ``exit_on_error``.
"""
from __future__ import annotations

import argparse
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

BOM = b"\xef\xbb\xbf"
#: How a removed byte-order mark is reported (prep counts it per split, scoring notes it per file).
BOM_REMOVED = "UTF-8 byte-order mark removed"


class UserInputError(ValueError):
    """Bad input, with the file and line (or record) it was found at."""


def decode(raw: bytes, path: str | Path, first_line: int = 1) -> str:
    """``raw`` (a line, or a whole file) as UTF-8, or an error naming the line and column of the bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = first_line + raw.count(b"\n", 0, err.start)
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise UserInputError(f"{path}:{line}: not UTF-8 (byte 0x{raw[err.start]:02x} at column {column}); "
                             "convert the file to UTF-8") from None


def without_bom(data: bytes) -> tuple[bytes, bool]:
    """``data`` without a leading UTF-8 byte-order mark, and whether there was one."""
    return (data[len(BOM):], True) if data.startswith(BOM) else (data, False)


@contextmanager
def exit_on_error(parser: argparse.ArgumentParser) -> Iterator[None]:
    """Turn a ``UserInputError`` into ``<prog>: error: <message>`` and exit status 2."""
    try:
        yield
    except UserInputError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
