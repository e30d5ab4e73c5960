"""`minimega cert …`: verify a certificate anywhere; revoke, erase or rotate keys on the service host.

`cert verify` decides which issuers it trusts first (--trust, the trust file, $MINIMEGA_TRUSTED_ISSUERS,
--issuer-url's own did:web), then checks the proofs offline (did:key needs nothing; did:web needs
--did-document or the network), the dates, then, when reachable, the signed status list. Exit status: 0 valid,
1 invalid, 2 usage, 3 signature valid but the issuer is not trusted.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from urllib.parse import quote

from . import trust
from .settings import ClassroomConfig

ISSUER_URL_ENV = "MINIMEGA_ISSUER_URL"


# --- cert ----------------------------------------------------------------------------------------

def add_cert_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("cert", help="verify, revoke and manage certificates",
                              description="Verify a certificate anywhere; revoke, erase or rotate keys on the service host.")
    sub = p.add_subparsers(dest="cert_command", required=True)

    v = sub.add_parser("verify", help="check a certificate's proofs, dates and revocation; show every claim")
    v.add_argument("credential", help="a credential file (.json, or a baked .svg) or a verification code")
    v.add_argument("--trust", action="append", default=[], metavar="DID",
                   help=f"also trust this issuer (did:key:z6Mk… or did:web:<host>); repeatable. Always trusted: "
                        f"${trust.ENV} (DIDs) and the trust file")
    v.add_argument("--trust-file", type=Path, default=os.environ.get(trust.FILE_ENV),
                   help=f'trusted issuers as {{"issuers": [{{"id": DID, "name": …}}]}}, e.g. a site\'s '
                        f"/{trust.SITE_FILE} (default ${trust.FILE_ENV}, else {trust.DEFAULT_FILE} if it exists)")
    v.add_argument("--issuer-url", default=os.environ.get(ISSUER_URL_ENV),
                   help=f"the issuing site: trust the issuer it publishes at /.well-known/did.json "
                        f"(default ${ISSUER_URL_ENV}); needed to look up a code")
    v.add_argument("--offline", action="store_true", help="no network: proofs and dates only")
    v.add_argument("--did-document", type=Path, help="a did.json to resolve a did:web issuer offline")
    v.add_argument("--status-list", type=Path, help="a status list credential file to use instead of fetching")
    v.add_argument("--json", action="store_true", help="machine-readable result")
    v.set_defaults(func=run_verify)

    r = sub.add_parser("revoke", help="revoke a certificate by its verification code (service host)")
    r.add_argument("code")
    r.add_argument("--reason", default="")
    r.add_argument("--var-dir", type=Path, default=ClassroomConfig().var_dir)
    r.add_argument("--db", default=os.environ.get("MINIMEGA_DB") or None,
                   help="the service's SQLite file or postgresql:// URL (default $MINIMEGA_DB, else VAR_DIR/classroom.sqlite3)")
    r.set_defaults(func=run_revoke)

    e = sub.add_parser("erase", help="erase a learner's data at their request (service host)",
                       description="Delete a learner's sign-ins, sessions, answers and hosted certificates and blank "
                                   "their attempts (GDPR art. 17). Their certificate codes and status bits stay, so "
                                   "the copies they hold still verify, as not revoked.")
    who = e.add_mutually_exclusive_group(required=True)
    who.add_argument("--email", help="the address the learner signed in with")
    who.add_argument("--code", help="the verification code of one of the learner's certificates")
    e.add_argument("--keys-dir", type=Path, help="where the pepper file is (default VAR_DIR/keys; or $MINIMEGA_PEPPER)")
    e.add_argument("--var-dir", type=Path, default=ClassroomConfig().var_dir)
    e.add_argument("--db", default=os.environ.get("MINIMEGA_DB") or None,
                   help="the service's SQLite file or postgresql:// URL (default $MINIMEGA_DB, else VAR_DIR/classroom.sqlite3)")
    e.set_defaults(func=run_erase)

    s = sub.add_parser("keys", help="show the signing keys' fingerprints and did:key ids (to pin or publish)")
    s.add_argument("--var-dir", type=Path, default=ClassroomConfig().var_dir)
    s.add_argument("--keys-dir", type=Path)
    s.set_defaults(func=run_keys)

    k = sub.add_parser("rotate-key", help="add a signing key; old keys keep verifying (service host)")
    k.add_argument("--var-dir", type=Path, default=ClassroomConfig().var_dir)
    k.add_argument("--keys-dir", type=Path)
    k.set_defaults(func=run_rotate)
    return p


def _fetch_json(url: str, timeout: float = 5.0):
    req = urllib.request.Request(url, headers={"Accept": "application/json", "User-Agent": "minimega-verify"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:          # noqa: S310 (http(s) only, checked)
        return json.loads(resp.read(2_000_000))


def load_credential_arg(arg: str, issuer_url: str | None, offline: bool):
    """(credential text or dict, source description) from a file path or a verification code."""
    from .certificate import unbake_svg
    from .verification_code import CodeError, normalize

    path = Path(arg)
    if path.is_file():
        text = path.read_text("utf-8", errors="replace")
        if text.lstrip().startswith("<"):
            try:
                return unbake_svg(text), f"{path} (baked SVG)"
            except ValueError as err:
                return f"<<{err}>>", str(path)
        return text, str(path)
    try:
        code = normalize(arg)
    except CodeError as err:
        raise SystemExit(f"{arg!r} is neither a file nor a verification code ({err})")
    if offline or not issuer_url:
        raise SystemExit("looking up a verification code needs the network and --issuer-url "
                         f"(or ${ISSUER_URL_ENV}); or pass the credential file")
    url = f"{issuer_url.rstrip('/')}/api/v1/credentials/{quote(code)}"
    try:
        return _fetch_json(url), url
    except urllib.error.HTTPError as err:
        raise SystemExit(f"{url}: HTTP {err.code} ({_error_detail(err) or 'unknown code?'})")
    except (urllib.error.URLError, OSError) as err:
        raise SystemExit(f"{url}: unreachable ({err})")


def _error_detail(err: urllib.error.HTTPError, limit: int = 4096) -> str:
    """The service's one-line reason (``{"detail": …}``), bounded and printable; '' if there is none."""
    try:
        detail = json.loads(err.read(limit)).get("detail")
    except (OSError, ValueError, AttributeError):
        return ""
    return "".join(ch for ch in detail[:300] if ch.isprintable()) if isinstance(detail, str) else ""


def trusted_issuers(args_trust=(), trust_file: Path | None = None, env=os.environ) -> dict[str, str]:
    """DID -> where its trust comes from: ``--trust``, ``$MINIMEGA_TRUSTED_ISSUERS``, the trust file."""
    out = {}
    path = trust_file
    if path is None and trust.DEFAULT_FILE.expanduser().is_file():
        path = trust.DEFAULT_FILE
    if path is not None:
        out.update({d: f"trust file {path}" for d in trust.load_file(Path(path))})
    out.update(trust.from_env(env))
    out.update({trust.check_did(d): "--trust" for d in args_trust})
    return out


def verify_with_network(cred, *, trusted: dict[str, str], issuer_url=None, offline=False, did_document=None,
                        status_list=None):
    """Run `credential.verify` with whatever the network and the arguments can supply.

    Returns (result, notes, the trusted issuers: `trusted` plus what --issuer-url publishes)."""
    from . import credential, keys, status_list as sl

    notes = []
    parsed = cred
    if isinstance(cred, str):
        try:
            parsed = json.loads(cred)
        except ValueError:
            parsed = None
    trusted = dict(trusted)
    did_docs, status_doc = {}, status_list
    if isinstance(did_document, dict) and isinstance(did_document.get("id"), str):
        did_docs[did_document["id"]] = did_document
    issuer = parsed.get("issuer") if isinstance(parsed, dict) else None
    issuer_id = issuer.get("id") if isinstance(issuer, dict) else None
    if issuer_url and offline:
        notes.append(f"--offline: the issuer published at {issuer_url} was not fetched, so not trusted from it")
    # 1. Trust is decided first, from what the verifier chose (--trust, the trust file, the environment, and
    #    the one site --issuer-url names). Nothing the credential names is fetched before that.
    if issuer_url and not offline:
        url = issuer_url.rstrip("/") + "/.well-known/did.json"
        try:
            doc = _fetch_json(url)
            own = keys.did_web(urllib.parse.urlparse(issuer_url).netloc)
            if doc.get("id") != own:        # a site speaks for its own host only
                raise ValueError(f"it describes {str(doc.get('id'))[:80]!r}, not {own}")
            # the site's did:web, and the did:keys it says it signs with (self-certifying)
            aka = [d for d in doc.get("alsoKnownAs") or [] if isinstance(d, str) and d.startswith("did:key:")]
            for did in [own, *aka]:
                trusted.setdefault(trust.check_did(did, url), f"published by {issuer_url}")
            did_docs.setdefault(own, doc)
        except (OSError, ValueError, AttributeError, TypeError, keys.KeyringError) as err:
            notes.append(f"could not use {url}, so its issuer is not trusted: {err}")
    # 2. Only a trusted issuer's DID document and status list are fetched.
    if not offline and isinstance(issuer_id, str) and issuer_id not in trusted:
        notes.append(f"the issuer {issuer_id[:80]} is not trusted: nothing the credential names was fetched")
    elif not offline and isinstance(issuer_id, str):
        if issuer_id.startswith("did:web:") and issuer_id not in did_docs:
            try:
                did_docs[issuer_id] = _fetch_json(keys.did_web_url(issuer_id))
            except (OSError, ValueError, keys.KeyringError) as err:
                notes.append(f"could not fetch the DID document of {issuer_id[:80]}: {err}")
        if status_doc is None and isinstance(parsed, dict):
            try:
                url, _ = sl.parse_entry(parsed.get("credentialStatus"))
                status_doc = _fetch_json(url)
            except sl.StatusListError:
                pass                    # reported by verify() itself
            except (OSError, ValueError) as err:
                notes.append(f"revocation not checked: status list unreachable ({err})")
    result = credential.verify(cred, trusted_issuers=trusted, did_documents=did_docs,
                               status_list_credential=status_doc)
    if not trusted:
        notes.append(f"no trusted issuer is configured: pass --trust DID or --issuer-url URL, or set ${trust.ENV}")
    return result, notes, trusted


LABELS = [("name", "Name"), ("achievement", "Achievement"), ("course_version", "Course version"),
          ("exam_bank", "Exam bank"),
          ("valid_from", "Issued"), ("valid_until", "Expires"), ("issuer_name", "Issuer"),
          ("issuer_id", "Issuer DID"), ("issuer_url", "Issuer URL"), ("credential_id", "Credential"),
          ("email", "Email"), ("criteria", "Criteria")]
HEADLINE = {"valid": "VALID", "invalid": "INVALID", "signature valid, issuer not trusted":
            "NOT TRUSTED (signature valid, issuer not trusted)"}
MARK = {"pass": "pass", "fail": "FAIL", "n/a": "n/a "}


def _read_json_arg(path: Path, what: str):
    try:
        with open(path, "rb") as f:
            raw = f.read(2_000_001)
        if len(raw) > 2_000_000:
            raise SystemExit(f"{what} {path} is larger than 2 MB")
        return json.loads(raw)
    except (OSError, ValueError) as err:
        raise SystemExit(f"{what} {path}: not a readable JSON file ({err})")


def _print_result(result, source: str, notes: list[str]) -> None:
    """The verdict first (and, when it is not VALID, why), then the claims: each marked "(not verified)" unless
    the credential is valid, so forged words never read as facts."""
    print(f"{HEADLINE[result.verdict]}  {source}")
    if not result.valid:
        for err in result.errors[:10]:
            print(f"  because: {err[:300]}")
    mark = "" if result.valid else "  (not verified)"
    for key, label in LABELS:
        value = result.claims.get(key)
        if key == "valid_until" and value is None and result.claims:
            value = "never"
        if value is not None:
            print(f"  {label:<15} {value}{mark}")
    print(f"  {'Revocation':<15} {result.revocation}")
    for c in result.checks:
        print(f"  {MARK[c.status]} {c.name}: {c.detail}")
    for note in notes:
        print(f"  note: {note}")
    sys.stdout.flush()


def run_verify(args) -> int:
    try:
        trusted = trusted_issuers(args.trust, args.trust_file)
    except trust.TrustError as err:
        raise SystemExit(f"minimega cert verify: {err}")
    cred, source = load_credential_arg(args.credential, args.issuer_url, args.offline)
    did_document = _read_json_arg(args.did_document, "--did-document") if args.did_document else None
    status = _read_json_arg(args.status_list, "--status-list") if args.status_list else None
    result, notes, trusted = verify_with_network(cred, trusted=trusted, issuer_url=args.issuer_url, offline=args.offline,
                                        did_document=did_document, status_list=status)
    code = {"valid": 0, "invalid": 1}.get(result.verdict, 3)
    if args.json:
        try:
            print(json.dumps({**result.to_dict(), "source": source, "notes": notes,
                              "trusted_issuers": trusted}, indent=2, ensure_ascii=False), flush=True)
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return code
    try:
        _print_result(result, source, notes)
    except BrokenPipeError:                 # `cert verify … | head`: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    if not result.valid:
        print("Rejected because: " + "; ".join(result.errors)[:2000], file=sys.stderr)
    return code


def _service_store(args):
    """The service's store, as --db or --var-dir name it; never creates a database that is not there."""
    from .store import StoreError
    from .stores import open_store

    db = args.db or args.var_dir / "classroom.sqlite3"
    if "://" not in str(db) and not Path(db).exists():
        raise SystemExit(f"no database at {db} (pass --db or --var-dir of the service)")
    try:
        return open_store(db)
    except StoreError as err:
        raise SystemExit(f"minimega cert {args.cert_command}: {err}")


def run_erase(args) -> int:
    import time

    from .exam import ExamError, clean_email, learner_key
    from .pepper import load_pepper
    from .store import ERASED, StoreError
    from .verification_code import CodeError, normalize

    store = _service_store(args)
    if args.email is not None:
        try:
            key = learner_key(load_pepper(args.keys_dir or args.var_dir / "keys", store), clean_email(args.email))
        except StoreError as err:
            raise SystemExit(f"minimega cert erase: {err}")
        except ExamError as err:
            raise SystemExit(f"--email: {err}")
        who = "that address"
    else:
        try:
            code = normalize(args.code)
        except CodeError as err:
            raise SystemExit(f"--code {args.code!r}: {err}")
        row = store.credential_by_code(code)
        if row is None:
            raise SystemExit(f"no credential with code {code} in {store.where}")
        key = store.attempt(row["attempt_id"])["learner_key"]
        if key == ERASED:
            print(f"{code}: its holder's data was erased already")
            return 0
        who = f"the holder of {code}"
    counts = store.erase_learner(key, time.time())
    if not any(counts.values()):
        print(f"nothing stored for {who} in {store.where}")
        return 0
    print(f"erased {who}: " + ", ".join(f"{n} {table}" for table, n in counts.items()) +
          "; certificate codes and status bits kept (the holder's copies still verify)")
    return 0


def run_revoke(args) -> int:
    from .store import StoreError
    from .verification_code import CodeError, normalize

    try:
        code = normalize(args.code)
    except CodeError as err:
        raise SystemExit(f"{args.code!r}: {err}")
    import time
    store = _service_store(args)
    try:
        changed = store.revoke(code, args.reason, time.time())
    except StoreError as err:
        raise SystemExit(f"minimega cert revoke: {err}")
    except KeyError:
        raise SystemExit(f"no credential with code {code} in {store.where}")
    print(f"{code}: {'revoked' if changed else 'was already revoked'}; "
          "the signed status list shows it from its next fetch")
    return 0


def run_keys(args) -> int:
    from .keys import Keyring, did_key

    ring = Keyring.open(args.keys_dir or args.var_dir / "keys", create=False)
    for key in ring.keys:
        role = "signs new certificates" if key is ring.active else "verifies older certificates"
        print(f"{key.fingerprint}  {did_key(key.public)[:24]}…  {role}  ({key.source})")
    return 0


def run_rotate(args) -> int:
    from .keys import Keyring

    folder = args.keys_dir or args.var_dir / "keys"
    ring = Keyring.open(folder, create=False)
    new = ring.rotate(folder)
    print(f"new signing key {new.fingerprint} at {new.source}; {len(ring.keys) - 1} older key(s) stay "
          "published so their credentials keep verifying. Restart the service to sign with it.")
    return 0
