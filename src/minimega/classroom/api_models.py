"""The exam API's request and response models (OpenAPI at ``/docs``): strict inputs, no coercion."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints


# --- API models --------------------------------------------------------------------------------

class Strict(BaseModel):
    """No extra keys, no coercion: `true` is not 1 and "1" is not a number."""
    model_config = ConfigDict(extra="forbid", strict=True)


class SigninIn(Strict):
    email: str = Field(min_length=3, max_length=254, description="The link is mailed here; only a keyed hash "
                       "(attempts) and a salted hash (the credential) are stored.")
    lang: Literal["en", "nl"] = Field(default="en", description="Language of the mail, and of the exam page "
                                      "its link opens when the service has one in that language.")


class SigninOut(BaseModel):
    sent: bool
    expires_in_s: int
    dev_link: str | None = None


class ConfirmIn(Strict):
    token: str = Field(min_length=16, max_length=128)


class SessionOut(BaseModel):
    session: str
    expires_in_s: int


class HeldCredential(BaseModel):
    code: str
    issued_at: str
    revoked: bool
    credential_url: str
    certificate_url: str
    certificate_svg_url: str
    verify_url: str


class MeOut(BaseModel):
    attempts_left_today: int
    attempts_per_day: int
    cooldown_until: str | None
    open_attempt: str | None
    last_attempt: str | None
    credentials: list[HeldCredential] = []
    """The learner's certificates, newest first, so the page shows them at any time (not only after a finish)."""


class StartIn(Strict):
    display_name: str = Field(min_length=1, max_length=400, description="Printed on the certificate as typed "
                              "(NFC, 1-100 visible characters).")
    lang: Literal["en", "nl"] = Field(default="en", description="Language of the questions, the review and the "
                                      "certificate's text; kept with the attempt (a resumed attempt keeps its own).")


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
    lang: str = "en"
    expires_at: str
    expired: bool
    finished: bool
    total: int
    pass_mark: int
    answered: list[int]
    attempts_left_today: int
    responses: dict[str, dict] = {}
    resumed: bool | None = None
    questions: list[QuestionOut] | None = None


class AnswerIn(Strict):
    choice: int | None = Field(default=None, description="single: the shown position")
    choices: list[int] | None = Field(default=None, max_length=64, description="multiple: shown positions")
    value: float | Annotated[str, StringConstraints(max_length=64)] | None = Field(default=None, description="numeric: a number in the question's "
                                      "unit, or text with the unit (\"31.4 GB\"; a wrong unit is refused by name)")


class RecordedOut(BaseModel):
    number: int
    recorded: bool
    answered: int
    total: int


class ReviewItem(QuestionOut):
    response: dict | None
    correct: bool
    key: list[int] | None
    """Always None: a choice item's key is never in a review (kept in the schema for old clients)."""
    answer: float | None
    """The exact value, rounded to the significant figures asked (numeric items)."""
    sig: int | None = None
    """The significant figures asked (numeric items): the review prints that many (1.1 asked to 3: 1.10)."""
    explain: str | None
    """Numeric items: the worked answer; choice items: the idea the item tests (never naming the key)."""
    explains: list[str]
    """Always empty: per-option explanations would name the key."""


class ReviewOut(BaseModel):
    attempt_id: str
    lang: str = "en"
    score: int | None
    total: int
    passed: bool
    finished: bool
    items: list[ReviewItem]


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


ERRORS = {401: {"model": Error}, 404: {"model": Error}, 409: {"model": Error}, 410: {"model": Error},
          413: {"model": Error}, 422: {"model": Error}, 429: {"model": Error}}
