"""argparse as the `minimega` command uses it: how it refuses bad input and how its help reads.

- A value a flag refuses (``--steps 0``, ``--tp -1``, ``--steps x``) is one line naming the flag and what to
  give instead; the usage block is for a flag nobody knows (``--stpes``), and then it is the sub-command's
  usage (``minimega train …``), not only the top-level one.
- Help texts are built partly from docstrings, which quote names reStructuredText-style (````--custom````); the
  help shows them plainly.
"""
from __future__ import annotations

import argparse
import math
import re


class PlainHelp(argparse.HelpFormatter):
    """Help without reStructuredText's double backticks: ````name```` reads as `name`."""

    def _format_text(self, text):
        return super()._format_text(_plain(text))

    def _expand_help(self, action):
        return _plain(super()._expand_help(action))


def _plain(text: str) -> str:
    return re.sub(r"``(.+?)``", r"`\1`", text, flags=re.S) if text else text


class Parser(argparse.ArgumentParser):
    """An ArgumentParser (and, by inheritance, each of its sub-command parsers) that refuses bad input well."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", PlainHelp)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        if message.startswith("argument "):          # a known flag, a bad value: one line, no usage block
            flag = message[len("argument "):].split(":", 1)[0]
            detail = message.split(":", 1)[1].strip() if ":" in message else message
            self.exit(2, f"{self.prog}: error: {flag}: {detail}\n")
        super().error(message)                        # usage of this parser, then the message

    def parse_args(self, args=None, namespace=None):
        """Unknown flags are reported by the sub-command they were given to, with its usage."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.chosen(namespace).error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace

    def chosen(self, namespace: argparse.Namespace) -> "Parser":
        """The innermost sub-command parser `namespace` was parsed by (self if there are none)."""
        parser = self
        while True:
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            name = getattr(namespace, subs[0].dest, None) if subs else None
            if name is None or name not in subs[0].choices:
                return parser
            parser = subs[0].choices[name]


# --- argparse types: each names what it wants, argparse adds the flag ------------------------------------------

def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _int_at_least(text, 1)


def nonnegative_int(text: str) -> int:
    """An integer >= 0."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give an integer >= {low}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} is too small; give an integer >= {low}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    return _number(text, lambda v: v > 0, "a finite number > 0")


def nonnegative_float(text: str) -> float:
    """A finite number >= 0."""
    return _number(text, lambda v: v >= 0, "a finite number >= 0")


_SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def count(text: str) -> float:
    """A positive count, plain (``7e9``) or with a suffix: ``125M``, ``7B``, ``1.5T``, ``300k``."""
    stripped = text.strip()
    scale = _SUFFIXES.get(stripped[-1:].lower(), 1.0) if stripped and stripped[-1].isalpha() else 1.0
    body = stripped[:-1] if scale != 1.0 else stripped
    try:
        value = float(body) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count; give a number such as 7e9, 7B, 125M or 1.5T") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} is not allowed; give a count > 0 (e.g. 7B)")
    return value


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    return _number(text, lambda v: 0 < v <= 1, "a number in (0, 1]")


def _number(text: str, ok, want: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give {want}") from None
    if not (math.isfinite(value) and ok(value)):
        raise argparse.ArgumentTypeError(f"{text} is not allowed; give {want}")
    return value


def flag_names(message: str, fields: dict[str, str]) -> str:
    """`message` with each ``Owner.field`` it mentions replaced by the flag that sets that field.

    Config classes validate themselves and name their fields (``TrainConfig.tp must be …``); on the
    command line the learner typed ``--tp``, so that is the name they need to see.
    """
    for field, flag in fields.items():
        message = re.sub(rf"\b\w+Config\.{field}\b|\bParallelDims: {field}\b", flag, message)
    return message
