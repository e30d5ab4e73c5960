"""One paragraph of words for a plotly figure: what it plots and its numbers, read from the figure itself.

A chart in an iframe is a picture to a screen reader and to anyone who cannot make out its colours
(WCAG 1.1.1). The site prints this paragraph under each chart (`minimega.classroom.sitebuild`). It is
written from the figure object the chart is drawn from, so it says the same numbers the bars and lines show:

- a line or marker trace: its name, then every point (``x: y``) when it has at most `LIST` of them, else
  where it starts and ends and where it peaks;
- a vertical bar trace: its name, then ``category: value`` for each bar;
- a horizontal bar trace (a timeline): its name, then each bar as ``row: start–end``, or how many bars
  over which span;
- a text-only trace (labels over bars) repeats numbers already said, and is left out.
"""
from __future__ import annotations

import math

from minimega.figures.words import num

LIST = 6            # at most this many points are listed one by one; a longer series gets its ends and its peak

WORDS = {
    "en": {"against": "{y} against {x}", "from": "from {y0} at {x0} to {y1} at {x1}", "peak": "highest {y} at {x}",
           "bars": "{n} bars from {a} to {b}", "values": "{n} values", "series": "series {n}"},
    "nl": {"against": "{y} tegen {x}", "from": "van {y0} bij {x0} tot {y1} bij {x1}", "peak": "hoogst {y} bij {x}",
           "bars": "{n} balken van {a} tot {b}", "values": "{n} waarden", "series": "reeks {n}"},
}


def _n(value, lang: str) -> str:
    """A number as the chart's hover shows it (3 significant digits, the language's decimal mark); a category as is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if float(value).is_integer() and abs(value) < 1e6:
        return num(int(value), ",", lang) if abs(value) >= 1e4 else str(int(value))
    return num(value, ".3g", lang)


def _title(axis) -> str:
    return (axis.title.text or "").strip() if axis is not None and axis.title is not None else ""


def _trace(tr, k: int, lang: str) -> str | None:
    w = WORDS[lang]
    if getattr(tr, "visible", None) is False or getattr(tr, "mode", None) == "text":
        return None
    name = (tr.name or w["series"].format(n=k)).strip()
    xs = list(tr.x) if getattr(tr, "x", None) is not None else []
    ys = list(tr.y) if getattr(tr, "y", None) is not None else []
    if tr.type == "bar" and tr.orientation == "h":                       # a timeline: x is a length from base
        bases = list(tr.base) if isinstance(tr.base, (list, tuple)) else [tr.base or 0] * len(xs)
        spans = [(b, b + x) for b, x in zip(bases, xs) if x is not None]
        if not spans:
            return None
        if len(spans) <= LIST:
            return f"{name}: " + ", ".join(f"{_n(y, lang)} {_n(a, lang)}–{_n(b, lang)}" for y, (a, b) in zip(ys, spans))
        return f"{name}: " + w["bars"].format(n=len(spans), a=_n(min(a for a, _ in spans), lang),
                                              b=_n(max(b for _, b in spans), lang))
    pairs = [(x, y) for x, y in zip(xs, ys) if y is not None]
    if not pairs:
        return f"{name}: " + w["values"].format(n=len(xs) or len(ys))
    if len(pairs) <= LIST:
        return f"{name}: " + ", ".join(f"{_n(x, lang)}: {_n(y, lang)}" for x, y in pairs)
    (x0, y0), (x1, y1) = pairs[0], pairs[-1]
    xm, ym = max(pairs, key=lambda p: p[1])
    text = w["from"].format(y0=_n(y0, lang), x0=_n(x0, lang), y1=_n(y1, lang), x1=_n(x1, lang))
    if (xm, ym) not in (pairs[0], pairs[-1]):
        text += ", " + w["peak"].format(y=_n(ym, lang), x=_n(xm, lang))
    return f"{name}: {text}"


def summarize(fig, lang: str = "en") -> str:
    """The paragraph for `fig`: its title, its axes, then each trace's numbers (see the module docstring)."""
    if lang not in WORDS:
        raise ValueError(f"figure summary language {lang!r}: expected one of {', '.join(WORDS)}")
    title = ((fig.layout.meta or {}).get("title") if isinstance(fig.layout.meta, dict) else None) \
        or (fig.layout.title.text or "")
    x, y = _title(fig.layout.xaxis), _title(fig.layout.yaxis)
    head = [title.strip().rstrip(".")] if title else []
    if x and y:
        head.append(WORDS[lang]["against"].format(x=x, y=y))
    elif x or y:
        head.append(x or y)
    parts = [p for k, tr in enumerate(fig.data, 1) if (p := _trace(tr, k, lang))]
    return ". ".join(head + ["; ".join(parts)]).strip() + "."
