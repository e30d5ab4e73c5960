"""Sign-in mail: a pluggable `Mailer`. `SmtpMailer` for a deployment, `DevMailer` for development.

`DevMailer` sends nothing: it writes the link to the server log (stderr) and keeps the last messages
in memory, and the service returns the link to the page only when started with ``--dev``.
"""
from __future__ import annotations

import logging
import os
import smtplib
import ssl
import sys
import threading
from collections import deque
from email.message import EmailMessage
from typing import Protocol

log = logging.getLogger("minimega.mail")


class Mailer(Protocol):
    def send(self, to: str, subject: str, body: str) -> None: ...


class DevMailer:
    """Development: no mail leaves the machine; the message goes to stderr and `outbox`."""

    def __init__(self, keep: int = 100):
        self.outbox: deque[tuple[str, str, str]] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def send(self, to: str, subject: str, body: str) -> None:
        with self._lock:
            self.outbox.append((to, subject, body))
        print(f"[dev mail] to {to}: {subject}\n{body}", file=sys.stderr, flush=True)


class SmtpMailer:
    """SMTP with STARTTLS (port 587) or implicit TLS (port 465); the password comes from the environment."""

    def __init__(self, host: str, port: int, sender: str, user: str | None = None,
                 password_env: str = "MINIMEGA_SMTP_PASSWORD", starttls: bool = True, timeout: float = 10):
        self.host, self.port, self.sender, self.user = host, port, sender, user
        self.password_env, self.starttls, self.timeout = password_env, starttls, timeout
        if user and not os.environ.get(password_env):
            raise ValueError(f"SMTP user {user!r} given but ${password_env} is empty: export the password there")

    def send(self, to: str, subject: str, body: str) -> None:
        msg = EmailMessage()
        msg["From"], msg["To"], msg["Subject"] = self.sender, to, subject
        msg.set_content(body)
        context = ssl.create_default_context()
        if self.port == 465:
            server = smtplib.SMTP_SSL(self.host, self.port, timeout=self.timeout, context=context)
        else:
            server = smtplib.SMTP(self.host, self.port, timeout=self.timeout)
        with server:
            if self.port != 465 and self.starttls:
                server.starttls(context=context)
            if self.user:
                server.login(self.user, os.environ[self.password_env])
            server.send_message(msg)


def mailer_for(config) -> Mailer:
    """The mailer a `ClassroomConfig` asks for; refuses a configuration that could send no link."""
    if config.smtp_host:
        return SmtpMailer(config.smtp_host, config.smtp_port, config.smtp_from, config.smtp_user,
                          config.smtp_password_env, config.smtp_starttls)
    if config.dev:
        return DevMailer()
    raise ValueError("no way to send sign-in links: pass --smtp-host (and --smtp-user, $MINIMEGA_SMTP_PASSWORD; "
                     "or $MINIMEGA_SMTP_HOST, $MINIMEGA_SMTP_USER) for a deployment, or --dev (MINIMEGA_DEV=1) "
                     "to show links in the log and on the page, for local use only")
