"""Argparse pieces shared by the `pyprefill` subcommands (cli.py, model_cli.py, bench/cli.py,
info_cli.py, formats/synth.py).

- Value types that check a value where argparse parses it, so that a bad one is refused with its
  flag's name ("pyprefill run: error: argument --chunk: -1 is less than 0", exit 2) before
  anything runs: int_in, int_list, name_list, positive_float, nonempty_path.
- DeprecatedOption: an option's old spelling, kept for a while.
- user_error_line: the one-line form of an error a user's input can cause.

A leaf: it imports nothing of the CLI, so the imports point one way (cli.py -> the subcommand
modules -> this module).
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from typing import Callable, Iterable

from .errors import PrefillError

INT32_MAX = 2**31 - 1


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def int_in(low: int, high: int | None = None, *, unit: str = "") -> Callable[[str], int]:
    """An argparse type: an int in [low, high] (high None: no upper bound)."""
    tail = f" {unit}" if unit else ""

    def parse(text: str) -> int:
        v = _int(text)
        if v is None:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
        if v < low:
            raise argparse.ArgumentTypeError(f"{v}{tail} is less than {low}")
        if high is not None and v > high:
            raise argparse.ArgumentTypeError(f"{v}{tail} is more than {high}")
        return v
    parse.__name__ = f"int >= {low}"
    return parse


def split_items(text: str, noun: str) -> list[str]:
    """The items of "a,b c" (separated by one comma, spaces, or both); ArgumentTypeError naming
    the first empty item ("1,,2", "1,2,"; [i] counts from 0, as Python indexes) and a list with
    no item at all."""
    body = text.strip()
    if not body or not body.strip(", "):
        raise argparse.ArgumentTypeError(f"{text!r}: no {noun} given")
    items = re.split(r"\s*,\s*|\s+", body)
    for i, item in enumerate(items):
        if not item:
            raise argparse.ArgumentTypeError(f"{text!r}: [{i}] is empty (one comma or spaces "
                                             f"between {noun})")
    return items


def int_list(low: int, high: int | None = None, *, noun: str = "integers",
             what: str = "an integer") -> Callable[[str], list[int]]:
    """An argparse type: ints in [low, high], comma or space separated ("512,2048 8192"), each
    checked; the error names the item's index (from 0) and its value."""
    bound = f"in [{low}, {high}]" if high is not None else f">= {low}"

    def parse(text: str) -> list[int]:
        out = []
        for i, item in enumerate(split_items(text, noun)):
            v = _int(item)
            if v is None:
                raise argparse.ArgumentTypeError(f"{text!r}: [{i}] = {item!r} is not {what} "
                                                 f"({noun} separated by commas or spaces)")
            if v < low or (high is not None and v > high):
                raise argparse.ArgumentTypeError(f"{text!r}: [{i}] = {v} is not {what} {bound}")
            out.append(v)
        return out
    parse.__name__ = noun
    return parse


def name_list(known: Iterable[str], *, noun: str, nouns: str | None = None,
              check: Callable[[str], str | None] | None = None) -> Callable[[str], list[str]]:
    """An argparse type: names from `known`, comma or space separated. check(name) replaces the
    membership test: it returns why a name is wrong, or None."""
    known = tuple(known)
    nouns = nouns or noun + "s"

    def parse(text: str) -> list[str]:
        out = []
        for item in split_items(text, nouns):
            why = check(item) if check is not None else (
                None if item in known else f"unknown {noun} {item!r} (known: {', '.join(known)})")
            if why:
                raise argparse.ArgumentTypeError(why)
            out.append(item)
        return out
    parse.__name__ = nouns
    return parse


def positive_float(unit: str) -> Callable[[str], float]:
    """An argparse type: a finite number > 0 (in `unit`)."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number ({unit})") from None
        if not math.isfinite(v) or v <= 0:
            raise argparse.ArgumentTypeError(f"{text} is not a positive number ({unit})")
        return v
    parse.__name__ = f"{unit} > 0"
    return parse


def nonempty_path(text: str) -> str:
    """An argparse type: a path, refused when empty (`-o ''`)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path")
    return text


def flatten(values) -> list:
    """[[a, b], [c]] -> [a, b, c]: an option with nargs="+" whose type returns a list."""
    return [v for group in values or [] for v in group]


class DeprecatedOption(argparse.Action):
    """An option's old spelling, kept for a while: stores into the new option's dest and warns
    once on stderr, naming the new spelling (and why it changed)."""

    def __init__(self, option_strings, dest, new: str = "", why: str = "", **kw):
        self.new, self.why = new, why
        kw.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        why = f" ({self.why})" if self.why else ""
        print(f"{parser.prog}: warning: {option_string} is deprecated{why}: use {self.new}",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def user_error_line(exc: BaseException) -> str:
    """One line naming what went wrong, for an error a user's input can cause. A library that
    cannot load is the exception: its whole reason (which file, why, how to install) is kept,
    indented lines included."""
    if isinstance(exc, PrefillError):
        text = f"{type(exc).__name__}: {exc}"
    elif isinstance(exc, OSError) and exc.filename is not None:   # a path: name it and why
        text = f"{exc.filename}: {exc.strerror or exc}"
    elif isinstance(exc, ImportError):
        text = str(exc).strip()
        return text if text.startswith("cannot load libprefill") else f"libprefill is not loadable: {text}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    lines = text.strip().splitlines() or [type(exc).__name__]
    return lines[0] + (" (...)" if len(lines) > 1 else "")


__all__ = ["int_in", "int_list", "name_list", "positive_float", "nonempty_path", "split_items",
           "flatten", "DeprecatedOption", "user_error_line", "INT32_MAX"]
