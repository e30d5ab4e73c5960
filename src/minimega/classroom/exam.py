"""The graded exam: server-side banks, a stratified random draw, locked answers, a score.

Flow (each step one `Exam` method, each state change one SQLite transaction):

1. `start`: check the per-learner daily limit, draw `questions_per_chapter` items from every chapter
   bank, shuffle each item's options, store the draw; return the questions *without* any key.
2. `answer`: grade one question against the stored draw, store the answer (the row's primary key
   locks it: a second answer is refused), return the explanation of what was chosen at once.
3. `finish`: score once; at ``score >= pass_fraction * total`` issue the certificate.

Options are shown shuffled; the learner answers in shown positions and `choice_order` maps them back
to bank indices, so the same item never has its right answer at the same position twice in a row.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
import random
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from . import quiz
from .settings import ClassroomConfig
from .store import Conflict, Store

CHAPTERS = range(1, 13)


class ExamError(Exception):
    """Maps to an HTTP status: 404 unknown, 409 conflict, 410 expired, 422 bad input, 429 limit."""

    status = 400

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        if status is not None:
            self.status = status


def load_exam_banks(folder: str | Path, per_chapter: int) -> dict[int, quiz.Bank]:
    """Chapter -> bank; every chapter 1..11 must have a bank with at least `per_chapter` items."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ExamError(f"exam banks folder {folder} does not exist (expected quizzes/exam/NN-slug.yaml)")
    banks = {b.chapter: b for b in quiz.load_banks(folder)}
    missing = [c for c in CHAPTERS if c not in banks]
    if missing:
        raise ExamError(f"{folder}: no exam bank for chapters {missing}")
    small = {c: len(b.items) for c, b in banks.items() if len(b.items) < per_chapter}
    if small:
        raise ExamError(f"{folder}: banks with fewer than {per_chapter} items: {small}")
    return banks


@dataclass(frozen=True)
class Drawn:
    number: int
    chapter: int
    item: quiz.Item
    order: list[int]
    """order[shown position] = bank choice index."""


def draw(banks: dict[int, quiz.Bank], per_chapter: int, rng: random.Random) -> list[tuple[int, str, list[int]]]:
    """(chapter, item id, choice order) for every question, chapters in order, items at random."""
    out = []
    for chapter in sorted(banks):
        for item in rng.sample(list(banks[chapter].items), per_chapter):
            order = list(range(len(item.choices)))
            rng.shuffle(order)
            out.append((chapter, item.id, order))
    return out


def public_question(d: Drawn, bank: quiz.Bank) -> dict:
    """What the learner sees: text and shuffled options, never `correct` or `explain`."""
    return {"number": d.number, "chapter": d.chapter, "chapter_title": bank.title, "type": d.item.type,
            "question": d.item.question, "choices": [d.item.choices[i].text for i in d.order],
            "unit": d.item.unit or None}


def grade_shown(d: Drawn, payload: dict) -> quiz.Grade:
    """Grade a response given in shown positions: {"choice": i} | {"choices": [i, …]} | {"value": x}."""
    if d.item.type == "numeric":
        value = payload.get("value")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ExamError(f"question {d.number} is numeric: send {{\"value\": <number in {d.item.unit or 'the unit asked'}>}}", 422)
        return quiz.grade(d.item, value)
    n = len(d.order)
    if d.item.type == "single":
        shown = payload.get("choice")
        if not isinstance(shown, int) or isinstance(shown, bool) or not 0 <= shown < n:
            raise ExamError(f"question {d.number} takes one option: send {{\"choice\": 0..{n - 1}}}", 422)
        return quiz.grade(d.item, d.order[shown])
    shown = payload.get("choices")
    if (not isinstance(shown, list) or not shown or len(set(shown)) != len(shown)
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in shown)):
        raise ExamError(f"question {d.number} takes one or more options: send {{\"choices\": [distinct 0..{n - 1}]}}", 422)
    return quiz.grade(d.item, [d.order[i] for i in shown])


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")


def clean_name(name: str) -> str:
    """A display name as it will be signed: one line, no control or direction-override characters."""
    name = " ".join(_CONTROL.sub("", name or "").split())
    if not 1 <= len(name) <= 80:
        raise ExamError("display name: 1 to 80 visible characters", 422)
    return name


class Exam:
    def __init__(self, config: ClassroomConfig, store: Store, issuer, rng: random.Random | None = None,
                 clock=time.time, banks: dict[int, quiz.Bank] | None = None):
        self.config, self.store, self.issuer, self.clock = config, store, issuer, clock
        self.banks = banks or load_exam_banks(config.banks_dir, config.questions_per_chapter)
        self.rng = rng or random.SystemRandom()
        self._pepper = store.pepper()
        self._items = {(b.chapter, it.id): it for b in self.banks.values() for it in b.items}

    def _learner_key(self, name: str, email: str | None) -> str:
        ident = f"email:{email.strip().lower()}" if email else f"name:{name.casefold()}"
        return hmac.new(self._pepper, ident.encode("utf-8"), hashlib.sha256).hexdigest()

    def _drawn_row(self, row) -> Drawn:
        item = self._items.get((row["chapter"], row["item_id"]))
        if item is None:
            raise ExamError(f"question {row['number']} refers to item {row['item_id']!r}, "
                            "no longer in the bank", 409)
        return Drawn(row["number"], row["chapter"], item, json.loads(row["choice_order"]))

    def _drawn(self, attempt_id: str) -> list[Drawn]:
        return [self._drawn_row(row) for row in self.store.items(attempt_id)]

    def _open_attempt(self, attempt_id: str):
        row = self.store.attempt(attempt_id)
        if row is None:
            raise ExamError("unknown attempt", 404)
        return row

    def start(self, display_name: str, email: str | None, ip: str) -> dict:
        from .credential import email_identity

        name = clean_name(display_name)
        if email is not None:
            email = email.strip()
            if not re.fullmatch(r"[^@\s]{1,64}@[^@\s]{1,189}\.[^@\s]{1,63}", email):
                raise ExamError("email: not an address (or leave it out)", 422)
        now = self.clock()
        day = datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%d")
        key = self._learner_key(name, email)
        picks = draw(self.banks, self.config.questions_per_chapter, self.rng)
        try:
            attempt_id = self.store.create_attempt(
                learner_key=key, display_name=name, email_id=email_identity(email) if email else None,
                ip=ip, day=day, now=now, ttl_s=self.config.attempt_ttl_s, items=picks,
                per_day=self.config.attempts_per_day)
        except Conflict as err:
            raise ExamError(str(err), 429) from None
        return self.status(attempt_id, with_questions=True)

    def status(self, attempt_id: str, with_questions: bool = False) -> dict:
        row = self._open_attempt(attempt_id)
        drawn = self._drawn(attempt_id)
        answered = {a["number"]: bool(a["correct"]) for a in self.store.answers(attempt_id)}
        out = {
            "attempt_id": attempt_id, "display_name": row["display_name"],
            "expires_at": _iso(row["expires_at"]), "expired": self.clock() > row["expires_at"],
            "finished": row["finished_at"] is not None, "total": row["total"],
            "pass_mark": math.ceil(self.config.pass_fraction * row["total"]),
            "answered": sorted(answered),
            "attempts_left_today": max(0, self.config.attempts_per_day
                                       - self.store.attempts_today(row["learner_key"], row["day"])),
        }
        if with_questions:
            out["questions"] = [public_question(d, self.banks[d.chapter]) for d in drawn]
        return out

    def answer(self, attempt_id: str, number: int, payload: dict) -> dict:
        row = self._open_attempt(attempt_id)
        item_row = self.store.item(attempt_id, number) if 0 < number <= row["total"] else None
        if item_row is None:
            raise ExamError(f"this attempt has questions 1..{row['total']}, not {number}", 404)
        if row["finished_at"] is not None:
            raise ExamError("this attempt is finished; answers are locked", 409)
        if self.clock() > row["expires_at"]:
            raise ExamError("this attempt has expired; start a new one", 410)
        grade = grade_shown(self._drawn_row(item_row), payload)
        try:
            count = self.store.record_answer(attempt_id, number, payload, grade.correct, self.clock())
        except Conflict as err:
            raise ExamError(str(err), 410 if "expired" in str(err) else 409) from None
        return {"number": number, "correct": grade.correct, "feedback": list(grade.feedback),
                "answered": count, "total": row["total"]}

    def finish(self, attempt_id: str) -> dict:
        row = self._open_attempt(attempt_id)
        if row["finished_at"] is not None:
            if row["passed"] and self.store.credential_by_attempt(attempt_id) is None:
                return self._result(attempt_id, row["score"], row["total"], True)   # issuing was interrupted
            raise ExamError("this attempt is already finished", 409)
        if self.clock() > row["expires_at"]:
            raise ExamError("this attempt has expired; start a new one", 410)
        try:
            score, total, passed = self.store.finish_attempt(attempt_id, self.clock(), self.config.pass_fraction)
        except Conflict as err:
            raise ExamError(str(err), 410 if "expired" in str(err) else 409) from None
        return self._result(attempt_id, score, total, passed)

    def _result(self, attempt_id: str, score: int, total: int, passed: bool) -> dict:
        return {"score": score, "total": total, "percent": round(100 * score / total, 1),
                "passed": passed, "pass_mark": math.ceil(self.config.pass_fraction * total),
                "credential": self.issuer.issue(attempt_id) if passed else None}


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
