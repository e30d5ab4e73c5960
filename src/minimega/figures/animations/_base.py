"""What every animation shares: words in both languages, frames, meters, the page's number format."""
from __future__ import annotations

from minimega.figures.words import num

LANGS = ("en", "nl")


def _w(en: str, nl: str) -> dict[str, str]:
    return {"en": en, "nl": nl}


def words(fn) -> dict[str, str]:
    """`fn(lang)` for each language: captions that format numbers in the page's language."""
    return {lang: fn(lang) for lang in LANGS}


def size(b: float, lang: str) -> str:
    """Bytes in decimal units (kB, MB, GB, TB), three significant figures, in `lang`'s number format."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= scale:
            return f"{num(b / scale, '.3g', lang)} {unit}"
    return f"{num(b, ',.0f', lang)} B"


def bytes_meter(b: float) -> dict:
    """A frame's meter for bytes: the value (read by tests and the bar) and its words."""
    return {"value": float(b), "text": words(lambda lang: size(b, lang))}


def meter(value: float, fmt: str, unit: str = "") -> dict:
    return {"value": float(value), "text": words(lambda lang: num(value, fmt, lang) + unit)}


def frame(cells, caption, active=(), meter=None, **extra) -> dict:
    return {"cells": cells, "caption": caption, "active": [list(a) for a in active], "meter": meter, **extra}


def cell(state: str, text: str = "") -> dict:
    return {"s": state, "t": text}


def localize(anim, lang: str):
    """The animation with every {en, nl} word table replaced by `lang`'s words."""
    if isinstance(anim, dict):
        if set(anim) == set(LANGS):
            return anim[lang]
        return {k: localize(v, lang) for k, v in anim.items()}
    if isinstance(anim, list):
        return [localize(v, lang) for v in anim]
    return anim
