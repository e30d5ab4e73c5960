"""Which sections of the course the quiz banks ask about: each item's ``covers`` against the chapters' headings.

A chapter page's sections are its ``## Title { #anchor }`` headings; a ``### Title { #anchor }`` heading is a
subsection of the ``##`` above it, so an item that covers ``fp8`` also covers chapter 4's ``notation``. Sections
that hold no teaching of their own are exempt (`EXEMPT`: the quiz, the lab, the worked problems, and the picture,
which animates what another section teaches).

The rules (`problems`), checked on the repository's banks by ``tests/test_coverage.py`` and, for the exam rules, on
a private bank by ``minimega exam check-bank``:

- every item names at least one anchor, and every anchor it names is a heading of its chapter's page;
- every section of every chapter has at least one practice item (``practice=True``);
- every chapter of the exam's blueprint (`banks.CHAPTERS`) has at least `MIN_EXAM_ITEMS` exam items.

`coverage_map` prints the map: per chapter, each section and the items that ask about it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from . import quiz

EXEMPT = frozenset({"quiz", "lab", "worked-problems", "picture"})
MIN_EXAM_ITEMS = 3
COURSE = Path(__file__).resolve().parents[3] / "course"
"""The course pages (present in a source checkout)."""
_HEADING = re.compile(r"^(##|###) +(.+?) *\{ *#([a-z0-9][a-z0-9-]*)[^}]*\} *$")


@dataclass(frozen=True)
class Section:
    anchor: str
    title: str
    parent: str
    """The ``##`` section this heading belongs to (itself for a ``##`` heading)."""


def chapter_pages(course: Path = COURSE) -> dict[int, Path]:
    """Chapter number -> its English page (``course/NN-slug.md``)."""
    return {int(p.name[:2]): p for p in sorted(Path(course).glob("[0-9][0-9]-*.md")) if not p.name.endswith(".nl.md")}


def page_sections(page: Path) -> list[Section]:
    """Every ``##`` and ``###`` heading with an anchor, in page order (fenced code skipped)."""
    out, parent, fenced = [], None, False
    for line in Path(page).read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = None if fenced else _HEADING.match(line)
        if m:
            level, title, anchor = m.groups()
            parent = anchor if level == "##" else parent
            out.append(Section(anchor, title, parent or anchor))
    return out


def required(sections: list[Section]) -> list[str]:
    """The ``##`` sections a practice item must ask about."""
    return [s.anchor for s in sections if s.anchor == s.parent and s.anchor not in EXEMPT]


def covered(bank: quiz.Bank, sections: list[Section]) -> dict[str, list[str]]:
    """``##`` anchor -> ids of the bank's items that cover it or one of its subsections."""
    parent = {s.anchor: s.parent for s in sections}
    out: dict[str, list[str]] = {}
    for item in bank.items:
        for anchor in dict.fromkeys(parent.get(a, a) for a in item.covers):
            out.setdefault(anchor, []).append(item.id)
    return out


def item_problems(bank: quiz.Bank, sections: list[Section], kind: str) -> list[str]:
    """Items without ``covers`` or naming an anchor the chapter's page does not have."""
    known, out = {s.anchor for s in sections}, []
    for item in bank.items:
        if not item.covers:
            out.append(f"{kind} chapter {bank.chapter} {item.id}: no 'covers' (the page's heading anchors it asks about)")
        elif bad := [a for a in item.covers if a not in known]:
            out.append(f"{kind} chapter {bank.chapter} {item.id}: covers {bad}, not headings of chapter "
                       f"{bank.chapter}'s page (it has {sorted(known)})")
    return out


def problems(practice: list[quiz.Bank], exam: list[quiz.Bank], chapters, course: Path = COURSE) -> list[str]:
    """Every rule above that the banks break, one line each (empty: covered)."""
    pages = chapter_pages(course)
    out = []
    for kind, banks in (("practice", practice), ("exam", exam)):
        for bank in banks:
            if bank.chapter in pages:
                out += item_problems(bank, page_sections(pages[bank.chapter]), kind)
    for bank in practice:
        if bank.chapter in pages:
            sections = page_sections(pages[bank.chapter])
            have = covered(bank, sections)
            if missing := [a for a in required(sections) if a not in have]:
                out.append(f"chapter {bank.chapter}: no practice item asks about sections {missing}")
    counts = {b.chapter: len(b.items) for b in exam}
    for c in chapters:
        if counts.get(c, 0) < MIN_EXAM_ITEMS:
            out.append(f"chapter {c}: {counts.get(c, 0)} exam items, the blueprint needs at least {MIN_EXAM_ITEMS}")
    return out


def coverage_map(practice: list[quiz.Bank], exam: list[quiz.Bank], course: Path = COURSE) -> str:
    """Per chapter and section: how many practice and exam items ask about it, and which."""
    pages, lines = chapter_pages(course), []
    ex = {b.chapter: b for b in exam}
    for bank in sorted(practice, key=lambda b: b.chapter):
        if bank.chapter not in pages:
            continue
        sections = page_sections(pages[bank.chapter])
        have, have_ex = covered(bank, sections), covered(ex[bank.chapter], sections) if bank.chapter in ex else {}
        lines.append(f"chapter {bank.chapter} ({pages[bank.chapter].stem}): "
                     f"{len(bank.items)} practice, {len(ex[bank.chapter].items) if bank.chapter in ex else 0} exam")
        for anchor in required(sections):
            p, e = have.get(anchor, []), have_ex.get(anchor, [])
            lines.append(f"  #{anchor:<18} practice {len(p):>2} exam {len(e):>2}  {', '.join(p + e)}"[:160])
    return "\n".join(lines)
