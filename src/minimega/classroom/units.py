"""Numeric answers typed with their unit: "31.4 GB", "31,4 GB" (a Dutch decimal comma), "12 %", "950ms".

A unit that matches the question's is accepted; a unit of the same kind that does not ("31.4 GiB" where GB is
asked, "0.9 s" where ms is) is refused by name, so the learner converts instead of losing the point to a unit
slip; anything else after the number is refused saying what the question asks for. Values are never converted:
the question states its unit, and reading the unit is part of the answer.
"""
from __future__ import annotations

import math
import re

KNOWN = {"b", "kb", "mb", "gb", "tb", "pb", "kib", "mib", "gib", "tib", "pib", "bytes",
         "ns", "us", "µs", "ms", "s", "sec", "min", "h", "hours", "days", "%", "percent",
         "flop/s", "gflop/s", "tflop/s", "pflop/s", "gb/s", "gib/s", "tb/s"}
"""Units a learner might type: a different one of these is named in the refusal."""
ALIASES = {"%": {"percent", "procent", "pct"}, "s": {"sec", "seconds", "seconden"}, "ms": {"milliseconds"},
           "days": {"day", "d"}, "dagen": {"dag", "d"}, "µs": {"us"}}
NUMBER = re.compile(r"\s*([-+]?(?:\d|[.,]\d)[\d.,\u202f\u2009]*(?:[eE][-+]?\d+)?)\s*(.*?)\s*")


class UnitError(ValueError):
    """The answer's unit does not match the question's; the message says which to use."""


def _norm(unit: str) -> str:
    return re.sub(r"\s+", " ", unit.strip().lower())


def matches(typed: str, unit: str) -> bool:
    t, u = _norm(typed), _norm(unit)
    return t == u or t in ALIASES.get(u, set()) or (u in KNOWN and t.replace(" ", "") == u.replace(" ", ""))


def parse(text: str, unit: str, lang: str = "en") -> float:
    """The number in `text`, checked against the question's `unit` (see the module); `UnitError` otherwise."""
    text = str(text)[:64]
    m = NUMBER.fullmatch(text)
    if not m:
        raise UnitError(f"not a number{' in ' + unit if unit else ''}: send the value, e.g. "
                        f"{'12,5' if lang == 'nl' else '12.5'}{' ' + unit if unit else ''}")
    digits, typed = re.sub(r"[\u202f\u2009 ]", "", m.group(1)), m.group(2)
    if digits.count(",") + digits.count(".") > 1:
        raise UnitError(f"{text!r}: write the number without thousands separators")
    digits = digits.replace(",", ".")              # one separator: the decimal point or a decimal comma
    try:
        value = float(digits)
    except ValueError:
        raise UnitError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise UnitError("not a finite number")
    if typed and not matches(typed, unit):
        asked = f"asks for {unit}" if unit else "asks for a plain number"
        if _norm(typed) in KNOWN or any(_norm(typed) in v for v in ALIASES.values()):
            raise UnitError(f"this question {asked}, not {typed}: convert the value, or send the number alone")
        raise UnitError(f"this question {asked}; {typed[:20]!r} is not that unit")
    return value
