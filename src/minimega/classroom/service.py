"""The exam service: the built site at ``/`` (its exam page at ``/exam/``, in Dutch at ``/nl/exam/``), the API
under ``/api/v1``. Without a built site, a bare exam page at the same paths (`bare_page`).

    POST /api/v1/signin                            {email} -> a one-time link is mailed (in --dev: returned)
    POST /api/v1/signin/confirm                    {token} -> {session}: send it as "Authorization: Bearer"
    POST /api/v1/signout
    GET  /api/v1/me                                limits left, cooldown, the open and the last attempt
    POST /api/v1/attempts                          start or resume: {display_name[, lang]} -> questions, no key
    GET  /api/v1/attempts/{id}[?questions=true]    progress and the answers given so far (resume)
    POST /api/v1/attempts/{id}/answers/{number}    {choice} | {choices} | {value} -> "recorded"; locked
    POST /api/v1/attempts/{id}/finish              score; on a pass, the certificate's links
    GET  /api/v1/attempts/{id}/review              after the finish: keys, worked values, explanations
    GET  /api/v1/credentials/{code}                the signed credential (hosted copy)
    GET  /certificates/{code}[.svg]                printable certificate with a QR code
    GET  /status/{key fingerprint}                 signed BitstringStatusListCredential
    GET  /.well-known/did.json                     the issuer's public keys

Every attempt call needs the session of the learner who owns the attempt. Limits: per-learner
attempts per UTC day and a cooldown after a fail (in the database, so they survive restarts), sign-in
mails per address per hour, and per-IP sliding windows for sign-ins, starts and every other API call
(in memory on SQLite; in the database on PostgreSQL, so that every instance counts them); a request
that fails validation counts too. Bodies over `body_limit_bytes` get 413 before parsing; a 422 names
the fields at fault and never echoes the input. The client address is the socket's: `minimega serve`
trusts X-Forwarded-For only from `--forwarded-allow-ips`. Public documents (status lists, keys,
credentials) allow cross-origin reads so verifiers elsewhere can fetch them.
"""
from __future__ import annotations

import json
import math
import time
from importlib import resources
from pathlib import Path
from typing import Literal

from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.middleware.gzip import GZipMiddleware

from . import banks, certificate
from .api_models import (  # noqa: F401  (re-exported)
    ERRORS, Strict, SigninIn, SigninOut, ConfirmIn, SessionOut, MeOut, StartIn, QuestionOut, AttemptOut,
    AnswerIn, RecordedOut, ReviewItem, ReviewOut, CredentialLinks, FinishOut, Error,
)
from .bare_page import bare_exam_pages, exam_path
from .checkbank import refuse_disguised_sample
from .exam import Exam, ExamError, clean_email, rules_text
from .mailer import mailer_for
from .issuer import Issuer
from .httpguard import SecurityHeaders
from .keys import Keyring
from .limits import ShareCap, block_of, limiter
from .settings import ClassroomConfig
from .stores import open_store, secure_var_dir
from .verification_code import CodeError, normalize

PUBLIC = {"Access-Control-Allow-Origin": "*", "Cache-Control": "no-cache"}


# --- request bodies ------------------------------------------------------------------------------

class BodyLimit:
    """ASGI middleware: 413 for a body over `limit` bytes, by Content-Length or as it streams in.

    The body (at most `limit` bytes) is read before the app runs and replayed to it, so an oversized
    chunked upload is refused before any parsing starts."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def _reply(self, send, status: int, detail: str):
        body = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self._reply(send, 413, f"request body over {self.limit} bytes")
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":          # the client went away
                return
            seen += len(message.get("body", b""))
            if seen > self.limit:
                return await self._reply(send, 413, f"request body over {self.limit} bytes")
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def validation_detail(err: RequestValidationError) -> str:
    """Where and what, never the input: at most 5 problems, each location and message cut short."""
    parts = []
    for e in err.errors()[:5]:
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body")[:60] or "body"
        parts.append(f"{where}: {str(e.get('msg', 'invalid'))[:100]}")
    more = len(err.errors()) - 5
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


# --- the app -------------------------------------------------------------------------------------

def _fixed_page(page: str, lang: str):
    def endpoint():
        return HTMLResponse(page, headers={"Content-Language": lang})
    return endpoint


def _redirect_to(path: str):
    def endpoint():
        return RedirectResponse(path)
    return endpoint


def create_app(config: ClassroomConfig, *, keyring: Keyring | None = None, clock=time.time,
               mailer=None) -> FastAPI:
    folder = banks.choose(config.banks_dir, dev=config.dev, allow_sample=config.allow_sample_bank)
    bank_set = banks.open_bank_set(folder, config.questions_per_chapter)      # fail before touching var/
    banks.refuse_sample(bank_set, dev=config.dev, allow_sample=config.allow_sample_bank)
    bank_set = refuse_disguised_sample(bank_set, dev=config.dev, allow_sample=config.allow_sample_bank)
    mailer = mailer if mailer is not None else mailer_for(config)
    secure_var_dir(config.var_dir)
    store = open_store(config.db_path)
    keyring = keyring or Keyring.open(config.keys_path, create=True)
    issuer = Issuer(config, keyring, store, clock=clock, bank=bank_set)
    exam = Exam(config, store, issuer, clock=clock, banks=bank_set.banks, mailer=mailer,
                translations=bank_set.translations)
    # per-address budgets count the sender's /24 (IPv4) or /64 (IPv6) block (`limits.block_of`); shared by every
    # instance when the store is
    signin_limit = limiter(store, "signin", config.ip_signins_per_hour, 3600)
    start_limit = limiter(store, "start", config.ip_attempts_per_hour, 3600)
    api_limit = limiter(store, "api", config.ip_requests_per_minute, 60)
    signin_all = ShareCap(limiter(store, "signin-all", config.signins_per_hour_total, 3600, what="for sign-ins"),
                          limiter(store, "signin-all-share", config.signin_share_per_hour, 3600))
    signin_domain = ShareCap(limiter(store, "signin-domain", config.signins_per_domain_per_hour, 3600,
                                     what="for sign-ins from this email domain"),
                             limiter(store, "signin-domain-share", config.signin_share_per_hour, 3600))

    app = FastAPI(title="minimega exam", version=config.course_version,
                  description="Graded exam and verifiable Open Badges 3.0 certificates.")
    app.state.store, app.state.issuer, app.state.exam, app.state.config = store, issuer, exam, config
    app.state.mailer = mailer
    app.add_middleware(BodyLimit, limit=config.body_limit_bytes)
    app.add_middleware(SecurityHeaders, base_url=config.base_url)       # outermost: every response

    @app.exception_handler(ExamError)
    async def exam_error(request: Request, err: ExamError):
        headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else {}
        if getattr(err, "retry_after", None):
            headers["Retry-After"] = str(err.retry_after)
        return JSONResponse({"detail": str(err)}, status_code=err.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError):
        try:                                    # a malformed request spends the sender's budget too
            api_limit.hit(net(request))
            if request.url.path == "/api/v1/signin":
                signin_limit.hit(net(request))
        except ExamError as limited:
            return JSONResponse({"detail": str(limited)}, status_code=429,
                                headers={"Retry-After": str(getattr(limited, "retry_after", 60))})
        return JSONResponse({"detail": validation_detail(err)}, status_code=422)

    def ip(request: Request) -> str:
        return request.client.host if request.client else "unknown"

    def net(request: Request) -> str:
        return block_of(ip(request))

    def bearer(authorization: str | None) -> str | None:
        if authorization and authorization[:7].lower() == "bearer " and len(authorization) <= 200:
            return authorization[7:].strip()
        return None

    Auth = Header(default=None, max_length=200, description="Bearer <session> from /api/v1/signin/confirm")

    @app.get("/api/v1/exam")
    def exam_info(lang: Literal["en", "nl"] = "en") -> dict:
        """Public facts the exam page states: sizes, pass mark, limits, chapters (in `lang`), languages."""
        if lang not in exam.banks_by_lang:
            raise ExamError(f"lang {lang!r}: this exam is offered in {exam.languages}", 422)
        total = len(exam.banks) * config.questions_per_chapter
        return {"questions": total, "pass_mark": math.ceil(config.pass_fraction * total - 1e-9),
                "attempts_per_day": config.attempts_per_day, "fail_cooldown_s": config.fail_cooldown_s,
                "attempt_ttl_s": config.attempt_ttl_s, "rules": rules_text(config, len(exam.banks), lang),
                "chapters": {str(c): b.title for c, b in sorted(exam.banks_by_lang[lang].items())},
                "languages": exam.languages}

    @app.post("/api/v1/signin", response_model=SigninOut, responses=ERRORS)
    def signin(body: SigninIn, request: Request):
        signin_limit.hit(net(request))
        email = clean_email(body.email)
        signin_domain.hit(email.rsplit("@", 1)[1].lower(), net(request))
        signin_all.hit("all", net(request))
        return exam.request_signin(email, lang=body.lang)

    @app.post("/api/v1/signin/confirm", response_model=SessionOut, responses=ERRORS)
    def confirm(body: ConfirmIn, request: Request):
        api_limit.hit(net(request))
        signin_limit.hit(net(request))           # guessing tokens costs as much as asking for them
        return exam.redeem_signin(body.token)

    @app.post("/api/v1/signout", status_code=204, responses=ERRORS)
    def signout(request: Request, authorization: str | None = Auth):
        api_limit.hit(net(request))
        exam.learner(bearer(authorization))
        exam.sign_out(bearer(authorization))
        return Response(status_code=204)

    @app.get("/api/v1/me", response_model=MeOut, responses=ERRORS)
    def me(request: Request, authorization: str | None = Auth):
        api_limit.hit(net(request))
        return exam.me(bearer(authorization))

    @app.post("/api/v1/attempts", response_model=AttemptOut, status_code=201, responses=ERRORS)
    def start_attempt(body: StartIn, request: Request, authorization: str | None = Auth):
        start_limit.hit(net(request))
        return exam.start(bearer(authorization), body.display_name, ip(request), body.lang)

    @app.get("/api/v1/attempts/{attempt_id}", response_model=AttemptOut, responses=ERRORS)
    def get_attempt(attempt_id: str, request: Request, questions: bool = False,
                    authorization: str | None = Auth):
        api_limit.hit(net(request))
        return exam.status(attempt_id, bearer(authorization), with_questions=questions)

    @app.post("/api/v1/attempts/{attempt_id}/answers/{number}", response_model=RecordedOut, responses=ERRORS)
    def answer(attempt_id: str, number: int, body: AnswerIn, request: Request, authorization: str | None = Auth):
        api_limit.hit(net(request))
        return exam.answer(attempt_id, number, body.model_dump(exclude_none=True), bearer(authorization))

    @app.post("/api/v1/attempts/{attempt_id}/finish", response_model=FinishOut, responses=ERRORS)
    def finish(attempt_id: str, request: Request, authorization: str | None = Auth):
        api_limit.hit(net(request))
        return exam.finish(attempt_id, bearer(authorization))

    @app.get("/api/v1/attempts/{attempt_id}/review", response_model=ReviewOut, responses=ERRORS)
    def review(attempt_id: str, request: Request, authorization: str | None = Auth):
        api_limit.hit(net(request))
        return exam.review(attempt_id, bearer(authorization))

    def credential_row(code: str, request: Request):
        api_limit.hit(net(request))
        try:
            row = store.credential_by_code(normalize(code))
        except CodeError as err:
            raise ExamError(f"verification code: {err}", 404) from None
        if row is None:
            raise ExamError("no credential has this verification code", 404)
        if row["erased_at"] is not None:
            raise ExamError("this credential was erased at its holder's request; the copy its holder keeps still "
                            "verifies (its proof and its status, not revoked)", 410)
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
    def achievement(version: str, lang: Literal["en", "nl"] = "en") -> JSONResponse:
        if version != config.course_version:
            raise HTTPException(404, f"this service issues course version {config.course_version}")
        return JSONResponse(issuer.achievement(lang), headers=PUBLIC)

    @app.get("/api/v1/health")
    def health() -> dict:
        return {"ok": True, "schema_version": store.schema_version(), "course_version": config.course_version}

    static = resources.files(__package__).joinpath("static")
    app.mount("/exam-app", StaticFiles(directory=str(static), html=True), name="exam-app")
    site = Path(config.site_dir)
    if config.has_site:
        # the course's pages, scripts and search index gzipped (a chapter: 2.7 MB -> under 1 MB on the wire,
        # bench/lighthouse.py); only the site's files: no API response, no token, is ever compressed (BREACH)
        app.mount("/", GZipMiddleware(StaticFiles(directory=str(site), html=True), minimum_size=1024), name="site")
    else:                                       # no course site built: the bare exam page, at the site's paths
        pages = bare_exam_pages(config, exam.languages, len(exam.banks))
        for lang in exam.languages:
            path = exam_path(lang)
            # endpoints without parameters: FastAPI would read any parameter from the query string
            app.add_api_route(path, _fixed_page(pages[path], lang), methods=["GET"], include_in_schema=False)
            app.add_api_route(path.removesuffix("exam/"), _redirect_to(path), methods=["GET"], include_in_schema=False)

        @app.get("/favicon.ico", include_in_schema=False)
        def favicon():
            return Response(status_code=204)
    return app
