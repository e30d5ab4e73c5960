"""Teaching truth across banks and pages: a numeric item must accept every value the course prints for it.

A learner who reads "1.9 GB" on the ZeRO page and types 1.9 must not be marked wrong. For every numeric item of
the practice banks (quizzes/NN-*.yaml) and the exam banks (quizzes/exam/NN-*.yaml) this collects the values the
course shows for the same quantity and grades each one with the item's own tolerance:

* the item's `formula`, evaluated with minimega.estimate (as the site build does);
* the roundings its explanation prints: numbers followed by the item's unit, or introduced by "printed as",
  "rounded to", "≈", "about", that lie within 10% of the answer (the same quantity at another precision);
* every ``{{ num("expr", "fmt") }}`` on the chapter's page whose exact value is the item's value, as formatted.

An exam template (numbers drawn per attempt) is checked on a fixed sample of its draws, each instantiated as the
exam would: its computed answer, the rounding its explanation prints, and any page value it happens to equal.
"""
import math
import random
import re
from pathlib import Path

import pytest

from minimega.classroom import sitebuild
from minimega.classroom.quiz import draw_params, grade, instantiate, load_banks, round_sig, show

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "course"
BANKS = [("practice", b) for b in load_banks(ROOT / "quizzes")] + \
        [("exam", b) for b in load_banks(ROOT / "quizzes" / "exam")]
NUMERIC = [(kind, b, it) for kind, b in BANKS for it in b.items if it.type == "numeric"]

DRAWS = 40
"""Draws of each exam template checked (seeded: the same sample every run)."""
NUMBER = r"(\d{1,3}(?:[,\u2009]\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
LEAD = re.compile(r"(?:printed as|rounded to|rounds to|≈|about)\s*" + NUMBER)
NUM_CALL = re.compile(r'\{\{\s*num\(\s*"([^"]+)"\s*(?:,\s*"([^"]*)"\s*)?\)\s*\}\}')


def _parse(text: str) -> float:
    return float(text.replace(",", "").replace("\u2009", ""))


def _key(kind, bank, item) -> str:
    return f"{bank.chapter:02d}:{item.id}" if kind == "exam" else f"{bank.path.stem}:{item.id}"


def instances(item) -> list[tuple]:
    """(plain item, its value, the values its explanation prints for it).

    A plain item: its formula evaluated as the site build does, and the numbers of `explanation_values`. A
    template: a seeded sample of the plain items it becomes, each with the answer its formula gave for those
    numbers and the rounding its explanation prints in place of ``{answer}`` (its other numbers are parameters
    or cited examples, not this answer)."""
    if not item.parametric:
        return [(item, sitebuild.evaluate(item.formula) if item.formula else item.answer, explanation_values(item))]
    rng = random.Random(item.id)
    drawn = [instantiate(item, draw_params(item, rng)) for _ in range(DRAWS)]
    return [(one, one.answer, [float(show(round_sig(one.answer, one.sig)))] if "{answer}" in item.explain else [])
            for one in drawn]


def explanation_values(item) -> list[float]:
    """Numbers the explanation prints for the answer itself (see the module docstring)."""
    text = item.explain or " ".join(c.explain for c in item.choices)
    found = [_parse(m.group(1)) for m in LEAD.finditer(text)]
    if item.unit:
        unit = re.escape(item.unit)
        found += [_parse(m.group(1)) for m in re.finditer(NUMBER + r"\s*" + unit + r"(?![A-Za-z])", text)]
    ref = abs(item.answer)
    return [v for v in found if ref == 0 and v == 0 or ref and abs(v - ref) <= 0.1 * ref]


def _page(chapter: int) -> Path:
    pages = sorted(p for p in COURSE.glob(f"{chapter:02d}-*.md") if not p.name.endswith(".nl.md"))
    assert len(pages) == 1, (chapter, pages)
    return pages[0]


_PRINTED = {}


def page_values(chapter: int) -> list[tuple[float, str]]:
    """(exact value, printed text) of every num() macro on a chapter's page."""
    if chapter not in _PRINTED:
        out = []
        for expr, fmt in NUM_CALL.findall(_page(chapter).read_text()):
            value = sitebuild.evaluate(expr)
            out.append((value, sitebuild.format_number(value, fmt or None)))
        _PRINTED[chapter] = out
    return _PRINTED[chapter]


def _problems(kind, bank, item) -> list[str]:
    return [p for one, value, explained in instances(item) for p in _problems_of(bank, one, value, explained)]


def _problems_of(bank, item, value, explained) -> list[str]:
    bad = []
    if not grade(item, value).correct:
        bad.append(f"formula value {value!r} rejected")
    for v in explained:
        if not grade(item, v).correct:
            bad.append(f"explanation prints {v:g} {item.unit}, rejected")
    for exact, printed in page_values(bank.chapter):
        if math.isclose(exact, value, rel_tol=1e-9, abs_tol=1e-12):
            shown = _parse(printed[:-1]) / 100 if printed.endswith("%") else _parse(printed)   # ".0%": 0.2 as 20%
            if not grade(item, shown).correct:
                bad.append(f"page {_page(bank.chapter).name} prints {printed}, rejected")
    return bad


def test_there_are_numeric_items_in_both_kinds_of_bank():
    kinds = {kind for kind, _, _ in NUMERIC}
    assert kinds == {"practice", "exam"} and len(NUMERIC) >= 40


@pytest.mark.parametrize("kind,bank,item", NUMERIC, ids=[_key(k, b, it) for k, b, it in NUMERIC])
def test_accepted_range_holds_every_printed_value(kind, bank, item):
    bad = _problems(kind, bank, item)
    assert not bad, f"{kind} {_key(kind, bank, item)}: {bad}"


def test_the_printed_value_check_can_fail():
    """The check itself rejects the exam's 1% range around 1.875 when chapter 3 prints 1.9."""
    from minimega.classroom.quiz import Item
    item = Item(id="x", type="numeric", question="q", choices=(), answer=1.875, tolerance=0.01, unit="GB",
                explain="(2 + 2 + K)Ψ/N_d = 1.875 GB, printed as 1.9 in Figure 1.", formula=None)
    assert explanation_values(item) == [1.9, 1.875]
    assert any("1.9" in p for p in _problems("exam", next(b for k, b in BANKS if k == "exam" and b.chapter == 3),
                                             item))


PRECISION = re.compile(r"\b(exact(ly)?|integer|whole number|decimals?|significant|nearest|to the|percent)\b|%|±",
                       re.IGNORECASE)


@pytest.mark.parametrize("kind,bank,item", NUMERIC, ids=[_key(*n) for n in NUMERIC])
def test_numeric_questions_state_their_precision(kind, bank, item):
    """Every numeric question as shown (`Item.prompt`: the question, then the precision sentence) says how precise
    the answer must be, once: a practice question adds no rounding rule of its own (issue 28: chapter 3's Q3
    gave two)."""
    for one, _, _ in instances(item):
        assert PRECISION.search(one.prompt), f"{_key(kind, bank, item)}: say how precise the answer must be"
        if kind == "practice":
            assert not re.search(r"\((?:to )?(?:one|two|three|four|\d) decimals?\)|whole number\)", one.question), \
                f"{_key(kind, bank, item)}: a second rounding rule beside the precision sentence"


def test_chapter12_exam_templates_cover_the_former_fixed_item():
    """The old fixed item (30B parameters, 1e12 tokens, 512 GPUs at 150 TFLOP/s, full recomputation: 36 days)
    is one draw of the training-days template, worked by hand from 8TP/(nX)."""
    bank = next(b for k, b in BANKS if k == "exam" and b.chapter == 12)
    items = {it.id: it for it in bank.items}
    assert sum(it.parametric for it in bank.items) >= 2 and sum(it.type != "numeric" for it in bank.items) >= 4
    days = instantiate(items["training-days"], {"psi": 30, "tokens": 1000, "n": 512, "x": 150, "r": 1})
    assert days.answer == pytest.approx(8 * 1e12 * 30e9 / (512 * 150e12) / 86400)          # 36.17 days
    assert "with full activation recomputation" in days.question
    assert grade(days, 36.2).correct and grade(days, 36).correct and not grade(days, 27.1).correct   # 6TP/(nX)
