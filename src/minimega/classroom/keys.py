"""Ed25519 signing keys, their Multikey encodings, and the issuer's DID document.

The private key lives only with the service: a 0600 PEM file under the key folder (``var/keys`` by
default) or the ``MINIMEGA_SIGNING_KEY`` environment variable (a ``z3u2…`` multibase private key).
On first start with neither, `Keyring.open(..., create=True)` writes a *development* key and
warns loudly: credentials it signs are only as trustworthy as the machine holding it.

Rotation (`Keyring.rotate`) adds a key and makes it the one that signs; old keys stay in the folder and
in ``/.well-known/did.json``, so every credential signed before still verifies.

Encodings (W3C Controlled Identifiers, Multikey):

- public key  = ``z`` + base58btc(0xed 0x01 ‖ 32 bytes)   → ``z6Mk…``
- private key = ``z`` + base58btc(0x80 0x26 ‖ 32-byte seed) → ``z3u2…``
- ``did:key:z6Mk…`` resolves to that one key, with fragment ``#z6Mk…``; a ``did:web`` key id is
  ``did:web:<host>#z6Mk…`` (the fingerprint again), so key ids never collide across rotations.
"""
from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote, unquote

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

log = logging.getLogger(__name__)

ENV_KEY = "MINIMEGA_SIGNING_KEY"
ED25519_PUB = b"\xed\x01"
ED25519_PRIV = b"\x80\x26"
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


class KeyringError(ValueError):
    """A key that cannot be used: malformed encoding, wrong permissions, unknown id."""


# --- base58btc and multibase -----------------------------------------------------------------

def b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def b58decode(text: str) -> bytes:
    n = 0
    for ch in text:
        i = _B58.find(ch)
        if i < 0:
            raise KeyringError(f"{ch!r} is not a base58btc character")
        n = n * 58 + i
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    return b"\0" * (len(text) - len(text.lstrip("1"))) + body


def multibase_decode(value: str) -> bytes:
    if not isinstance(value, str) or not value.startswith("z") or len(value) < 2:
        raise KeyringError(f"expected a base58btc multibase string starting with 'z', got {value!r:.40}")
    return b58decode(value[1:])


# --- Multikey -------------------------------------------------------------------------------

def public_multikey(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "z" + b58encode(ED25519_PUB + raw)


def parse_public_multikey(value: str) -> Ed25519PublicKey:
    raw = multibase_decode(value)
    if raw[:2] != ED25519_PUB or len(raw) != 34:
        raise KeyringError(f"{value!r:.60} is not an Ed25519 Multikey (0xed01 + 32 bytes)")
    return Ed25519PublicKey.from_public_bytes(raw[2:])


def private_multikey(key: Ed25519PrivateKey) -> str:
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())
    return "z" + b58encode(ED25519_PRIV + raw)


def parse_private_multikey(value: str) -> Ed25519PrivateKey:
    raw = multibase_decode(value.strip())
    if raw[:2] != ED25519_PRIV or len(raw) != 34:
        raise KeyringError("not an Ed25519 private Multikey (0x8026 + 32-byte seed)")
    return Ed25519PrivateKey.from_private_bytes(raw[2:])


def verify_signature(public: Ed25519PublicKey, signature: bytes, data: bytes) -> bool:
    try:
        public.verify(signature, data)
        return True
    except InvalidSignature:
        return False


# --- DIDs -----------------------------------------------------------------------------------

def did_key(public: Ed25519PublicKey) -> str:
    return "did:key:" + public_multikey(public)


def did_web(host: str) -> str:
    """did:web for a host (a port is percent-encoded: ``localhost:8000`` -> ``did:web:localhost%3A8000``)."""
    host = host.strip().rstrip("/")
    if "://" in host or "/" in host or not host:
        raise KeyringError(f"did:web takes a bare host[:port], got {host!r}")
    return "did:web:" + quote(host, safe="")


WEB_HOST = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*")
WEB_SEGMENT = re.compile(r"[A-Za-z0-9._~-]{1,100}")
LOOPBACK = ("localhost", "127.0.0.1")


def did_web_url(did: str) -> str:
    """Where a did:web document lives (https, or http for localhost/127.0.0.1 during development).

    The host must decode to a plain DNS name: a decoded ``@``, ``/``, ``?``, ``#``, ``:`` or a port would let a
    credential point the verifier at any host:port or path (user info, a path in the host). A port is allowed
    for localhost and 127.0.0.1 only (a service under development)."""
    if not did.startswith("did:web:"):
        raise KeyringError(f"{did[:80]!r} is not a did:web")
    raw = did[len("did:web:"):].split(":")
    host, path = unquote(raw[0]).lower(), [unquote(p) for p in raw[1:]]
    name, _, port = host.partition(":")
    if port and not (name in LOOPBACK and port.isdigit() and 0 < int(port) < 65536):
        raise KeyringError(f"did:web host {host[:80]!r}: a port is allowed for localhost only")
    if not (WEB_HOST.fullmatch(name) and len(name) <= 253) or any(not WEB_SEGMENT.fullmatch(p) for p in path):
        raise KeyringError(f"did:web {did[:80]!r}: the host must decode to a plain DNS name and each path segment "
                           "to letters, digits, '.', '_', '~' or '-' (no '@', '/', '?', '#' or ':')")
    scheme = "http" if name in LOOPBACK else "https"
    return f"{scheme}://{host}/" + ("/".join(path) + "/did.json" if path else ".well-known/did.json")


def did_document(did: str, publics: list[Ed25519PublicKey], also_known_as: list[str] = ()) -> dict:
    """A DID document publishing every key (old ones too) as an assertion method."""
    methods = [{"id": f"{did}#{public_multikey(p)}", "type": "Multikey", "controller": did,
                "publicKeyMultibase": public_multikey(p)} for p in publics]
    doc = {"@context": ["https://www.w3.org/ns/did/v1", "https://w3id.org/security/multikey/v1"],
           "id": did, "verificationMethod": methods,
           "assertionMethod": [m["id"] for m in methods]}
    if also_known_as:
        doc["alsoKnownAs"] = list(also_known_as)
    return doc


def resolve_verification_method(vm_id: str, did_documents: dict[str, dict] | None = None) -> Ed25519PublicKey:
    """The public key behind a verification method id, or `KeyringError` saying why not.

    ``did:key`` resolves offline; anything else must be in `did_documents` (DID -> document) and be
    listed under ``assertionMethod`` there.
    """
    if not isinstance(vm_id, str) or "#" not in vm_id:
        raise KeyringError("verification method has no '#key' fragment")
    did, frag = vm_id.split("#", 1)
    if did.startswith("did:key:"):
        fingerprint = did[len("did:key:"):]
        if frag != fingerprint:
            raise KeyringError(f"unknown key id #{frag[:24]}: a did:key only holds #{fingerprint[:24]}…")
        try:
            return parse_public_multikey(fingerprint)
        except (KeyringError, ValueError):
            raise KeyringError(f"did:key {fingerprint[:24]}… is not an Ed25519 Multikey") from None
    doc = (did_documents or {}).get(did)
    if not isinstance(doc, dict):
        raise KeyringError(f"no DID document for {did[:80]} (pass one, or verify online)")
    if vm_id not in (doc.get("assertionMethod") or []):
        raise KeyringError(f"unknown key id {vm_id[:120]}: not an assertion method of {did[:80]}")
    for m in doc.get("verificationMethod") or []:
        if isinstance(m, dict) and m.get("id") == vm_id and m.get("controller") == did:
            try:
                return parse_public_multikey(m.get("publicKeyMultibase"))
            except (KeyringError, ValueError):
                raise KeyringError(f"key {vm_id[:120]} is not an Ed25519 Multikey") from None
    raise KeyringError(f"unknown key id {vm_id[:120]}: not in the verificationMethod of {did[:80]}")


# --- the service's keyring ------------------------------------------------------------------

@dataclass(frozen=True)
class SigningKey:
    private: Ed25519PrivateKey
    source: str
    """A file path, or the environment variable's name."""

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    @property
    def fingerprint(self) -> str:
        return public_multikey(self.public)


class Keyring:
    """Every signing key the service has used, newest last; the newest signs."""

    def __init__(self, keys: list[SigningKey]):
        if not keys:
            raise KeyringError("a keyring needs at least one key")
        self.keys = keys

    @property
    def active(self) -> SigningKey:
        return self.keys[-1]

    @property
    def publics(self) -> list[Ed25519PublicKey]:
        return [k.public for k in self.keys]

    @classmethod
    def open(cls, folder: str | Path, *, create: bool = False) -> "Keyring":
        """Load ``folder/key-*.pem`` (oldest first) and, last, the env key if set.

        With `create` and no key at all, writes a development key (0600) and warns on stderr.
        """
        folder = Path(folder)
        keys = [_load_pem(p) for p in sorted(folder.glob("key-*.pem"))] if folder.is_dir() else []
        if os.environ.get(ENV_KEY):
            try:
                env = parse_private_multikey(os.environ[ENV_KEY])
            except (KeyringError, ValueError) as err:
                raise KeyringError(f"{ENV_KEY} is set but is not a z3u2… Ed25519 private Multikey: {err}") from err
            keys = [k for k in keys if k.fingerprint != public_multikey(env.public_key())]
            keys.append(SigningKey(env, ENV_KEY))
        if not keys:
            if not create:
                raise KeyringError(f"no signing key in {folder} and {ENV_KEY} is unset; "
                                "start `minimega serve` once to create a development key")
            keys.append(_write_new_key(folder))
            _warn_dev_key(keys[-1])
        return cls(keys)

    def rotate(self, folder: str | Path) -> SigningKey:
        """Create a new key in `folder`; it signs from now on, the old ones keep verifying."""
        new = _write_new_key(Path(folder))
        self.keys = [k for k in self.keys if k.source != ENV_KEY] + [new] + \
                    [k for k in self.keys if k.source == ENV_KEY]
        return new


def _load_pem(path: Path) -> SigningKey:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise KeyringError(f"{path} is readable by others (mode {mode:o}); run `chmod 600 {path}`")
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyringError(f"{path} is not an Ed25519 private key")
    return SigningKey(key, str(path))


def _write_new_key(folder: Path) -> SigningKey:
    if not folder.parent.exists():          # the service's var folder (keys, database, pepper): owner only
        folder.parent.mkdir(parents=True, mode=0o700)
        os.chmod(folder.parent, 0o700)
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    path = folder / f"key-{stamp}.pem"
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)   # never world-readable, not even briefly
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
        f.flush()
        os.fsync(f.fileno())
    return SigningKey(key, str(path))


def _warn_dev_key(key: SigningKey) -> None:
    bar = "!" * 78
    print(f"\n{bar}\n!! DEVELOPMENT SIGNING KEY created at {key.source}\n"
          f"!! fingerprint {key.fingerprint}\n"
          f"!! Credentials signed with it are for testing only. For a real course, set {ENV_KEY}\n"
          f"!! from a secret store (or place a 0600 key-*.pem there) and publish did:web.\n{bar}\n",
          file=sys.stderr, flush=True)
