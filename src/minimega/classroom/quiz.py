"""Quiz banks: one YAML schema for the site's practice quizzes, the labs' widgets and the graded exam.

A bank is one file per chapter::

    chapter: 3
    title: ZeRO stages 1, 2 and 3
    items:
      - id: zero-stage-saves-most          # unique within the bank, stable (progress is keyed on it)
        type: single                        # single | multiple | numeric
        question: Which ZeRO stage ...?
        choices:
          - {text: Stage 3, correct: true, explain: Parameters are sharded too, so ...}
          - {text: Stage 1, correct: false, explain: Only optimizer states are sharded, so ...}
      - id: zero-fig1-stage2
        type: numeric
        question: With Psi = 7.5B and Nd = 64, how many GB per GPU under stage 2?
        answer: 16.6
        tolerance: 0.01                     # relative
        unit: GB
        explain: 2Psi + (2 + 12)Psi/Nd = ...
        formula: "model_state_bytes(7.5e9, 64, 2) / 1e9"   # optional; tests recompute it with minimega.estimate

Every choice carries an ``explain`` (why that option is right or wrong, in words), so feedback never
reduces to a colour.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ITEM_TYPES = ("single", "multiple", "numeric")


class QuizError(ValueError):
    """A bank that does not follow the schema; the message names the file and the item."""


@dataclass(frozen=True, kw_only=True)
class Choice:
    text: str
    correct: bool
    explain: str


@dataclass(frozen=True, kw_only=True)
class Item:
    id: str
    type: str
    question: str
    choices: tuple[Choice, ...] = ()
    answer: float | None = None
    tolerance: float = 0.0
    """Relative tolerance for numeric items: |given - answer| <= tolerance * |answer|."""
    unit: str = ""
    explain: str = ""
    formula: str | None = None


@dataclass(frozen=True, kw_only=True)
class Bank:
    chapter: int
    title: str
    items: tuple[Item, ...]
    path: Path | None = None


@dataclass(frozen=True)
class Grade:
    correct: bool
    feedback: tuple[str, ...] = field(default_factory=tuple)
    """Explanations for what was chosen (choice items) or the worked answer (numeric items)."""


def _item(raw: dict, where: str) -> Item:
    if not isinstance(raw, dict):
        raise QuizError(f"{where}: an item must be a mapping, got {type(raw).__name__}")
    for key in ("id", "type", "question"):
        if not raw.get(key):
            raise QuizError(f"{where}: missing '{key}'")
    where = f"{where} (id {raw['id']!r})"
    kind = raw["type"]
    if kind not in ITEM_TYPES:
        raise QuizError(f"{where}: type {kind!r} is not one of {ITEM_TYPES}")
    known = {"id", "type", "question", "choices", "answer", "tolerance", "unit", "explain", "formula"}
    if unknown := set(raw) - known:
        raise QuizError(f"{where}: unknown keys {sorted(unknown)}")
    if kind == "numeric":
        if not isinstance(raw.get("answer"), (int, float)) or not math.isfinite(raw["answer"]):
            raise QuizError(f"{where}: a numeric item needs a finite 'answer'")
        if not raw.get("explain"):
            raise QuizError(f"{where}: a numeric item needs an 'explain'")
        tol = raw.get("tolerance", 0.0)
        if not isinstance(tol, (int, float)) or not 0 <= tol < 1:
            raise QuizError(f"{where}: 'tolerance' is relative and must lie in [0, 1), got {tol!r}")
        if raw.get("choices"):
            raise QuizError(f"{where}: a numeric item has no 'choices'")
        return Item(id=str(raw["id"]), type=kind, question=raw["question"], answer=float(raw["answer"]),
                    tolerance=float(tol), unit=str(raw.get("unit", "")), explain=raw["explain"],
                    formula=raw.get("formula"))
    choices = raw.get("choices") or []
    if len(choices) < 2:
        raise QuizError(f"{where}: a {kind} item needs at least 2 choices")
    parsed = []
    for j, c in enumerate(choices):
        if not isinstance(c, dict) or set(c) != {"text", "correct", "explain"}:
            raise QuizError(f"{where}, choice {j}: needs exactly 'text', 'correct' and 'explain'")
        if not isinstance(c["correct"], bool) or not str(c["explain"]).strip():
            raise QuizError(f"{where}, choice {j}: 'correct' must be true/false and 'explain' non-empty")
        parsed.append(Choice(text=str(c["text"]), correct=c["correct"], explain=str(c["explain"])))
    n_correct = sum(c.correct for c in parsed)
    if kind == "single" and n_correct != 1:
        raise QuizError(f"{where}: a single-choice item needs exactly 1 correct choice, has {n_correct}")
    if kind == "multiple" and n_correct < 1:
        raise QuizError(f"{where}: a multiple-choice item needs at least 1 correct choice")
    if len({c.text for c in parsed}) != len(parsed):
        raise QuizError(f"{where}: two choices have the same text")
    return Item(id=str(raw["id"]), type=kind, question=raw["question"], choices=tuple(parsed),
                explain=str(raw.get("explain", "")), formula=raw.get("formula"))


def load_bank(path: str | Path) -> Bank:
    """Load and validate one bank; raises `QuizError` naming the file and item on any schema fault."""
    path = Path(path)
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(raw, dict) or "items" not in raw or "chapter" not in raw:
        raise QuizError(f"{path}: a bank needs 'chapter', 'title' and 'items'")
    items = tuple(_item(r, f"{path}, item {i}") for i, r in enumerate(raw["items"]))
    ids = [it.id for it in items]
    if dupes := sorted({i for i in ids if ids.count(i) > 1}):
        raise QuizError(f"{path}: duplicate item ids {dupes}")
    return Bank(chapter=int(raw["chapter"]), title=str(raw.get("title", "")), items=items, path=path)


def load_banks(folder: str | Path) -> list[Bank]:
    """All `*.yaml` banks directly in `folder`, sorted by chapter."""
    banks = [load_bank(p) for p in sorted(Path(folder).glob("*.yaml"))]
    return sorted(banks, key=lambda b: b.chapter)


def grade(item: Item, response) -> Grade:
    """Grade one response.

    Args:
        item: the question.
        response: a choice index (single), an iterable of indices (multiple) or a number (numeric).
    """
    if item.type == "numeric":
        try:
            value = float(response)
        except (TypeError, ValueError):
            return Grade(False, (f"Expected a number in {item.unit or 'the asked unit'}.",))
        ok = math.isfinite(value) and abs(value - item.answer) <= item.tolerance * abs(item.answer) + 1e-12
        return Grade(ok, (item.explain,))
    picked = {response} if item.type == "single" else set(response)
    if not picked or any(not isinstance(i, int) or not 0 <= i < len(item.choices) for i in picked):
        return Grade(False, (f"Pick {'one' if item.type == 'single' else 'one or more'} of the "
                             f"{len(item.choices)} options.",))
    right = {i for i, c in enumerate(item.choices) if c.correct}
    return Grade(picked == right, tuple(item.choices[i].explain for i in sorted(picked)))
