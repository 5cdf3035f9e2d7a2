"""User mistakes in the plugin's options: refused in one line with exit status 2, never as a traceback.

Every plugin option is a fairseq dataclass field with a help string; a field whose values are
restricted also declares ``"check"`` in its metadata (``at_least(1)``, ``in_range(0, 1)``, ...). The
check is read in two places, so it is written once:

1. On the command line. fairseq builds the argparse options of the chosen criterion, task and model
   by calling their ``add_args``; ours (``add_checked_args``) make each check part of its option's
   argparse type. ``fairseq-train --as-delta 1.5`` then stops while the arguments are parsed, with
   ``fairseq-train: error: --as-delta must be in [0, 1], got 1.5`` and exit status 2, as argparse
   reports a bad option, before fairseq loads any data or prints its configuration.
2. When a criterion or task is built from a config that did not come from the command line (code,
   hydra YAML): ``validate`` raises ``UsageError``.

What only shows once the data is loaded (a symbol missing from the dictionary, a class count that
does not match) or in a combination of options raises ``UsageError`` too; ``fairseq_compat`` makes
the fairseq command-line tools print it as ``<tool>: error: <message>`` and exit with status 2.
``UsageError`` is a ``ValueError``, so code calling the plugin directly catches it as usual.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

#: A check takes the option's value and returns what is wrong with it ("must be >= 1, got 0"), or None.
Check = Callable[[Any], Optional[str]]


class UsageError(ValueError, RuntimeError):
    """A mistake in the options or in the data they point at, reported to the user in one line.

    Also a ``RuntimeError`` because fairseq's trainer saves a ``crash.pt`` checkpoint when a training
    step raises anything else (a mistake found in the first step is no crash), and re-raises a
    ``RuntimeError`` as it is."""


def report_error(message: str) -> None:
    """Print ``<tool>: error: <message>`` as argparse does for a bad option, without the usage first:
    fairseq's runs to hundreds of lines and would bury the message."""
    sys.stdout.flush()
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr, flush=True)


def exit_with_error(message: str) -> None:
    """Stop while the arguments are parsed: ``report_error``, then exit status 2."""
    report_error(message)
    raise SystemExit(2)


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


@dataclass(frozen=True)
class Interval:
    """Values in ``low .. high`` (either end may be open or absent), e.g. ``[0, 1)`` or ``> 0``."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False

    def __call__(self, value) -> Optional[str]:
        too_low = value < self.low or (self.low_open and value == self.low)
        too_high = value > self.high or (self.high_open and value == self.high)
        if not (too_low or too_high or value != value):  # value != value: NaN
            return None
        shown = _number(value) if isinstance(value, (int, float)) else repr(value)
        return f"must be {self}, got {shown}"

    def __str__(self) -> str:
        if self.high == math.inf:
            return f"{'>' if self.low_open else '>='} {_number(self.low)}"
        if self.low == -math.inf:
            return f"{'<' if self.high_open else '<='} {_number(self.high)}"
        return (f"in {'(' if self.low_open else '['}{_number(self.low)}, "
                f"{_number(self.high)}{')' if self.high_open else ']'}")


def at_least(low: float) -> Interval:
    return Interval(low=low)


def positive() -> Interval:
    return Interval(low=0, low_open=True)


def negative() -> Interval:
    return Interval(high=0, high_open=True)


def in_range(low: float, high: float, *, high_open: bool = False) -> Interval:
    return Interval(low, high, high_open=high_open)


def unset_or(check: Check, unset: int = -1) -> Check:
    """``check``, but the value ``unset`` ("not given") is accepted too."""

    def check_unless_unset(value) -> Optional[str]:
        problem = None if value == unset else check(value)
        return problem and problem.replace(", got", f" (or {unset}), got", 1)

    return check_unless_unset


def even_at_least_2(value) -> Optional[str]:
    if value >= 2 and value % 2 == 0:
        return None
    return f"must be an even integer >= 2 (odd orders make the Taylor expansion negative), got {value}"


def flag(name: str) -> str:
    """The command-line spelling of a config field."""
    return "--" + name.replace("_", "-")


def checked_type(convert: Callable[[str], Any], check: Check, option: str) -> Callable[[str], Any]:
    """An argparse ``type`` for ``option`` that converts the text with ``convert``, then stops the program
    on a value ``check`` refuses."""

    def convert_and_check(text: str):
        value = convert(text)
        problem = check(value)
        if problem:
            exit_with_error(f"{option} {problem}")
        return value

    # argparse names the type in its "invalid <name> value: 'abc'" message: keep fairseq's name
    convert_and_check.__name__ = getattr(convert, "__name__", "value")
    return convert_and_check


def add_checked_args(parser, dataclass_instance, delete_default: bool = False) -> None:
    """fairseq's ``gen_parser_from_dataclass``, with each field's ``check`` attached to its option."""
    from fairseq.dataclass.utils import gen_parser_from_dataclass

    gen_parser_from_dataclass(parser, dataclass_instance, delete_default)
    checks = {f.name: f.metadata["check"] for f in dataclasses.fields(dataclass_instance) if "check" in f.metadata}
    for action in parser._actions:  # argument groups share their parser's list of actions
        if action.dest in checks and action.type is not None:
            action.type = checked_type(action.type, checks.pop(action.dest), action.option_strings[0])


class CheckedArgs:
    """Mixin for fairseq criterions, tasks and models configured by a dataclass: their options are
    checked as they are parsed."""

    @classmethod
    def add_args(cls, parser) -> None:
        dc = getattr(cls, "__dataclass", None)
        if dc is not None:
            add_checked_args(parser, dc())


def validate(cfg, dataclass_type) -> None:
    """Apply every field's check to ``cfg`` (a dataclass instance, an omegaconf config or a namespace)."""
    for f in dataclasses.fields(dataclass_type):
        check = f.metadata.get("check")
        value = None if check is None else getattr(cfg, f.name, None)  # configs of older checkpoints lack fields
        problem = None if value is None else check(value)
        if problem:
            raise UsageError(f"{flag(f.name)} {problem}")

