"""Teaching truth across banks and pages: a numeric item must accept every value the course prints for it.

A learner who reads "1.9 GB" on the ZeRO page and types 1.9 must not be marked wrong. For every numeric item of
the practice banks (quizzes/NN-*.yaml) and the exam banks (quizzes/exam/NN-*.yaml) this collects the values the
course shows for the same quantity and grades each one with the item's own tolerance:

* the item's `formula`, evaluated with minimega.estimate (as the site build does);
* the roundings its explanation prints: numbers followed by the item's unit, or introduced by "printed as",
  "rounded to", "≈", "about", that lie within 10% of the answer (the same quantity at another precision);
* every ``{{ num("expr", "fmt") }}`` on the chapter's page whose exact value is the item's value, as formatted.
"""
import math
import re
from pathlib import Path

import pytest

from minimega.classroom import sitebuild
from minimega.classroom.quiz import grade, load_banks

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "course"
BANKS = [("practice", b) for b in load_banks(ROOT / "quizzes")] + \
        [("exam", b) for b in load_banks(ROOT / "quizzes" / "exam")]
NUMERIC = [(kind, b, it) for kind, b in BANKS for it in b.items if it.type == "numeric"]

# Exam items that fail a check below; the exam banks have their own owner, so a failure there is reported and
# listed here rather than fixed in this file. Only these may fail; any other failure is an error.
KNOWN_EXAM_RANGE = {"03:zero3-7b5-dp64"}   # 1.875 GB ± 1% rejects the 1.9 GB that chapter 3 and Figure 1 print
NUMBER = r"(\d{1,3}(?:[,\u2009]\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
LEAD = re.compile(r"(?:printed as|rounded to|rounds to|≈|about)\s*" + NUMBER)
NUM_CALL = re.compile(r'\{\{\s*num\(\s*"([^"]+)"\s*(?:,\s*"([^"]*)"\s*)?\)\s*\}\}')


def _parse(text: str) -> float:
    return float(text.replace(",", "").replace("\u2009", ""))


def _key(kind, bank, item) -> str:
    return f"{bank.chapter:02d}:{item.id}" if kind == "exam" else f"{bank.path.stem}:{item.id}"


def _value(item) -> float:
    return sitebuild.evaluate(item.formula) if item.formula else item.answer


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
    pages = sorted(COURSE.glob(f"{chapter:02d}-*.md"))
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
    value = _value(item)
    bad = []
    if not grade(item, value).correct:
        bad.append(f"formula value {value!r} rejected")
    for v in explanation_values(item):
        if not grade(item, v).correct:
            bad.append(f"explanation prints {v:g} {item.unit}, rejected")
    for exact, printed in page_values(bank.chapter):
        if math.isclose(exact, value, rel_tol=1e-9, abs_tol=1e-12):
            shown = _parse(printed.replace("%", ""))
            if not grade(item, shown).correct:
                bad.append(f"page {_page(bank.chapter).name} prints {printed}, rejected")
    return bad


def test_there_are_numeric_items_in_both_kinds_of_bank():
    kinds = {kind for kind, _, _ in NUMERIC}
    assert kinds == {"practice", "exam"} and len(NUMERIC) >= 40


@pytest.mark.parametrize("kind,bank,item", NUMERIC, ids=[_key(k, b, it) for k, b, it in NUMERIC])
def test_accepted_range_holds_every_printed_value(kind, bank, item):
    bad = _problems(kind, bank, item)
    key = _key(kind, bank, item)
    if kind == "exam" and key in KNOWN_EXAM_RANGE:
        if bad:
            pytest.xfail(f"reported exam item {key}: {bad}")
        return
    assert not bad, f"{kind} {key}: {bad}"


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


@pytest.mark.parametrize("kind,bank,item", [n for n in NUMERIC if n[0] == "practice" or n[1].chapter == 12],
                         ids=[_key(*n) for n in NUMERIC if n[0] == "practice" or n[1].chapter == 12])
def test_numeric_questions_state_their_precision(kind, bank, item):
    assert PRECISION.search(item.question), f"{_key(kind, bank, item)}: say how precise the answer must be"


# The chapter-12 exam items, recomputed with minimega.estimate (the exam schema carries no formula).
EXAM12 = {"hardware-flops-iteration": "achieved_flops_per_gpu(megatron_hardware_flops(512, 2048, 24, 2048, 51200), 2.5, 64)"
                                      " / 1e12",
          "budget-days": "training_seconds(1e12, 30e9, 512, 150e12) / 86400",
          "spares-share": "100 * (416 - 384) / 384"}


def test_chapter12_exam_items_recomputed_with_estimate():
    bank = next(b for k, b in BANKS if k == "exam" and b.chapter == 12)
    items = {it.id: it for it in bank.items}
    assert len(bank.items) >= 6 and set(EXAM12) <= set(items)
    for item_id, expr in EXAM12.items():
        value = sitebuild.evaluate(expr)
        assert grade(items[item_id], value).correct, (item_id, value, items[item_id].answer)
        assert abs(value - items[item_id].answer) <= items[item_id].tolerance * abs(value), item_id
