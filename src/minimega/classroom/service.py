"""The exam service: the built site at ``/``, the exam UI at ``/exam/``, the API under ``/api/v1``.

    POST /api/v1/attempts                          start: {display_name, email?} -> questions, no key
    GET  /api/v1/attempts/{id}                     progress
    POST /api/v1/attempts/{id}/answers/{number}    {choice} | {choices} | {value} -> feedback; locked
    POST /api/v1/attempts/{id}/finish              score; on a pass, the certificate's links
    GET  /api/v1/credentials/{code}                the signed credential (hosted copy)
    GET  /certificates/{code}[.svg]                printable certificate with a QR code
    GET  /status/{key fingerprint}                 signed BitstringStatusListCredential
    GET  /.well-known/did.json                     the issuer's public keys

Limits: per-learner attempts per UTC day (in SQLite, so they survive restarts) and per-IP sliding
windows (in memory) for starting attempts and for every other API call. Public documents (status
lists, keys, credentials) allow cross-origin reads so verifiers elsewhere can fetch them.
"""
from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from importlib import resources
from pathlib import Path
from typing import Literal

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field

from . import certificate
from .exam import Exam, ExamError, load_exam_banks
from .issuer import Issuer
from .keys import Keyring
from .settings import ClassroomConfig
from .store import Store
from .verification_code import CodeError, normalize

PUBLIC = {"Access-Control-Allow-Origin": "*", "Cache-Control": "no-cache"}


# --- API models --------------------------------------------------------------------------------

class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StartIn(Strict):
    display_name: str = Field(min_length=1, max_length=200, description="Printed on the certificate as typed.")
    email: str | None = Field(default=None, max_length=254,
                              description="Optional: only a salted hash goes into the credential.")


class QuestionOut(BaseModel):
    number: int
    chapter: int
    chapter_title: str
    type: Literal["single", "multiple", "numeric"]
    question: str
    choices: list[str]
    unit: str | None = None


class AttemptOut(BaseModel):
    attempt_id: str
    display_name: str
    expires_at: str
    expired: bool
    finished: bool
    total: int
    pass_mark: int
    answered: list[int]
    attempts_left_today: int
    questions: list[QuestionOut] | None = None


class AnswerIn(Strict):
    choice: int | None = Field(default=None, description="single: the shown position")
    choices: list[int] | None = Field(default=None, max_length=64, description="multiple: shown positions")
    value: float | None = Field(default=None, description="numeric: in the question's unit")


class FeedbackOut(BaseModel):
    number: int
    correct: bool
    feedback: list[str]
    answered: int
    total: int


class CredentialLinks(BaseModel):
    code: str
    credential_url: str
    certificate_url: str
    certificate_svg_url: str
    verify_url: str


class FinishOut(BaseModel):
    score: int
    total: int
    percent: float
    passed: bool
    pass_mark: int
    credential: CredentialLinks | None = None


class Error(BaseModel):
    detail: str


ERRORS = {404: {"model": Error}, 409: {"model": Error}, 410: {"model": Error}, 422: {"model": Error},
          429: {"model": Error}}


# --- per-IP limits -------------------------------------------------------------------------------

class RateLimiter:
    """At most `limit` events per `window_s` seconds per key (sliding window)."""

    def __init__(self, limit: int, window_s: float):
        self.limit, self.window = limit, window_s
        self.events: dict[str, deque] = defaultdict(deque)
        self.lock = threading.Lock()

    def hit(self, key: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self.lock:
            q = self.events[key]
            while q and q[0] <= now - self.window:
                q.popleft()
            if len(q) >= self.limit:
                retry = int(q[0] + self.window - now) + 1
                raise ExamError(f"too many requests from this address: retry in {retry} s", 429)
            q.append(now)
            if len(self.events) > 100_000:                 # forget idle addresses
                for k in [k for k, v in self.events.items() if not v or v[-1] <= now - self.window]:
                    del self.events[k]


# --- the app -------------------------------------------------------------------------------------

def create_app(config: ClassroomConfig, *, keyring: Keyring | None = None, clock=time.time) -> FastAPI:
    banks = load_exam_banks(config.banks_dir, config.questions_per_chapter)    # fail before touching var/
    store = Store(config.db_path)
    keyring = keyring or Keyring.open(config.keys_path, create=True)
    issuer = Issuer(config, keyring, store, clock=clock)
    exam = Exam(config, store, issuer, clock=clock, banks=banks)
    start_limit = RateLimiter(config.ip_attempts_per_hour, 3600)
    api_limit = RateLimiter(config.ip_requests_per_minute, 60)

    app = FastAPI(title="minimega exam", version=config.course_version,
                  description="Graded exam and verifiable Open Badges 3.0 certificates.")
    app.state.store, app.state.issuer, app.state.exam, app.state.config = store, issuer, exam, config

    @app.exception_handler(ExamError)
    async def exam_error(request: Request, err: ExamError):
        return JSONResponse({"detail": str(err)}, status_code=err.status)

    def ip(request: Request) -> str:
        return request.client.host if request.client else "unknown"

    @app.post("/api/v1/attempts", response_model=AttemptOut, status_code=201, responses=ERRORS)
    def start_attempt(body: StartIn, request: Request):
        start_limit.hit(ip(request))
        return exam.start(body.display_name, body.email, ip(request))

    @app.get("/api/v1/attempts/{attempt_id}", response_model=AttemptOut, responses=ERRORS)
    def get_attempt(attempt_id: str, request: Request, questions: bool = False):
        api_limit.hit(ip(request))
        return exam.status(attempt_id, with_questions=questions)

    @app.post("/api/v1/attempts/{attempt_id}/answers/{number}", response_model=FeedbackOut, responses=ERRORS)
    def answer(attempt_id: str, number: int, body: AnswerIn, request: Request):
        api_limit.hit(ip(request))
        return exam.answer(attempt_id, number, body.model_dump(exclude_none=True))

    @app.post("/api/v1/attempts/{attempt_id}/finish", response_model=FinishOut, responses=ERRORS)
    def finish(attempt_id: str, request: Request):
        api_limit.hit(ip(request))
        return exam.finish(attempt_id)

    def credential_row(code: str, request: Request):
        api_limit.hit(ip(request))
        try:
            row = store.credential_by_code(normalize(code))
        except CodeError as err:
            raise ExamError(f"verification code: {err}", 404) from None
        if row is None:
            raise ExamError("no credential has this verification code", 404)
        return row

    @app.get("/api/v1/credentials/{code}", responses=ERRORS,
             response_description="The signed OpenBadgeCredential, exactly as issued")
    def get_credential(code: str, request: Request) -> Response:
        row = credential_row(code, request)
        return Response(row["document"], media_type="application/json", headers=PUBLIC)

    @app.get("/certificates/{code}.svg", response_class=Response, responses=ERRORS)
    def certificate_svg(code: str, request: Request):
        row = credential_row(code, request)
        links = issuer.links(row["code"])
        return Response(certificate.svg(json.loads(row["document"]), row["code"], links["verify_url"]),
                        media_type="image/svg+xml", headers={"Content-Security-Policy": "default-src 'none'"})

    @app.get("/certificates/{code}", response_class=HTMLResponse, responses=ERRORS)
    def certificate_html(code: str, request: Request):
        row = credential_row(code, request)
        links = issuer.links(row["code"])
        return HTMLResponse(certificate.html(json.loads(row["document"]), row["code"], links["verify_url"]),
                            headers={"Content-Security-Policy":
                                     "default-src 'none'; style-src 'unsafe-inline'; img-src data:"})

    @app.get("/status/{fingerprint}", responses=ERRORS,
             response_description="Signed BitstringStatusListCredential")
    def get_status_list(fingerprint: str) -> JSONResponse:
        try:
            return JSONResponse(issuer.status_list_credential(fingerprint), headers=PUBLIC)
        except LookupError as err:
            raise HTTPException(404, str(err)) from None

    @app.get("/.well-known/did.json")
    def did_json() -> JSONResponse:
        return JSONResponse(issuer.did_document(), headers=PUBLIC)

    @app.get("/achievements/{version}")
    def achievement(version: str) -> JSONResponse:
        if version != config.course_version:
            raise HTTPException(404, f"this service issues course version {config.course_version}")
        return JSONResponse(issuer.achievement(), headers=PUBLIC)

    @app.get("/api/v1/health")
    def health() -> dict:
        return {"ok": True, "schema_version": store.schema_version(), "course_version": config.course_version}

    static = resources.files(__package__).joinpath("static")
    app.mount("/exam", StaticFiles(directory=str(static), html=True), name="exam")
    site = Path(config.site_dir)
    if site.is_dir() and (site / "index.html").exists():
        app.mount("/", StaticFiles(directory=str(site), html=True), name="site")
    else:
        @app.get("/", include_in_schema=False)
        def no_site():
            return RedirectResponse("/exam/")
    return app
