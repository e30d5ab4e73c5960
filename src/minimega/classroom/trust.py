"""Which issuers a verifier trusts.

A valid signature proves only that *some* key signed: anyone can make a did:key, put "minimega
course" in the issuer's name and sign a certificate. So both verifiers accept a certificate only
when its issuer's DID is on a list the verifier was given:

- the verify page: ``verify/trusted-issuers.json`` in the built site, written at build time from
  ``$MINIMEGA_TRUSTED_ISSUERS`` (`minimega serve` sets it to its own issuer: the did:web it is
  configured with, else the did:key of every signing key it holds);
- ``minimega cert verify``: ``--trust DID`` (repeatable), ``$MINIMEGA_TRUSTED_ISSUERS``, a trust
  file in the same format (``--trust-file``, ``$MINIMEGA_TRUST_FILE``, default
  ``~/.config/minimega/trusted-issuers.json``), and ``--issuer-url URL`` (the issuer that site
  publishes at ``/.well-known/did.json``, when the network is allowed).

The file format, for both::

    {"issuers": [{"id": "did:web:course.example", "name": "minimega course"}, ...]}

A trust file comes from outside: it is size-bounded and every entry is checked to be a did:key
(an Ed25519 Multikey) or a did:web host, so a typo fails loudly instead of trusting nothing.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from . import keys

ENV = "MINIMEGA_TRUSTED_ISSUERS"
FILE_ENV = "MINIMEGA_TRUST_FILE"
DEFAULT_FILE = Path("~/.config/minimega/trusted-issuers.json")
SITE_FILE = "verify/trusted-issuers.json"
"""Where the built site pins its issuers (relative to the site root)."""
MAX_FILE_BYTES = 64 * 1024
MAX_ISSUERS = 256

_DID_WEB = re.compile(r"^did:web:[A-Za-z0-9.-]+(%3A\d{1,5})?(:[A-Za-z0-9._~%-]+)*$")


class TrustError(ValueError):
    """A trusted-issuer entry or file that cannot be used."""


def check_did(did: object, where: str = "--trust") -> str:
    """`did` if it is a usable issuer DID (did:key with an Ed25519 key, or did:web), else TrustError."""
    if isinstance(did, str) and did.startswith("did:key:"):
        try:
            keys.parse_public_multikey(did[len("did:key:"):])
            return did
        except (keys.KeyringError, ValueError):
            pass
    elif isinstance(did, str) and _DID_WEB.match(did):
        return did
    raise TrustError(f"{where}: {str(did)[:80]!r} is not an issuer DID; use did:key:z6Mk… or did:web:<host>")


def parse_list(text: str, where: str = ENV) -> list[str]:
    """DIDs separated by whitespace or commas (the form of ``$MINIMEGA_TRUSTED_ISSUERS``)."""
    return [check_did(d, where) for d in re.split(r"[\s,]+", text.strip()) if d]


def load_file(path: Path) -> dict[str, str]:
    """DID -> name from a trust file; TrustError on anything malformed."""
    path = Path(path).expanduser()
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise TrustError(f"trust file {path}: {err.strerror or err}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise TrustError(f"trust file {path} is larger than {MAX_FILE_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise TrustError(f"trust file {path} is not JSON") from None
    entries = data.get("issuers") if isinstance(data, dict) else None
    if not isinstance(entries, list) or len(entries) > MAX_ISSUERS:
        raise TrustError(f'trust file {path}: expected {{"issuers": [{{"id": DID, "name": …}}, …]}} '
                         f"with at most {MAX_ISSUERS} entries")
    out = {}
    for e in entries:
        if not isinstance(e, dict):
            raise TrustError(f"trust file {path}: every entry is an object with an id")
        name = e.get("name") if isinstance(e.get("name"), str) else ""
        out[check_did(e.get("id"), f"trust file {path}")] = name[:100]
    return out


def to_json(issuers: dict[str, str]) -> str:
    """The trust-file / site-pin form of DID -> name."""
    return json.dumps({"issuers": [{"id": d, "name": n} for d, n in issuers.items()]}, indent=1) + "\n"


def from_env(env=os.environ) -> dict[str, str]:
    return {d: f"${ENV}" for d in parse_list(env.get(ENV, ""))}


def service_issuers(issuer_did: str | None, publics) -> list[str]:
    """The DIDs a service signs as: its did:web, else the did:key of every key it holds (old ones too)."""
    return [issuer_did] if issuer_did else [keys.did_key(p) for p in publics]


def write_site_files(site_dir: Path, env=os.environ) -> dict[str, str]:
    """Pin the verify page's trust at build time: ``verify/trusted-issuers.json`` (from
    ``$MINIMEGA_TRUSTED_ISSUERS``) and ``verify/contexts.json`` (the bundled JSON-LD contexts the
    page's eddsa-rdfc-2022 check needs; it never fetches a context). Returns the pinned issuers."""
    from . import canonical

    issuers = {d: "this site's issuer" for d in parse_list(env.get(ENV, ""))}
    out = Path(site_dir) / "verify"
    out.mkdir(parents=True, exist_ok=True)
    (out / "trusted-issuers.json").write_text(to_json(issuers), encoding="utf-8")
    contexts = {url: canonical.bundled_context(url) for url in canonical.CONTEXT_FILES}
    (out / "contexts.json").write_text(json.dumps(contexts, separators=(",", ":")), encoding="utf-8")
    return issuers
