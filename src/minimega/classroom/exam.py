"""The graded exam: sign-in by email link, a stratified random draw of parametric and conceptual items,
answers recorded and locked without feedback, a score, then a review.

Flow (each step one `Exam` method, each state change one database transaction):

0. `request_signin` mails a one-time link; `redeem_signin` turns it into a session token. The learner
   is the keyed hash of that verified email: attempts, the daily limit and the cooldown after a fail
   are all keyed on it, so nobody can spend someone else's attempts by typing their name or address.
1. `start`: resume the learner's open attempt, or check the limits and draw a new one: from every
   chapter bank `questions_per_chapter` items, at least half of them parametric templates
   (`quiz.instantiate` with values drawn from a per-attempt seed, stored with the draw so grading
   is reproducible), options shuffled; return the questions *without* any key.
2. `answer`: validate, grade and store one answer (the row's primary key locks it: a second answer
   is refused); the reply says only that it was recorded.
3. `finish`: score once; at ``score >= pass_fraction * total`` issue the certificate.
4. `review`: once finished (or expired), every item of that attempt with the learner's answer and whether it was
   right; a numeric item's worked value (its numbers were drawn for this attempt alone), a choice item's idea
   (`idea`) but never its key nor per-option explanations: a choice item is reused across attempts, so a review
   that named its key would hand it to every later attempt (the harvest attack, tests/test_exam_harvest.py).

Options are shown shuffled; the learner answers in shown positions and `choice_order` maps them back
to bank indices.

Languages: an attempt is started in one of `quiz.LANGUAGES` that has exam banks (``lang``, kept with
the attempt). The draw always runs on the English banks and a translation carries the English
structure (`quiz.merge_twin`), so the same seed draws the same items, numbers and option order in
every language, and an answer is graded identically; only the words served, the review and the
certificate's human-readable text follow the attempt's language.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
import random
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from . import quiz, units
from .settings import ClassroomConfig
from .banks import CHAPTERS, SAMPLE_BANKS, load_exam_banks, load_translations  # noqa: F401  (re-exported)
from .errors import ExamError
from .pepper import load_pepper
from .identity import clean_email, clean_name, learner_key  # noqa: F401  (re-exported)
from .store import Conflict, OpenAttempt, Store

def split_bank(bank: quiz.Bank) -> tuple[list[quiz.Item], list[quiz.Item]]:
    """(parametric templates, fixed items) of a bank."""
    return [it for it in bank.items if it.parametric], [it for it in bank.items if not it.parametric]


def chapter_plan(bank: quiz.Bank, per_chapter: int) -> tuple[int, int]:
    """(parametric, fixed) items drawn from this bank: as many templates as half the draw, rounded up."""
    templates, fixed = split_bank(bank)
    n_par = min(len(templates), max(math.ceil(per_chapter / 2), per_chapter - len(fixed)))
    return n_par, per_chapter - n_par


@dataclass(frozen=True)
class Drawn:
    number: int
    chapter: int
    item: quiz.Item
    """Instantiated: a parametric template already carries its drawn numbers and computed answer."""
    order: list[int]
    """order[shown position] = bank choice index."""
    params: dict | None = None


def draw(banks: dict[int, quiz.Bank], per_chapter: int, rng: random.Random) -> list[tuple]:
    """(chapter, item id, choice order, params) for every question, chapters in order, items at random."""
    out = []
    for chapter in sorted(banks):
        templates, fixed = split_bank(banks[chapter])
        n_par, n_fixed = chapter_plan(banks[chapter], per_chapter)
        picks = rng.sample(templates, n_par) + rng.sample(fixed, n_fixed)
        rng.shuffle(picks)
        for item in picks:
            order = list(range(len(item.choices)))
            rng.shuffle(order)
            out.append((chapter, item.id, order, quiz.draw_params(item, rng) if item.parametric else None))
    return out


def idea(item: quiz.Item, bank: quiz.Bank, lang: str = "en") -> str:
    """What a choice item's review explains: the item's own ``explain`` (the idea it tests, written not to name
    the key; `checkbank` refuses one that quotes it), else a pointer to its chapter."""
    if item.explain:
        return item.explain
    if lang == "nl":
        return f"Deze vraag toetst hoofdstuk {bank.chapter}, {bank.title}: lees dat nog eens na."
    return f"This question tests chapter {bank.chapter}, {bank.title}: revisit it."


def public_question(d: Drawn, bank: quiz.Bank) -> dict:
    """What the learner sees: text and shuffled options, never `correct` or `explain`."""
    return {"number": d.number, "chapter": d.chapter, "chapter_title": bank.title, "type": d.item.type,
            "question": d.item.prompt, "choices": [d.item.choices[i].text for i in d.order],
            "unit": d.item.unit or None}


def check_response(d: Drawn, payload: dict) -> None:
    """Refuse a response of the wrong shape: {"choice": i} | {"choices": [i, …]} | {"value": x}."""
    if d.item.type == "numeric":
        value = payload.get("value")
        if isinstance(value, str) and set(payload) == {"value"}:        # "31.4 GB": the unit must match
            try:
                payload["value"] = units.parse(value, d.item.unit, d.item.lang)
            except units.UnitError as err:
                raise ExamError(f"question {d.number}: {err}", 422) from None
            return
        if (set(payload) != {"value"} or not isinstance(value, (int, float)) or isinstance(value, bool)
                or not math.isfinite(value)):
            raise ExamError(f"question {d.number} is numeric: send {{\"value\": <number in "
                            f"{d.item.unit or 'the unit asked'}>}}", 422)
        return
    n = len(d.order)
    if d.item.type == "single":
        shown = payload.get("choice")
        if set(payload) != {"choice"} or not isinstance(shown, int) or isinstance(shown, bool) or not 0 <= shown < n:
            raise ExamError(f"question {d.number} takes one option: send {{\"choice\": 0..{n - 1}}}", 422)
        return
    shown = payload.get("choices")
    if (set(payload) != {"choices"} or not isinstance(shown, list) or not shown or len(set(shown)) != len(shown)
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in shown)):
        raise ExamError(f"question {d.number} takes one or more options: send {{\"choices\": [distinct 0..{n - 1}]}}", 422)


def grade_shown(d: Drawn, payload: dict) -> quiz.Grade:
    """Grade a response given in shown positions (after `check_response`)."""
    check_response(d, payload)
    if d.item.type == "numeric":
        return quiz.grade(d.item, payload["value"])
    if d.item.type == "single":
        return quiz.grade(d.item, d.order[payload["choice"]])
    return quiz.grade(d.item, [d.order[i] for i in payload["choices"]])


def rules_text(config: ClassroomConfig, n_chapters: int, lang: str = "en") -> str:
    """The exam's rules in one paragraph, from the configuration (the page and GET /api/v1/exam)."""
    k = config.questions_per_chapter
    total = n_chapters * k
    pass_mark = math.ceil(config.pass_fraction * total - 1e-9)
    cooldown = config.fail_cooldown_s / 3600
    if lang == "nl":
        cool = (f"na een mislukte poging gaat de volgende {cooldown:g} uur later open" if config.fail_cooldown_s
                else "na een mislukte poging hoef je niet te wachten")
        return (f"{total} vragen, {k} uit elk van de {n_chapters} hoofdstukken, minstens de helft met getallen "
                f"die alleen voor jouw poging getrokken zijn. Met {pass_mark} goede antwoorden "
                f"({config.pass_fraction:.0%}) ben je geslaagd en krijg je een verifieerbaar certificaat. Elk "
                f"antwoord wordt vastgelegd en vergrendeld zodra je het opslaat; of het goed was, de uitgewerkte "
                f"waarden en de uitleg krijg je in de nabespreking nadat je klaar bent. Log in met je e-mailadres: "
                f"{config.attempts_per_day} pogingen per UTC-dag, {cool}; een poging blijft "
                f"{config.attempt_ttl_s / 3600:g} uur open, en als je de pagina herlaadt, ga je verder waar je was."
                + (f" Inleveren kan pas {_minutes(config.min_attempt_s, 'nl')} na de start." if config.min_attempt_s else ""))
    cool = (f"after a failed attempt the next one opens {cooldown:g} hour{'s' if cooldown != 1 else ''} later"
            if config.fail_cooldown_s else "there is no wait after a failed attempt")
    return (f"{total} questions, {k} from each of the {n_chapters} chapters, at least half of them with numbers "
            f"drawn for your attempt alone. {pass_mark} correct answers ({config.pass_fraction:.0%}) pass and earn "
            f"a verifiable certificate. Each answer is recorded and locked when you save it; whether it was right, "
            f"the worked values and the explanations come in the review after you finish. Sign in with your "
            f"email: {config.attempts_per_day} attempts per UTC day, {cool}; an attempt stays open "
            f"{config.attempt_ttl_s / 3600:g} hours, and reloading the page resumes it."
            + (f" An attempt can be finished no sooner than {_minutes(config.min_attempt_s, 'en')} after it starts."
               if config.min_attempt_s else ""))


def _minutes(seconds: float, lang: str) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        n = int(seconds // 60)
        return f"{n} minu{'ut' if n == 1 else 'ten'}" if lang == "nl" else f"{n} minute{'s' if n != 1 else ''}"
    return f"{seconds:g} seconde{'n' if seconds != 1 else ''}" if lang == "nl" else f"{seconds:g} s"


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("ascii", "replace")).hexdigest()


class Exam:
    def __init__(self, config: ClassroomConfig, store: Store, issuer, rng: random.Random | None = None,
                 clock=time.time, banks: dict[int, quiz.Bank] | None = None, mailer=None,
                 translations: dict[str, dict[int, quiz.Bank]] | None = None, pepper: bytes | None = None):
        self.config, self.store, self.issuer, self.clock = config, store, issuer, clock
        folder = config.banks_dir or SAMPLE_BANKS
        self.banks = banks or load_exam_banks(folder, config.questions_per_chapter)
        if translations is None:
            translations = {} if banks else load_translations(folder, config.questions_per_chapter)
        self.banks_by_lang = {"en": self.banks, **translations}
        """Language -> chapter -> bank; every language has the English banks' structure."""
        for lang, banks_l in translations.items():
            if sorted(banks_l) != sorted(self.banks):
                raise ExamError(f"the {lang} exam banks cover chapters {sorted(banks_l)}, the English {sorted(self.banks)}")
        self.rng = rng or random.SystemRandom()
        self.mailer = mailer
        self._pepper = pepper if pepper is not None else load_pepper(config.keys_path, store)
        self._items = {lang: {(b.chapter, it.id): it for b in bs.values() for it in b.items}
                       for lang, bs in self.banks_by_lang.items()}

    @property
    def languages(self) -> list[str]:
        """The languages an attempt can be taken in."""
        return [lang for lang in quiz.LANGUAGES if lang in self.banks_by_lang]

    # --- identity ------------------------------------------------------------------------------

    def learner_key(self, email: str) -> str:
        return learner_key(self._pepper, email)

    def request_signin(self, email: str, next_path: str = "/exam/", lang: str = "en") -> dict:
        """Mail a one-time sign-in link, in `lang`. In development (`config.dev`) the reply carries the link too.

        A Dutch mail links to the Dutch exam page (``/nl/exam/``) when the service serves one (the built
        site's, or the bare page when no site is built), so the attempt the learner then starts is in Dutch too."""
        from .credential import email_identity

        email = clean_email(email)
        token = secrets.token_urlsafe(32)
        now = self.clock()
        try:
            self.store.create_signin(token_hash=_hash(token), learner_key=self.learner_key(email),
                                     email_id=email_identity(email), now=now, ttl_s=self.config.signin_ttl_s,
                                     per_hour=self.config.signins_per_hour)
        except Conflict as err:
            raise ExamError(str(err), 429) from None
        minutes = int(self.config.signin_ttl_s // 60)
        if lang == "nl":
            localized = f"/nl{next_path}"
            if not self.config.has_site:                    # the service's bare exam page, in every exam language
                next_path = localized if next_path == "/exam/" and "nl" in self.languages else next_path
            elif (Path(self.config.site_dir) / localized.strip("/") / "index.html").is_file():
                next_path = localized
            link = f"{self.config.base_url}{next_path}#signin={token}"
            self.mailer.send(email, "Je aanmeldlink voor het minimega-examen",
                             f"Open deze link om je aan te melden voor het minimega-examen (hij werkt één keer, "
                             f"{minutes} minuten lang):\n\n{link}\n\nHeb je er niet om gevraagd? Dan kun je deze mail "
                             "negeren.")
            out = {"sent": True, "expires_in_s": int(self.config.signin_ttl_s)}
            return out | ({"dev_link": link} if self.config.dev else {})
        link = f"{self.config.base_url}{next_path}#signin={token}"
        self.mailer.send(email, "Your minimega exam sign-in link",
                         f"Open this link to sign in to the minimega exam (it works once, for {minutes} minutes):\n\n"
                         f"{link}\n\nIf you did not ask for it, ignore this mail.")
        out = {"sent": True, "expires_in_s": int(self.config.signin_ttl_s)}
        if self.config.dev:
            out["dev_link"] = link
        return out

    def redeem_signin(self, token: str) -> dict:
        session = secrets.token_urlsafe(32)
        try:
            self.store.redeem_signin(token_hash=_hash(token), session_hash=_hash(session), now=self.clock(),
                                     session_ttl_s=self.config.session_ttl_s)
        except Conflict as err:
            raise ExamError(str(err), 401) from None
        return {"session": session, "expires_in_s": int(self.config.session_ttl_s)}

    def learner(self, session: str | None):
        """The session's row; 401 when missing or expired."""
        row = self.store.session(_hash(session), self.clock()) if session else None
        if row is None:
            raise ExamError("not signed in (or the session expired): ask for a sign-in link", 401)
        return row

    def sign_out(self, session: str) -> None:
        self.store.end_session(_hash(session))

    def me(self, session: str) -> dict:
        who = self.learner(session)
        key, now = who["learner_key"], self.clock()
        day = datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%d")
        open_row = self.store.open_attempt(key, now)
        last = self.store.last_attempt(key)
        until = self.store.cooldown_until(key, self.config.fail_cooldown_s)
        return {"attempts_left_today": max(0, self.config.attempts_per_day - self.store.attempts_today(key, day)),
                "attempts_per_day": self.config.attempts_per_day,
                "cooldown_until": _iso(until) if until and until > now else None,
                "open_attempt": open_row["id"] if open_row else None,
                "last_attempt": last["id"] if last else None,
                "credentials": [{**self.issuer.links(r["code"]), "issued_at": _iso(r["issued_at"]),
                                 "revoked": r["revoked_at"] is not None} for r in self.store.credentials_of(key)]}

    # --- attempts ------------------------------------------------------------------------------

    def _drawn_row(self, row, lang: str = "en") -> Drawn:
        item = self._items[lang].get((row["chapter"], row["item_id"]))
        if item is None:
            raise ExamError(f"question {row['number']} refers to item {row['item_id']!r}, "
                            "no longer in the bank", 409)
        params = json.loads(row["params"]) if row["params"] else None
        if item.parametric:
            if params is None:
                raise ExamError(f"question {row['number']}: item {row['item_id']!r} became parametric", 409)
            try:
                item = quiz.instantiate(item, params)
            except (KeyError, ValueError) as err:
                raise ExamError(f"question {row['number']}: the bank changed under this attempt ({err})", 409) from None
        return Drawn(row["number"], row["chapter"], item, json.loads(row["choice_order"]), params)

    def _lang(self, row) -> str:
        """The attempt's language; 409 if this service no longer has its banks."""
        lang = row["lang"] or "en"
        if lang not in self.banks_by_lang:
            raise ExamError(f"this attempt was taken in {lang!r}, which this service no longer offers", 409)
        return lang

    def _drawn(self, attempt_id: str, lang: str = "en") -> list[Drawn]:
        return [self._drawn_row(row, lang) for row in self.store.items(attempt_id)]

    def _own_attempt(self, attempt_id: str, session: str | None):
        who = self.learner(session)
        row = self.store.attempt(attempt_id)
        if row is None or not hmac.compare_digest(row["learner_key"], who["learner_key"]):
            raise ExamError("unknown attempt", 404)         # another learner's attempt is not even confirmed
        return row

    def start(self, session: str | None, display_name: str, ip: str, lang: str = "en") -> dict:
        """Resume the open attempt (in the language it was started in), or start a new one in `lang`
        within the limits."""
        who = self.learner(session)
        name = clean_name(display_name)
        if lang not in self.banks_by_lang:
            raise ExamError(f"lang {str(lang)[:20]!r}: this exam is offered in {self.languages}", 422)
        now = self.clock()
        if (row := self.store.open_attempt(who["learner_key"], now)) is not None:
            return self.status(row["id"], session, with_questions=True) | {"resumed": True}
        day = datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%d")
        seed = self.rng.getrandbits(64)
        picks = draw(self.banks, self.config.questions_per_chapter, random.Random(seed))
        try:
            attempt_id = self.store.create_attempt(
                learner_key=who["learner_key"], display_name=name, email_id=json.loads(who["email_id"]),
                ip=ip, day=day, now=now, ttl_s=self.config.attempt_ttl_s, items=picks,
                per_day=self.config.attempts_per_day, cooldown_s=self.config.fail_cooldown_s,
                seed=f"{seed:016x}", lang=lang)
        except OpenAttempt as err:          # started a moment ago by another request (another instance?)
            return self.status(err.attempt_id, session, with_questions=True) | {"resumed": True}
        except Conflict as err:
            raise ExamError(str(err), 429) from None
        return self.status(attempt_id, session, with_questions=True) | {"resumed": False}

    def status(self, attempt_id: str, session: str | None, with_questions: bool = False) -> dict:
        row = self._own_attempt(attempt_id, session)
        lang = self._lang(row)
        answers = self.store.answers(attempt_id)
        out = {
            "attempt_id": attempt_id, "display_name": row["display_name"], "lang": lang,
            "expires_at": _iso(row["expires_at"]), "expired": self.clock() > row["expires_at"],
            "finished": row["finished_at"] is not None, "total": row["total"],
            "pass_mark": math.ceil(self.config.pass_fraction * row["total"] - 1e-9),
            "answered": [a["number"] for a in answers],
            "responses": {str(a["number"]): json.loads(a["response"]) for a in answers},
            "attempts_left_today": max(0, self.config.attempts_per_day
                                       - self.store.attempts_today(row["learner_key"], row["day"])),
        }
        if with_questions:
            out["questions"] = [public_question(d, self.banks_by_lang[lang][d.chapter])
                                for d in self._drawn(attempt_id, lang)]
        return out

    def answer(self, attempt_id: str, number: int, payload: dict, session: str | None) -> dict:
        row = self._own_attempt(attempt_id, session)
        item_row = self.store.item(attempt_id, number) if 0 < number <= row["total"] else None
        if item_row is None:
            raise ExamError(f"this attempt has questions 1..{row['total']}, not {number}", 404)
        if row["finished_at"] is not None:
            raise ExamError("this attempt is finished; answers are locked", 409)
        if self.clock() > row["expires_at"]:
            raise ExamError("this attempt has expired; start a new one", 410)
        grade = grade_shown(self._drawn_row(item_row, self._lang(row)), payload)
        try:
            count = self.store.record_answer(attempt_id, number, payload, grade.correct, self.clock())
        except Conflict as err:
            raise ExamError(str(err), 410 if "expired" in str(err) else 409) from None
        return {"number": number, "recorded": True, "answered": count, "total": row["total"]}

    def finish(self, attempt_id: str, session: str | None) -> dict:
        row = self._own_attempt(attempt_id, session)
        if row["finished_at"] is not None:
            if row["passed"] and self.store.credential_by_attempt(attempt_id) is None:
                return self._result(attempt_id, row["score"], row["total"], True)   # issuing was interrupted
            raise ExamError("this attempt is already finished", 409)
        if self.clock() > row["expires_at"]:
            raise ExamError("this attempt has expired; start a new one", 410)
        early = row["created_at"] + self.config.min_attempt_s - self.clock()
        if early > 0:
            err = ExamError(f"an attempt cannot be finished within {self.config.min_attempt_s:g} s of its start: "
                            f"retry in {int(early) + 1} s (your answers are kept)", 429)
            err.retry_after = int(early) + 1
            raise err
        try:
            score, total, passed = self.store.finish_attempt(attempt_id, self.clock(), self.config.pass_fraction)
        except Conflict as err:
            raise ExamError(str(err), 410 if "expired" in str(err) else 409) from None
        return self._result(attempt_id, score, total, passed)

    def _result(self, attempt_id: str, score: int, total: int, passed: bool) -> dict:
        return {"score": score, "total": total, "percent": round(100 * score / total, 1),
                "passed": passed, "pass_mark": math.ceil(self.config.pass_fraction * total - 1e-9),
                "credential": self.issuer.issue(attempt_id) if passed else None}

    def review(self, attempt_id: str, session: str | None) -> dict:
        """After the attempt ends: every question with the answer given and whether it was right; numeric items
        with their worked value, choice items with the idea they test (no key)."""
        row = self._own_attempt(attempt_id, session)
        if row["finished_at"] is None and self.clock() <= row["expires_at"]:
            raise ExamError("the review opens when this attempt is finished", 409)
        lang = self._lang(row)
        given = {a["number"]: a for a in self.store.answers(attempt_id)}
        items = []
        for d in self._drawn(attempt_id, lang):
            q = public_question(d, self.banks_by_lang[lang][d.chapter])
            a = given.get(d.number)
            entry = {**q, "response": json.loads(a["response"]) if a else None,
                     "correct": bool(a["correct"]) if a else False}
            if d.item.type == "numeric":
                entry |= {"answer": quiz.round_sig(d.item.answer, d.item.sig), "sig": d.item.sig,
                          "explain": d.item.explain, "key": None, "explains": []}
            else:                       # right or wrong and the idea, never which option is the key
                entry |= {"answer": None, "key": None, "explains": [],
                          "explain": idea(d.item, self.banks_by_lang[lang][d.chapter], lang)}
            items.append(entry)
        return {"attempt_id": attempt_id, "lang": lang, "score": row["score"], "total": row["total"],
                "passed": bool(row["passed"]), "finished": row["finished_at"] is not None, "items": items}


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
