"""Shared helpers for the classroom tests: a service on a temp folder, the right answer to a shown question."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from minimega.classroom.quiz import load_banks
from minimega.classroom.settings import ClassroomConfig

ROOT = Path(__file__).resolve().parents[1]
BANKS = ROOT / "quizzes" / "exam"
W3C = Path(__file__).parent / "fixtures" / "vc-di-eddsa"
EXAMPLES_CONTEXT = {"https://www.w3.org/ns/credentials/examples/v2":
                    {"@context": {"@vocab": "https://www.w3.org/ns/credentials/examples#"}}}


def make_config(tmp: Path, **overrides) -> ClassroomConfig:
    cfg = ClassroomConfig(var_dir=tmp / "var", site_dir=tmp / "site", banks_dir=BANKS,
                          questions_per_chapter=1, ip_attempts_per_hour=10_000,
                          ip_requests_per_minute=100_000)
    return replace(cfg, **overrides)


_ITEMS = None


def bank_item(question: dict):
    """The bank item behind a shown question (matched on chapter and text: tests only)."""
    global _ITEMS
    if _ITEMS is None:
        _ITEMS = {(b.chapter, it.question): it for b in load_banks(BANKS) for it in b.items}
    return _ITEMS[(question["chapter"], question["question"])]


def right_answer(question: dict) -> dict:
    item = bank_item(question)
    if item.type == "numeric":
        return {"value": item.answer}
    shown = [question["choices"].index(c.text) for c in item.choices if c.correct]
    return {"choice": shown[0]} if item.type == "single" else {"choices": shown}


def wrong_answer(question: dict) -> dict:
    item = bank_item(question)
    if item.type == "numeric":
        return {"value": item.answer * 3 + 1}
    wrong = [question["choices"].index(c.text) for c in item.choices if not c.correct]
    return {"choice": wrong[0]} if item.type == "single" else {"choices": wrong[:1]}


def pass_exam(client, name: str = "Ada Lovelace", email: str | None = "ada@example.org") -> dict:
    """Take an attempt through the API with every answer right; returns the finish response."""
    body = {"display_name": name} | ({"email": email} if email else {})
    attempt = client.post("/api/v1/attempts", json=body).json()
    for q in attempt["questions"]:
        r = client.post(f"/api/v1/attempts/{attempt['attempt_id']}/answers/{q['number']}", json=right_answer(q))
        assert r.status_code == 200 and r.json()["correct"], r.text
    return client.post(f"/api/v1/attempts/{attempt['attempt_id']}/finish").json()
