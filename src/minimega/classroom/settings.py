"""Configuration of the exam service; `minimega serve` flags map one-to-one to these fields."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class ClassroomConfig:
    var_dir: Path = Path("var")
    """Where the database and the development keys live (created 0700)."""
    db: Path | str | None = None
    """SQLite file (default ``var_dir/classroom.sqlite3``), or a ``postgresql://user@host/dbname`` URL: one
    database that several service instances share."""
    keys_dir: Path | None = None
    """Folder of ``key-*.pem`` signing keys; default ``var_dir/keys``."""
    site_dir: Path = Path("site")
    """The built mkdocs site served at ``/``."""
    banks_dir: Path | None = None
    """The graded banks (``--exam-banks``): deployment data the operator keeps private (`banks`). None: the
    repository's public sample bank, which only ``dev`` or `allow_sample_bank` accept."""
    allow_sample_bank: bool = False
    """Grade on a public sample bank outside ``dev`` (its certificates say so)."""
    base_url: str = "http://127.0.0.1:8000"
    """Public origin of the service; credential, status list and verify URLs start with it."""
    issuer_did: str | None = None
    """``did:web:<host>`` for a real deployment; None signs as the active key's ``did:key`` (development)."""
    issuer_name: str = "minimega course"
    course_version: str = "0.1.0"
    questions_per_chapter: int = 3
    """Questions drawn from each chapter's bank per attempt."""
    pass_fraction: float = 0.8
    attempts_per_day: int = 3
    """Per signed-in learner (their verified email), per UTC day."""
    fail_cooldown_s: float = 3600
    """After a failed attempt the same learner waits this long before the next one."""
    dev: bool = False
    """Development: sign-in links are logged and returned to the page instead of mailed."""
    smtp_host: str | None = None
    """SMTP server for sign-in links (a real deployment); without it and without `dev` the service refuses to start."""
    smtp_port: int = 587
    smtp_user: str | None = None
    smtp_password_env: str = "MINIMEGA_SMTP_PASSWORD"
    """Name of the environment variable holding the SMTP password (never a flag: it would show in `ps`)."""
    smtp_from: str = "minimega exam <exam@localhost>"
    smtp_starttls: bool = True
    signin_ttl_s: float = 15 * 60
    """A sign-in link works once, within this time."""
    session_ttl_s: float = 12 * 3600
    signins_per_hour: int = 5
    """Sign-in mails per email address per hour."""
    body_limit_bytes: int = 16 * 1024
    """Larger request bodies get 413 before they are parsed."""
    attempt_ttl_s: float = 3 * 3600
    """An attempt not finished within this time expires."""
    ip_attempts_per_hour: int = 20
    ip_requests_per_minute: int = 600
    """Per-IP limit on API calls (answers, finishes, look-ups); invalid requests count too."""
    ip_signins_per_hour: int = 30
    """Per-address budgets (sign-ins, starts, API calls) count the sender's IPv4 /24 or IPv6 /64 block."""
    signins_per_hour_total: int = 2000
    """Sign-in mails per hour, all addresses together: what no address pool escapes."""
    signins_per_domain_per_hour: int = 300
    """Sign-in mails per hour to one email domain (mailboxes at one provider are cheap too)."""
    signin_share_per_hour: int = 3
    """Once the overall or a domain's cap is spent, sign-ins per hour each network still has (per domain, for the
    domain's cap): the caps slow a flood down without locking out learners on networks that took no part."""
    header_timeout_s: float = 10
    """A request's headers must arrive within this (of the connection, or of the last response): else 408, closed."""
    body_timeout_s: float = 20
    """A request's body must arrive within this of its headers: else 408 and the connection closed."""
    limit_concurrency: int = 2000
    """Connections and requests in flight at once; beyond it, 503 (uvicorn's ``limit_concurrency``)."""
    connections_per_address: int = 50
    """Open connections one client address may hold; through a proxy in ``--forwarded-allow-ips``, requests in
    flight per forwarded client address (`httpguard.guarded_protocol`)."""
    network_share: float = 0.25
    """Of `limit_concurrency`, what one network (IPv4 /24, IPv6 /64) may hold: connections, or through a proxy in
    ``--forwarded-allow-ips`` requests in flight per forwarded client network (`connections_per_network`)."""
    unfinished_share: float = 0.1
    """Of `limit_concurrency`, what one network may hold in requests still arriving (headers, or a body): slow
    clients' own smaller budget (`unfinished_per_network`)."""
    min_attempt_s: float = 300
    """An attempt cannot be finished sooner than this after it starts (stated on the page): a script answers 48
    questions in well under a second, a person takes far longer than 5 minutes."""
    status_list_ttl_s: float = 24 * 3600
    """A signed status list is valid this long; verifiers reject older ones as stale."""
    credential_valid_days: int | None = None
    """None: certificates do not expire."""

    def __post_init__(self):
        if not 0 < self.pass_fraction <= 1:
            raise ValueError(f"pass_fraction={self.pass_fraction}: must lie in (0, 1]")
        if self.questions_per_chapter < 1 or self.attempts_per_day < 1:
            raise ValueError("questions_per_chapter and attempts_per_day must be >= 1")
        if min(self.header_timeout_s, self.body_timeout_s) <= 0 or min(self.limit_concurrency,
                                                                          self.connections_per_address) < 1:
            raise ValueError("header_timeout_s and body_timeout_s must be > 0, limit_concurrency and "
                             "connections_per_address >= 1")
        if min(self.signin_share_per_hour, self.signins_per_hour_total, self.signins_per_domain_per_hour) < 1:
            raise ValueError("signin_share_per_hour, signins_per_hour_total and signins_per_domain_per_hour must be >= 1")
        if not 0 < self.unfinished_share <= self.network_share <= 1:
            raise ValueError(f"unfinished_share={self.unfinished_share}, network_share={self.network_share}: "
                             "need 0 < unfinished_share <= network_share <= 1")
        if self.fail_cooldown_s < 0 or self.body_limit_bytes < 1024:
            raise ValueError("fail_cooldown_s must be >= 0 and body_limit_bytes >= 1024")
        if not self.base_url.startswith(("http://", "https://")) or self.base_url.endswith("/"):
            raise ValueError(f"base_url={self.base_url!r}: an origin like https://course.example.org, no trailing /")
        if isinstance(self.db, str):
            if "://" not in self.db:
                object.__setattr__(self, "db", Path(self.db))
            elif not self.db.startswith(("postgresql://", "postgres://")):
                raise ValueError(f"db={self.db.split('://')[0]}://…: use a postgresql:// URL or a SQLite file path")
        if self.issuer_did is not None and not self.issuer_did.startswith("did:web:"):
            raise ValueError(f"issuer_did={self.issuer_did!r}: use did:web:<host>, or leave unset for did:key")

    @property
    def connections_per_network(self) -> int:
        return max(1, int(self.limit_concurrency * self.network_share))

    @property
    def unfinished_per_network(self) -> int:
        return max(1, int(self.limit_concurrency * self.unfinished_share))

    @property
    def has_site(self) -> bool:
        """Whether `site_dir` holds a built site; without one the service serves its bare exam page."""
        return (Path(self.site_dir) / "index.html").is_file()

    @property
    def db_path(self) -> Path | str:
        """The SQLite file, or the PostgreSQL URL (`store.open_store` takes either)."""
        return self.db or self.var_dir / "classroom.sqlite3"

    @property
    def keys_path(self) -> Path:
        return self.keys_dir or self.var_dir / "keys"
