"""`minimega serve` and `minimega cert …`: argparse builders the main CLI mounts, runnable alone too.

    python -m minimega.classroom.cli serve [--host 127.0.0.1 --port 8000 …]
    python -m minimega.classroom.cli cert verify FILE|CODE [--trust DID] [--issuer-url URL] [--offline] [--json]
    python -m minimega.classroom.cli cert revoke CODE [--reason TEXT]
    python -m minimega.classroom.cli cert erase --email ADDRESS | --code CODE
    python -m minimega.classroom.cli cert keys | rotate-key

`cert verify` checks the proofs offline (did:key needs nothing; did:web needs --did-document or the
network), that the issuer is one the verifier trusts (see `minimega.classroom.trust`), the dates, then,
when reachable, the signed status list. Exit status: 0 valid, 1 invalid, 2 usage, 3 signature valid
but the issuer is not trusted.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import banks, trust
from .cli_cert import ISSUER_URL_ENV, add_cert_parser  # noqa: F401  (re-exported)
from .settings import ClassroomConfig
from .stores import secure_var_dir

SERVE_ENV = {"db": "MINIMEGA_DB", "dev": "MINIMEGA_DEV", "base_url": "MINIMEGA_BASE_URL", "issuer_did": "MINIMEGA_ISSUER_DID",
             "smtp_host": "MINIMEGA_SMTP_HOST", "smtp_port": "MINIMEGA_SMTP_PORT", "smtp_user": "MINIMEGA_SMTP_USER",
             "smtp_from": "MINIMEGA_SMTP_FROM", "exam_banks": "MINIMEGA_EXAM_BANKS"}
"""`serve` settings also read from the environment (a container's way to configure); a flag overrides its variable.
The SMTP password is only ever read from the environment (``$MINIMEGA_SMTP_PASSWORD``)."""


# --- serve ---------------------------------------------------------------------------------------

def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    d = ClassroomConfig()
    p = subparsers.add_parser("serve", help="serve the course site, the exam and certificates",
                              description="Serve the built site at /, the exam at /exam/ and its API at /api/v1.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--base-url", help="public origin, used in mailed sign-in links (default http://HOST:PORT; "
                                      "env MINIMEGA_BASE_URL)")
    p.add_argument("--var-dir", type=Path, default=d.var_dir, help="database and development keys (default var/)")
    p.add_argument("--db", help="SQLite file (default VAR_DIR/classroom.sqlite3), or a postgresql://user@host/dbname "
                                "URL that several instances share (password: $PGPASSWORD; env MINIMEGA_DB)")
    p.add_argument("--keys-dir", type=Path, help="signing keys (default VAR_DIR/keys)")
    p.add_argument("--site-dir", type=Path, default=d.site_dir)
    p.add_argument("--exam-banks", "--banks-dir", dest="exam_banks", metavar="DIR",
                   help="the graded banks: a private folder of NN-slug.yaml (check it with `minimega exam check-bank "
                        "DIR`; env MINIMEGA_EXAM_BANKS). Required outside --dev: the repository's quizzes/exam is the "
                        "public sample bank")
    p.add_argument("--allow-sample-bank", action="store_true",
                   help="grade on the public sample bank outside --dev (its certificates say they prove nothing)")
    p.add_argument("--issuer-did", help="did:web:<host> for a real deployment (default: the key's did:key; "
                                        "env MINIMEGA_ISSUER_DID)")
    p.add_argument("--questions-per-chapter", type=int, default=d.questions_per_chapter)
    p.add_argument("--pass-fraction", type=float, default=d.pass_fraction)
    p.add_argument("--attempts-per-day", type=int, default=d.attempts_per_day)
    p.add_argument("--ip-attempts-per-hour", type=int, default=d.ip_attempts_per_hour)
    p.add_argument("--ip-requests-per-minute", type=int, default=d.ip_requests_per_minute)
    p.add_argument("--ip-signins-per-hour", type=int, default=d.ip_signins_per_hour)
    p.add_argument("--signins-per-hour-total", type=int, default=d.signins_per_hour_total)
    p.add_argument("--signins-per-domain-per-hour", type=int, default=d.signins_per_domain_per_hour)
    p.add_argument("--signin-share-per-hour", type=int, default=d.signin_share_per_hour,
                   help="sign-ins per hour each network keeps once the overall or a domain's cap is spent")
    p.add_argument("--min-attempt-s", type=float, default=d.min_attempt_s,
                   help=f"an attempt cannot be finished sooner (default {d.min_attempt_s:g}; stated on the page)")
    p.add_argument("--header-timeout-s", type=float, default=d.header_timeout_s,
                   help="a request's headers must arrive within this, else 408 and the connection closed")
    p.add_argument("--body-timeout-s", type=float, default=d.body_timeout_s,
                   help="a request's body must arrive within this of its headers, else 408 and closed")
    p.add_argument("--limit-concurrency", type=int, default=d.limit_concurrency,
                   help="connections and requests at once; beyond it 503")
    p.add_argument("--connections-per-address", type=int, default=d.connections_per_address,
                   help="open connections per client address; through a proxy in --forwarded-allow-ips, "
                        "requests in flight per forwarded client address (429 beyond)")
    p.add_argument("--network-share", type=float, default=d.network_share,
                   help="of --limit-concurrency, what one /24 or /64 may hold (default 0.25)")
    p.add_argument("--unfinished-share", type=float, default=d.unfinished_share,
                   help="of --limit-concurrency, what one /24 or /64 may hold in requests still arriving "
                        "(headers or body; default 0.1)")
    p.add_argument("--fail-cooldown-s", type=float, default=d.fail_cooldown_s,
                   help="wait after a failed attempt before the next (default 3600)")
    p.add_argument("--body-limit-bytes", type=int, default=d.body_limit_bytes)
    p.add_argument("--forwarded-allow-ips", default=None,
                   help="comma-separated proxy addresses whose X-Forwarded-For/-Proto are trusted; default: none "
                        "(per-IP limits use the socket's address). Private addresses or networks; never one "
                        "that covers every address")
    p.add_argument("--trust-public-proxy", action="store_true",
                   help="allow public proxy addresses in --forwarded-allow-ips, each named one by one (/32, /128)")
    p.add_argument("--dev", action="store_true", default=None,
                   help="development, for local use only: sign-in links are shown on the page and in the log "
                        "instead of mailed, so anyone who can reach the service can sign in as anyone "
                        "(env MINIMEGA_DEV=1)")
    p.add_argument("--smtp-host", help="SMTP server that mails sign-in links (a deployment; env MINIMEGA_SMTP_HOST)")
    p.add_argument("--smtp-port", type=int,
                   help=f"{d.smtp_port} STARTTLS (default) or 465 TLS (env MINIMEGA_SMTP_PORT)")
    p.add_argument("--smtp-user", help="SMTP login; the password is read from $MINIMEGA_SMTP_PASSWORD "
                                       "(env MINIMEGA_SMTP_USER)")
    p.add_argument("--smtp-from", help=f"sender address (default {d.smtp_from!r}; env MINIMEGA_SMTP_FROM)")
    p.add_argument("--no-build", action="store_true", help="do not rebuild a stale site")
    p.set_defaults(func=run_serve)
    return p


def serve_settings(args, env=os.environ) -> dict:
    """The `SERVE_ENV` settings: each flag if given, else its environment variable, else the default."""
    d = ClassroomConfig()
    defaults = {"dev": False, "smtp_port": d.smtp_port, "smtp_from": d.smtp_from}
    out = {}
    for field, name in SERVE_ENV.items():
        flag, raw = getattr(args, field), env.get(name, "").strip()
        if flag is not None:
            out[field] = flag
        elif not raw:
            out[field] = defaults.get(field)
        elif field == "dev":
            if raw not in ("0", "1"):
                raise ValueError(f"${name}={raw[:20]!r}: set it to 1 for development mode, or 0 / unset")
            out[field] = raw == "1"
        elif field == "smtp_port":
            if not raw.isdigit() or not 0 < int(raw) < 65536:
                raise ValueError(f"${name}={raw[:20]!r}: a port number 1..65535")
            out[field] = int(raw)
        else:
            out[field] = raw
    return out


def config_from_args(args, env=os.environ) -> ClassroomConfig:
    s = serve_settings(args, env)
    base = s["base_url"] or f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}"
    from importlib.metadata import PackageNotFoundError, version
    try:
        course_version = version("minimega")
    except PackageNotFoundError:
        course_version = ClassroomConfig().course_version
    return ClassroomConfig(var_dir=args.var_dir, db=s["db"], keys_dir=args.keys_dir, site_dir=args.site_dir,
                           banks_dir=Path(s["exam_banks"]) if s["exam_banks"] else None,
                           allow_sample_bank=args.allow_sample_bank, base_url=base, issuer_did=s["issuer_did"],
                           course_version=course_version, questions_per_chapter=args.questions_per_chapter,
                           pass_fraction=args.pass_fraction, attempts_per_day=args.attempts_per_day,
                           ip_attempts_per_hour=args.ip_attempts_per_hour,
                           ip_requests_per_minute=args.ip_requests_per_minute,
                           ip_signins_per_hour=args.ip_signins_per_hour, fail_cooldown_s=args.fail_cooldown_s, body_limit_bytes=args.body_limit_bytes,
                           signins_per_hour_total=args.signins_per_hour_total,
                           signins_per_domain_per_hour=args.signins_per_domain_per_hour,
                           signin_share_per_hour=args.signin_share_per_hour,
                           min_attempt_s=args.min_attempt_s, header_timeout_s=args.header_timeout_s,
                           body_timeout_s=args.body_timeout_s, limit_concurrency=args.limit_concurrency,
                           connections_per_address=args.connections_per_address, network_share=args.network_share,
                           unfinished_share=args.unfinished_share,
                           dev=s["dev"], smtp_host=s["smtp_host"], smtp_port=s["smtp_port"],
                           smtp_user=s["smtp_user"], smtp_from=s["smtp_from"])


def uvicorn_options(args) -> dict:
    """Proxy headers are off unless --forwarded-allow-ips names the proxies (uvicorn's own default
    trusts 127.0.0.1, which lets any local client pick its address with one header)."""
    from .httpguard import ProxyTrustError, trusted_proxies

    try:
        allow = ",".join(trusted_proxies(args.forwarded_allow_ips, public=args.trust_public_proxy))
    except ProxyTrustError as err:
        raise SystemExit(f"minimega serve: {err}") from None
    return {"host": args.host, "port": args.port, "log_level": "warning",
            "proxy_headers": bool(allow), "forwarded_allow_ips": allow or "", "server_header": False}


def site_is_stale(site_dir: Path, root: Path = Path("."), pin: str | None = None) -> bool:
    index = site_dir / "index.html"
    if not index.exists():
        return True
    if pin is not None:                  # the verify page must trust this service's current keys
        pinned = site_dir / trust.SITE_FILE
        if not pinned.exists() or set(trust.load_file(pinned)) != set(trust.parse_list(pin)):
            return True
    built = index.stat().st_mtime
    sources = [root / "mkdocs.yml", *(root / "course").rglob("*"), *(root / "quizzes").glob("*.yaml"),
               *(root / "src" / "minimega").glob("*.py"), root / "src" / "minimega" / "classroom" / "sitebuild.py"]
    return any(p.is_file() and p.stat().st_mtime > built for p in sources)


def build_site(site_dir: Path, issuers: list[str] = ()) -> None:
    """Build the site if stale, pinning `issuers` (this service's DIDs) as the verify page's trusted issuers."""
    if not Path("mkdocs.yml").exists():
        print("no mkdocs.yml here: serving the exam without the course site", file=sys.stderr)
        return
    pin = " ".join(issuers)
    if not site_is_stale(site_dir, pin=pin):
        return
    mkdocs = shutil.which("mkdocs") or (Path(sys.executable).parent / "mkdocs")
    if not Path(mkdocs).exists():
        print("the site is stale but mkdocs is not installed (pip install -e .[site]); serving the old one",
              file=sys.stderr)
        return
    print(f"building the site into {site_dir}/ …", file=sys.stderr, flush=True)
    done = subprocess.run([str(mkdocs), "build", "-q", "--site-dir", str(site_dir)],
                          env={**os.environ, trust.ENV: pin})
    if done.returncode:
        print(f"mkdocs build failed (exit {done.returncode}); serving what {site_dir}/ holds", file=sys.stderr)


def run_serve(args) -> int:
    import uvicorn                         # uvicorn and the guards load when the service starts, not for --help

    from .httpguard import install_repeat_filter, raise_open_files_limit, server_options

    from .service import create_app

    from .exam import ExamError
    from .keys import Keyring, KeyringError
    from .store import StoreError

    uvicorn_options(args)                # refuses what it cannot honour before anything is built
    try:
        config = config_from_args(args)
        from .mailer import mailer_for
        folder = banks.choose(config.banks_dir, dev=config.dev, allow_sample=config.allow_sample_bank)
        bank_set = banks.open_bank_set(folder, config.questions_per_chapter)   # refuse a service with no graded
        banks.refuse_sample(bank_set, dev=config.dev, allow_sample=config.allow_sample_bank)   # bank, or no way
        from .checkbank import refuse_disguised_sample           # nor one that is the sample in disguise
        bank_set = refuse_disguised_sample(bank_set, dev=config.dev, allow_sample=config.allow_sample_bank)
        mailer_for(config)           # to mail a sign-in link, before building anything
        secure_var_dir(config.var_dir)
        if not args.no_build:        # the key exists before the build so that the site can pin its DID
            ring = Keyring.open(config.keys_path, create=True)
            extra = trust.parse_list(os.environ.get(trust.ENV, ""))       # issuers trusted besides this one
            build_site(config.site_dir, trust.service_issuers(config.issuer_did, ring.publics) + extra)
        app = create_app(config)
    except (ExamError, KeyringError, StoreError, ValueError) as err:
        raise SystemExit(f"minimega serve: {err}")
    print(f"exam bank {bank_set.label} ({bank_set.folder})" +
          ("  SAMPLE BANK: public answers, certificates prove nothing" if bank_set.sample else ""), flush=True)
    print(f"minimega serving {config.base_url}/  (exam: {config.base_url}/exam/, "
          f"verify: {config.base_url}/verify/)", flush=True)
    if config.dev:
        print("development mode: sign-in links are printed here and shown on the page, not mailed", flush=True)
        if args.host not in ("127.0.0.1", "::1", "localhost"):
            print(f"WARNING: --dev while listening on {args.host}: anyone who reaches this port can sign in as "
                  "anyone. Use it only on a machine you alone can reach.", file=sys.stderr, flush=True)
    raise_open_files_limit()
    server = uvicorn.Server(uvicorn.Config(app, **uvicorn_options(args),
                                           **server_options(config, args.forwarded_allow_ips)))
    install_repeat_filter()              # after uvicorn.Config has set up its loggers
    server.run()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minimega.classroom.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    add_cert_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
