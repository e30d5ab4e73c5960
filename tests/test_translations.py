"""Dutch twins of the quiz and exam banks, the exam taken in Dutch and its certificate.

The oracle is the English bank: a twin must repeat its structure exactly (`quiz.merge_twin`), grade
every response the English item grades the same way, and a Dutch attempt must draw, grade and
certify exactly as an English one with the same seed, only in other words.
"""
import itertools
import json
import random
import re
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from classroom_support import BANKS, answer_key, make_config, sign_in
from minimega.classroom import credential
from minimega.classroom.banks import CHAPTERS
from minimega.classroom.certificate import unbake_svg
from minimega.classroom.quiz import (QuizError, draw_params, grade, instantiate, load_bank, load_banks,
                                     round_sig, twin_path)
from minimega.classroom.service import create_app

ROOT = Path(__file__).resolve().parents[1]
QUIZZES = ROOT / "quizzes"
ENGLISH = sorted(QUIZZES.glob("*.yaml")) + sorted((QUIZZES / "exam").glob("*.yaml"))


# --- every bank has a Dutch twin with the English structure ------------------------------------

@pytest.mark.parametrize("path", ENGLISH, ids=lambda p: str(p.relative_to(QUIZZES)))
def test_every_bank_has_a_dutch_twin_with_the_english_structure(path):
    twin = twin_path(path, "nl")
    assert twin.is_file(), f"{path.relative_to(ROOT)} has no Dutch twin: write {twin.relative_to(ROOT)}"
    en, nl = load_bank(path), load_bank(path, "nl")      # load_bank("nl") raises naming any id or key that differs
    assert nl.path == twin and nl.chapter == en.chapter and [i.id for i in nl.items] == [i.id for i in en.items]
    raw = {r["id"]: r for r in yaml.safe_load(twin.read_text(encoding="utf-8"))["items"]}
    for e, n in zip(en.items, nl.items):
        assert (n.type, n.answer, n.tolerance, n.sig, n.params, n.formula) == \
               (e.type, e.answer, e.tolerance, e.sig, e.params, e.formula), e.id
        assert [c.correct for c in n.choices] == [c.correct for c in e.choices], e.id
        assert n.lang == "nl" and n.question == raw[e.id]["question"], e.id          # the words are the twin's
        assert n.question != e.question, f"{twin.name}: item {e.id!r} still has the English question"
        untranslated = [c.explain for c, d in zip(n.choices, e.choices) if c.explain == d.explain]
        assert not untranslated, f"{twin.name}: item {e.id!r} keeps English explanations {untranslated}"


def test_no_dutch_bank_without_an_english_one():
    english = {p.relative_to(QUIZZES) for p in ENGLISH}
    dutch = {Path(*p.relative_to(QUIZZES / "nl").parts) for p in (QUIZZES / "nl").rglob("*.yaml")}
    assert dutch == english, f"only Dutch: {sorted(map(str, dutch - english))}"


EN = """
chapter: 1
title: Memory
items:
  - id: states
    type: single
    question: Which holds the most bytes?
    choices:
      - {text: Optimizer states, correct: true, explain: 12 bytes per parameter.}
      - {text: Parameters, correct: false, explain: 2 bytes per parameter.}
  - id: zero-gb
    type: numeric
    params: {psi: [1, 2, 4], nd: [8, 16]}
    given: {how: "'large' if psi > 2 else 'small'", n2: "nd * 2"}
    question: A {how} model of {psi}B parameters on {nd} GPUs ({n2} halves)?
    formula: model_state_bytes(psi * 1e9, nd, 3) / GB
    tolerance: 0.01
    unit: GB
    explain: 16 × {psi}e9 / {nd} = {answer} GB.
"""
NL = """
chapter: 1
title: Geheugen
items:
  - id: states
    type: single
    question: Wat neemt de meeste bytes in?
    choices:
      - {text: Optimizer states, correct: true, explain: 12 bytes per parameter.}
      - {text: Parameters, correct: false, explain: 2 bytes per parameter.}
  - id: zero-gb
    type: numeric
    params: {psi: [1, 2, 4], nd: [8, 16]}
    given: {how: "'groot' if psi > 2 else 'klein'", n2: "nd * 2"}
    question: Een {how} model van {psi}B parameters op {nd} GPU's ({n2} helften)?
    formula: model_state_bytes(psi * 1e9, nd, 3) / GB
    tolerance: 0.01
    unit: GB
    explain: 16 × {psi}e9 / {nd} = {answer} GB.
"""


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.replace("  - id: states", "  - id: toestanden"), r"no translation of items \['states'\]"),
    (lambda s: s.replace("Parameters, correct: false", "Parameters, correct: true"), r"id 'states'\), choice 1: keys or 'correct'"),
    (lambda s: s.replace("nd, 3) / GB", "nd, 2) / GB"), r"id 'zero-gb'\): 'formula' is"),
    (lambda s: s.replace("nd: [8, 16]", "nd: [8, 32]"), r"id 'zero-gb'\): 'params' is"),
    (lambda s: s.replace("tolerance: 0.01", "tolerance: 0.05"), r"id 'zero-gb'\): 'tolerance' is"),
    (lambda s: s.replace("= {answer} GB", "= ? GB"), r"'explain' has placeholders \['nd', 'psi'\], the English has \['answer'"),
    (lambda s: s.replace('n2: "nd * 2"', 'n2: "nd * 3"'), r"given 'n2' differs from the English in more than its words"),
    (lambda s: s.replace("chapter: 1", "chapter: 2"), "chapter 2, the English bank has 1"),
    (lambda s: s.replace("    unit: GB\n", ""), r"id 'zero-gb'\): keys"),
])
def test_a_twin_cannot_change_a_key(tmp_path, edit, message):
    (tmp_path / "nl").mkdir()
    (tmp_path / "01-memory.yaml").write_text(EN)
    (tmp_path / "nl" / "01-memory.yaml").write_text(NL)
    bank = load_bank(tmp_path / "01-memory.yaml", "nl")         # the pair as written loads
    assert bank.title == "Geheugen" and bank.items[1].given["how"].startswith("'groot'")
    (tmp_path / "nl" / "01-memory.yaml").write_text(edit(NL))
    with pytest.raises(QuizError, match=message):
        load_bank(tmp_path / "01-memory.yaml", "nl")


def test_twin_paths_and_unknown_languages(tmp_path):
    assert twin_path(QUIZZES / "03-zero.yaml", "nl") == QUIZZES / "nl" / "03-zero.yaml"
    assert twin_path(QUIZZES / "exam" / "03-zero.yaml", "nl") == QUIZZES / "nl" / "exam" / "03-zero.yaml"
    with pytest.raises(QuizError, match="language 'fr' is not one of"):
        load_bank(QUIZZES / "03-zero.yaml", "fr")
    (tmp_path / "01-memory.yaml").write_text(EN)
    with pytest.raises(QuizError, match="no such bank"):
        load_bank(tmp_path / "01-memory.yaml", "nl")


# --- grading is the same in both languages -----------------------------------------------------

def _responses(item):
    """Responses worth grading: every option subset (choice items); for numeric items the exact value,
    the value rounded to `sig` figures, just inside and just outside the tolerance, and a wrong one."""
    if item.type == "single":
        return list(range(len(item.choices)))
    if item.type == "multiple":
        idx = range(len(item.choices))
        return [list(c) for k in range(1, len(item.choices) + 1) for c in itertools.combinations(idx, k)]
    a, tol = item.answer, item.tolerance
    return [a, round_sig(a, item.sig), a * (1 + 0.9 * tol), a * (1 + 1.1 * tol + 1e-6), a * 3 + 1, "n/a"]


def test_dutch_grading_equals_english_grading():
    rng = random.Random(20)
    graded = 0
    for path in ENGLISH:
        en, nl = load_bank(path), load_bank(path, "nl")
        for e, n in zip(en.items, nl.items):
            for _ in range(5 if e.parametric else 1):
                values = draw_params(e, rng) if e.parametric else None
                ie, inl = (instantiate(e, values), instantiate(n, values)) if values else (e, n)
                assert inl.answer == ie.answer, e.id
                if inl.type == "numeric":
                    assert "significante cijfers" in inl.prompt or "exact" in inl.prompt, e.id
                for response in _responses(ie):
                    assert grade(inl, response).correct == grade(ie, response).correct, (path.name, e.id, response)
                    graded += 1
    assert graded > 2000, graded


# --- the exam in Dutch: served, graded and certified ------------------------------------------

@pytest.fixture()
def client(tmp_path):
    app = create_app(make_config(tmp_path, attempts_per_day=5, fail_cooldown_s=0))
    with TestClient(app) as c:
        yield c


def _start(client, auth, lang, seed):
    client.app.state.exam.rng = random.Random(seed)              # the same draw in both languages
    r = client.post("/api/v1/attempts", json={"display_name": "Annie M. G. Schmidt", "lang": lang}, headers=auth)
    assert r.status_code == 201, r.text
    return r.json()


def _finish_right(client, auth, attempt):
    aid = attempt["attempt_id"]
    key = answer_key(client.app.state.store, aid)               # the key from the English banks
    for q in attempt["questions"]:
        r = client.post(f"/api/v1/attempts/{aid}/answers/{q['number']}", json=key[q["number"]][0], headers=auth)
        assert r.status_code == 200, r.text
    return client.post(f"/api/v1/attempts/{aid}/finish", headers=auth).json()


def test_an_attempt_in_dutch_is_served_graded_and_certified_in_dutch(client):
    store = client.app.state.store
    en_auth, nl_auth = sign_in(client), sign_in(client)
    en, nl = _start(client, en_auth, "en", 7), _start(client, nl_auth, "nl", 7)
    assert (en["lang"], nl["lang"]) == ("en", "nl")
    rows = [[tuple(r)[2:] for r in store.items(a["attempt_id"])] for a in (en, nl)]
    assert rows[0] == rows[1]                                     # same items, option orders and numbers
    dutch = {(b.chapter, it.id): it for b in load_banks(BANKS, "nl") for it in b.items}
    for q_en, q_nl, row in zip(en["questions"], nl["questions"], store.items(nl["attempt_id"])):
        assert q_nl["question"] != q_en["question"] and q_nl["type"] == q_en["type"]
        item = dutch[(row["chapter"], row["item_id"])]
        if item.parametric:
            item = instantiate(item, json.loads(row["params"]))
        assert q_nl["question"] == item.prompt and q_nl["chapter_title"] == dutch_title(row["chapter"])
        assert q_nl["choices"] == [item.choices[i].text for i in json.loads(row["choice_order"])]
    # a resumed attempt keeps its language, whatever the page asks for now
    assert _start(client, nl_auth, "en", 8)["lang"] == "nl"

    fin_en, fin_nl = _finish_right(client, en_auth, en), _finish_right(client, nl_auth, nl)
    assert fin_nl["passed"] and (fin_nl["score"], fin_nl["total"]) == (fin_en["score"], fin_en["total"])
    review = client.get(f"/api/v1/attempts/{nl['attempt_id']}/review", headers=nl_auth).json()
    assert review["lang"] == "nl" and all(i["correct"] for i in review["items"])
    numeric = next(i for i in review["items"] if i["type"] == "numeric")
    assert "significante cijfers" in numeric["question"]

    docs = {lang: client.get(f"/api/v1/credentials/{fin['credential']['code']}").json()
            for lang, fin in (("en", fin_en), ("nl", fin_nl))}
    did = client.get("/.well-known/did.json").json()
    trusted = {m["publicKeyMultibase"] for m in did["verificationMethod"]}
    for lang, doc in docs.items():
        status = client.get(doc["credentialStatus"]["statusListCredential"].replace("http://127.0.0.1:8000", "")).json()
        result = credential.verify(doc, trusted_keys=trusted, status_list_credential=status)
        assert result.valid, (lang, result.errors)
    a_en, a_nl = (docs[k]["credentialSubject"]["achievement"] for k in ("en", "nl"))
    assert (a_en["inLanguage"], a_nl["inLanguage"]) == ("en", "nl")
    assert a_nl["name"] == docs["nl"]["name"] == "minimega: frontiermodellen trainen over veel GPU's"
    assert "Geslaagd voor het beoordeelde examen" in a_nl["description"]
    assert f"hoofdstukken 1-{max(CHAPTERS)}" in a_nl["criteria"]["narrative"]
    human = {"name", "description", "criteria", "inLanguage"}
    assert {k: v for k, v in a_nl.items() if k not in human} == {k: v for k, v in a_en.items() if k not in human}
    assert docs["nl"]["type"] == docs["en"]["type"] and docs["nl"]["issuer"] == docs["en"]["issuer"]

    code = fin_nl["credential"]["code"]
    page = client.get(f"/certificates/{code}").text
    assert '<html lang="nl">' in page and "Hierbij wordt verklaard dat" in page and "Verificatiecode" in page
    assert "This certifies" not in page and "frontiermodellen" in page
    svg = client.get(f"/certificates/{code}.svg").text
    assert "CERTIFICAAT" in svg and "Cursusversie" in svg and unbake_svg(svg) == docs["nl"]
    english_page = client.get(f"/certificates/{fin_en['credential']['code']}").text
    assert '<html lang="en">' in english_page and "This certifies that" in english_page


def dutch_title(chapter):
    return next(b.title for b in load_banks(BANKS, "nl") if b.chapter == chapter)


def test_a_dutch_sign_in_mail_links_to_the_dutch_exam_page(client, tmp_path):
    r = client.post("/api/v1/signin", json={"email": "jan@example.org", "lang": "nl"})
    to, subject, body = client.app.state.mailer.outbox[-1]
    assert to == "jan@example.org" and subject == "Je aanmeldlink voor het minimega-examen"
    assert "minuten lang" in body and r.json()["dev_link"] in body
    assert r.json()["dev_link"].startswith("http://127.0.0.1:8000/nl/exam/#signin=")   # no site: the bare Dutch page
    dutch = lambda: client.post("/api/v1/signin", json={"email": "jan@example.org", "lang": "nl"}).json()["dev_link"]
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("<html lang=en></html>")
    assert dutch().startswith("http://127.0.0.1:8000/exam/#signin=")      # a site built without a Dutch exam page
    (tmp_path / "site" / "nl" / "exam").mkdir(parents=True)
    (tmp_path / "site" / "nl" / "exam" / "index.html").write_text("<html lang=nl></html>")
    assert dutch().startswith("http://127.0.0.1:8000/nl/exam/#signin=")
    english = client.post("/api/v1/signin", json={"email": "jan@example.org"}).json()["dev_link"]
    assert english.startswith("http://127.0.0.1:8000/exam/#signin=")
    assert client.app.state.mailer.outbox[-1][1] == "Your minimega exam sign-in link"


def test_exam_languages_are_refused_by_name(client):
    auth = sign_in(client)
    r = client.post("/api/v1/attempts", json={"display_name": "Jan", "lang": "fr"}, headers=auth)
    assert r.status_code == 422 and "lang" in r.json()["detail"]
    info = client.get("/api/v1/exam", params={"lang": "nl"}).json()
    assert info["languages"] == ["en", "nl"] and re.search(r"^\d+ vragen, \d+ uit elk", info["rules"])
    assert info["chapters"]["3"] == "ZeRO-stages 1, 2 en 3"
    assert client.get("/api/v1/exam", params={"lang": "xx"}).status_code == 422
    en, nl = (client.get("/achievements/0.1.0", params={"lang": lang}).json() for lang in ("en", "nl"))
    assert (en["inLanguage"], nl["inLanguage"]) == ("en", "nl") and en["id"] == nl["id"] and en["name"] != nl["name"]


def test_a_service_without_dutch_banks_refuses_dutch_and_a_half_translation_refuses_to_start(tmp_path):
    import shutil

    from minimega.classroom.exam import ExamError
    banks = tmp_path / "quizzes" / "exam"
    shutil.copytree(BANKS, banks)
    app = create_app(make_config(tmp_path, banks_dir=banks))
    with TestClient(app) as c:
        r = c.post("/api/v1/attempts", json={"display_name": "Jan", "lang": "nl"}, headers=sign_in(c))
        assert r.status_code == 422 and "offered in ['en']" in r.json()["detail"]
    (tmp_path / "quizzes" / "nl").mkdir()
    shutil.copytree(QUIZZES / "nl" / "exam", tmp_path / "quizzes" / "nl" / "exam")
    (tmp_path / "quizzes" / "nl" / "exam" / "05-offload.yaml").unlink()
    with pytest.raises((QuizError, ExamError), match="nl/exam/05-offload.yaml: no such bank"):
        create_app(make_config(tmp_path / "b", banks_dir=banks))
