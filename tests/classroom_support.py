"""Shared helpers for the classroom tests: a service on a temp folder, sign-in through the development
mailer, and the right (or a wrong) answer to each question of an attempt, read from its stored draw."""
from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from minimega.classroom.quiz import instantiate, load_banks
from minimega.classroom.settings import ClassroomConfig
from minimega.classroom.store import Store

ROOT = Path(__file__).resolve().parents[1]
BANKS = ROOT / "quizzes" / "exam"
W3C = Path(__file__).parent / "fixtures" / "vc-di-eddsa"
EXAMPLES_CONTEXT = {"https://www.w3.org/ns/credentials/examples/v2":
                    {"@context": {"@vocab": "https://www.w3.org/ns/credentials/examples#"}}}


def make_config(tmp: Path, **overrides) -> ClassroomConfig:
    cfg = ClassroomConfig(var_dir=tmp / "var", site_dir=tmp / "site", banks_dir=BANKS,
                          questions_per_chapter=1, ip_attempts_per_hour=10_000,
                          ip_requests_per_minute=100_000, ip_signins_per_hour=100_000, dev=True, allow_sample_bank=True,
                          min_attempt_s=0)
    return replace(cfg, **overrides)


_ITEMS = None
_UNIQUE = itertools.count()


def bank_item(question: dict):
    """The bank item behind a shown conceptual question (matched on chapter and text: tests only)."""
    global _ITEMS
    if _ITEMS is None:
        _ITEMS = {(b.chapter, it.question): it for b in load_banks(BANKS) for it in b.items}
    return _ITEMS[(question["chapter"], question["question"])]


def answer_key(store, attempt_id: str) -> dict[int, tuple[dict, dict]]:
    """number -> (a right response, a wrong response) in shown positions, from the attempt's stored draw.

    `store` is a `Store` or the path of the service's database (a server in another process)."""
    store = store if isinstance(store, Store) else Store(store)
    items = {(b.chapter, it.id): it for b in load_banks(BANKS) for it in b.items}
    out = {}
    for row in store.items(attempt_id):
        item = items[(row["chapter"], row["item_id"])]
        if item.parametric:
            item = instantiate(item, json.loads(row["params"]))
            out[row["number"]] = ({"value": item.answer}, {"value": item.answer * 3 + 1})
            continue
        if item.type == "numeric":
            out[row["number"]] = ({"value": item.answer}, {"value": item.answer * 3 + 1})
            continue
        order = json.loads(row["choice_order"])
        right = [s for s, i in enumerate(order) if item.choices[i].correct]
        wrong = [s for s, i in enumerate(order) if not item.choices[i].correct]
        out[row["number"]] = (({"choice": right[0]}, {"choice": wrong[0]}) if item.type == "single"
                              else ({"choices": right}, {"choices": wrong[:1]}))
    return out


def sign_in(client, email: str | None = None) -> dict:
    """Sign in through the development mailer; returns the Authorization header to send."""
    email = email or f"learner{next(_UNIQUE)}@example.org"
    r = client.post("/api/v1/signin", json={"email": email})
    assert r.status_code == 200, r.text
    token = r.json()["dev_link"].split("#signin=")[1]
    r = client.post("/api/v1/signin/confirm", json={"token": token})
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['session']}"}


def pass_exam(client, name: str = "Ada Lovelace", email: str | None = "ada@example.org", lang: str = "en") -> dict:
    """Sign in, take an attempt (in `lang`) through the API with every answer right; returns the finish response."""
    auth = sign_in(client, email)
    attempt = client.post("/api/v1/attempts", json={"display_name": name, "lang": lang}, headers=auth).json()
    key = answer_key(client.app.state.store, attempt["attempt_id"])
    for q in attempt["questions"]:
        r = client.post(f"/api/v1/attempts/{attempt['attempt_id']}/answers/{q['number']}",
                        json=key[q["number"]][0], headers=auth)
        assert r.status_code == 200 and r.json()["recorded"], r.text
    return client.post(f"/api/v1/attempts/{attempt['attempt_id']}/finish", headers=auth).json()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(app, port: int, **options):
    """Serve an ASGI app with uvicorn on a thread at 127.0.0.1:port until the block ends."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(timeout=10)
