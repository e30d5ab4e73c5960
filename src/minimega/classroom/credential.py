"""Open Badges 3.0 certificates (W3C VC 2.0) with two Data Integrity EdDSA proofs, and their verifier.

Shape of an issued credential (all of it is signed)::

    {"@context": [VC 2.0, OB 3.0.3], "id": "urn:uuid:…",
     "type": ["VerifiableCredential", "OpenBadgeCredential"],
     "issuer": {"id": did, "type": ["Profile"], "name": …, "url": …},
     "validFrom": …, ["validUntil": …],
     "credentialSubject": {"type": ["AchievementSubject"],
         "identifier": [{display name, hashed: false}, {sha256$ of email+salt, hashed: true}],
         "achievement": {id, name, description, criteria.narrative, version = course version}},
     "credentialStatus": {BitstringStatusListEntry},
     "proof": [{eddsa-rdfc-2022}, {eddsa-jcs-2022}]}

Proofs (W3C vc-di-eddsa, a proof set: each proof covers the document without `proof`):

    hashData = SHA-256(canonical(proofConfig)) ‖ SHA-256(canonical(document))   (64 bytes)
    proofValue = "z" + base58btc(Ed25519.sign(hashData))

where canonical is RDFC-1.0 N-Quads for ``eddsa-rdfc-2022`` and RFC 8785 JSON for ``eddsa-jcs-2022``,
and proofConfig is the proof without `proofValue`, with the document's ``@context``.

`verify` checks both proofs, the key (did:key offline, did:web from a DID document), that the key's
controller is the issuer, the dates, and revocation when a status list is given; it returns every
signed claim alongside the verdict so that nobody has to trust a bare "valid".
"""
from __future__ import annotations

import hashlib
import json
import secrets
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from . import canonical, keys, status_list
from .keys import Ed25519PrivateKey, KeyringError

VC_V2 = "https://www.w3.org/ns/credentials/v2"
OB_V3 = "https://purl.imsglobal.org/spec/ob/v3p0/context-3.0.3.json"
CONTEXT = [VC_V2, OB_V3]
SUITES = ("eddsa-rdfc-2022", "eddsa-jcs-2022")


def now_utc() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object, name: str) -> datetime:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be an XML Schema dateTime string, got {value!r:.40}")
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as err:
        raise ValueError(f"{name} {value!r:.40} is not a dateTime") from err
    if t.tzinfo is None:
        raise ValueError(f"{name} {value!r} has no time zone")
    return t


# --- issuing ---------------------------------------------------------------------------------

def email_identity(email: str, salt: str | None = None) -> dict:
    """OB 3.0 IdentityObject for an email: ``sha256$`` + hex(SHA-256(email + salt)), never the email."""
    salt = salt or secrets.token_hex(16)
    digest = hashlib.sha256((email.strip().lower() + salt).encode("utf-8")).hexdigest()
    return {"type": "IdentityObject", "identityType": "emailAddress", "hashed": True,
            "identityHash": f"sha256${digest}", "salt": salt}


def build_credential(*, issuer: dict, display_name: str, achievement: dict, status: dict,
                     valid_from: datetime, valid_until: datetime | None = None,
                     email_id: dict | None = None, credential_id: str | None = None) -> dict:
    """The unsigned OpenBadgeCredential; `email_id` is an `email_identity(...)` (a salted hash)."""
    identifiers = [{"type": "IdentityObject", "identityType": "name", "hashed": False,
                    "identityHash": display_name}]
    if email_id:
        identifiers.append(email_id)
    doc = {
        "@context": list(CONTEXT),
        "id": credential_id or f"urn:uuid:{uuid.uuid4()}",
        "type": ["VerifiableCredential", "OpenBadgeCredential"],
        "name": achievement["name"],
        "issuer": issuer,
        "validFrom": iso(valid_from),
        "credentialSubject": {"type": ["AchievementSubject"], "identifier": identifiers,
                              "achievement": achievement},
        "credentialStatus": status,
    }
    if valid_until is not None:
        doc["validUntil"] = iso(valid_until)
    return doc


def _hash_data(document: dict, proof_config: dict, suite: str, extra_contexts=None) -> bytes:
    if suite == "eddsa-jcs-2022":
        doc_bytes, config_bytes = canonical.jcs(document), canonical.jcs(proof_config)
    elif suite == "eddsa-rdfc-2022":
        doc_bytes = canonical.rdfc(document, extra_contexts).encode("utf-8")
        config_bytes = canonical.rdfc(proof_config, extra_contexts).encode("utf-8")
    else:
        raise ValueError(f"unsupported cryptosuite {suite!r}; use one of {SUITES}")
    return hashlib.sha256(config_bytes).digest() + hashlib.sha256(doc_bytes).digest()


def create_proof(document: dict, private: Ed25519PrivateKey, verification_method: str, suite: str,
                 created: datetime | None = None, extra_contexts=None) -> dict:
    """One DataIntegrityProof over `document` (which must not hold a `proof`)."""
    if "proof" in document:
        raise ValueError("sign the unsecured document: remove 'proof' first")
    options = {"type": "DataIntegrityProof", "cryptosuite": suite, "created": iso(created or now_utc()),
               "verificationMethod": verification_method, "proofPurpose": "assertionMethod"}
    config = {**options, "@context": document["@context"]}
    signature = private.sign(_hash_data(document, config, suite, extra_contexts))
    # the jcs suite carries the @context inside the proof (vc-di-eddsa §3.3.1); rdfc does not
    proof = config if suite == "eddsa-jcs-2022" else options
    return {**proof, "proofValue": "z" + keys.b58encode(signature)}


def add_proofs(document: dict, private: Ed25519PrivateKey, verification_method: str,
               created: datetime | None = None) -> dict:
    """`document` with a proof set of both cryptosuites."""
    created = created or now_utc()
    proofs = [create_proof(document, private, verification_method, s, created) for s in SUITES]
    return {**document, "proof": proofs}


# --- verifying -------------------------------------------------------------------------------

@dataclass
class Verification:
    """The verdict, the reasons behind it, and every signed claim."""

    valid: bool = False
    errors: list[str] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    claims: dict = field(default_factory=dict)
    revocation: str = "not checked (offline)"

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((name, ok, detail))
        if not ok:
            self.errors.append(f"{name}: {detail}" if detail else name)
        return ok

    def to_dict(self) -> dict:
        return {"valid": self.valid, "errors": self.errors, "revocation": self.revocation,
                "claims": self.claims,
                "checks": [{"check": n, "ok": ok, "detail": d} for n, ok, d in self.checks]}


def verify_proof(document: dict, proof: dict, public, extra_contexts=None) -> str | None:
    """None if `proof` is a valid signature on `document` (without its `proof`) by `public`, else why not."""
    suite = proof.get("cryptosuite")
    if proof.get("type") != "DataIntegrityProof" or suite not in SUITES:
        return f"unsupported proof type {proof.get('type')!r} / cryptosuite {suite!r}"
    if proof.get("proofPurpose") != "assertionMethod":
        return f"proofPurpose is {proof.get('proofPurpose')!r}, expected 'assertionMethod'"
    config = {k: v for k, v in proof.items() if k != "proofValue"}
    if "@context" in config and config["@context"] != document.get("@context"):
        return "the proof's @context differs from the document's"
    if suite == "eddsa-rdfc-2022":      # jcs signs the proof exactly as written (with or without @context)
        config["@context"] = document.get("@context")
    try:
        signature = keys.multibase_decode(proof.get("proofValue", ""))
    except KeyringError as err:
        return f"proofValue is not multibase: {err}"
    if len(signature) != 64:
        return f"proofValue holds {len(signature)} bytes, an Ed25519 signature has 64 (truncated?)"
    try:
        data = _hash_data(document, config, suite, extra_contexts)
    except (canonical.CanonicalizationError, ValueError) as err:
        return f"cannot canonicalize: {err}"
    if not keys.verify_signature(public, signature, data):
        return "signature does not match the document (edited, or signed by another key)"
    return None


def _verify_proof_set(doc: dict, result: Verification, did_documents, trusted_keys, label: str):
    """Check every required proof; returns the signer's Multikey when all pass."""
    proofs = doc.get("proof")
    proofs = [proofs] if isinstance(proofs, dict) else proofs
    if not isinstance(proofs, list) or not proofs or not all(isinstance(p, dict) for p in proofs):
        result.check(f"{label} proofs", False, "no Data Integrity proof")
        return None
    unsecured = {k: v for k, v in doc.items() if k != "proof"}
    issuer = doc.get("issuer")
    issuer_id = issuer.get("id") if isinstance(issuer, dict) else issuer
    suites = [p.get("cryptosuite") for p in proofs]
    result.check(f"{label} proof suites", sorted(suites) == sorted(SUITES),
                 f"found {suites}, expected one proof of each of {list(SUITES)}")
    signer = None
    for p in proofs:
        name = f"{label} {p.get('cryptosuite')} proof"
        vm = p.get("verificationMethod")
        try:
            public = keys.resolve_verification_method(vm, did_documents)
        except (KeyringError, ValueError) as err:
            result.check(name, False, str(err))
            continue
        if not isinstance(vm, str) or vm.split("#")[0] != issuer_id:
            result.check(name, False, f"key {vm!r:.80} is not controlled by the issuer {issuer_id!r:.80}")
            continue
        why = verify_proof(unsecured, p, public)
        if result.check(name, why is None, why or f"signed by {keys.public_multikey(public)}"):
            signer = keys.public_multikey(public)
    if signer and trusted_keys is not None:
        result.check(f"{label} issuer key", signer in trusted_keys,
                     "published by the issuer" if signer in trusted_keys else
                     f"key {signer[:20]}… is not one the issuer publishes")
    return signer


def claims_of(doc: dict) -> dict:
    """The human-readable claims of an OpenBadgeCredential (as written in it; check `valid`)."""
    subject = doc.get("credentialSubject") if isinstance(doc.get("credentialSubject"), dict) else {}
    achievement = subject.get("achievement") if isinstance(subject.get("achievement"), dict) else {}
    issuer = doc.get("issuer") if isinstance(doc.get("issuer"), dict) else {"id": doc.get("issuer")}
    ids = [i for i in subject.get("identifier", []) if isinstance(i, dict)]
    name = next((i.get("identityHash") for i in ids if i.get("identityType") == "name"), None)
    email = next((i for i in ids if i.get("identityType") == "emailAddress"), None)
    criteria = achievement.get("criteria") if isinstance(achievement.get("criteria"), dict) else {}
    return {
        "name": name, "achievement": achievement.get("name"),
        "description": achievement.get("description"), "criteria": criteria.get("narrative"),
        "course_version": achievement.get("version"), "valid_from": doc.get("validFrom"),
        "valid_until": doc.get("validUntil"), "issuer_name": issuer.get("name"),
        "issuer_id": issuer.get("id"), "issuer_url": issuer.get("url"), "credential_id": doc.get("id"),
        "email": "salted SHA-256 hash" if email else "none",
    }


def _check_shape(doc: dict, result: Verification) -> bool:
    ctx = doc.get("@context")
    ok = result.check("@context", isinstance(ctx, list) and ctx[:1] == [VC_V2] and OB_V3 in ctx,
                      f"must start with {VC_V2} and include {OB_V3}, got {ctx!r:.160}")
    types = doc.get("type") if isinstance(doc.get("type"), list) else []
    ok &= result.check("type", {"VerifiableCredential", "OpenBadgeCredential"} <= set(types),
                       f"must include VerifiableCredential and OpenBadgeCredential, got {types}")
    subject = doc.get("credentialSubject")
    ok &= result.check("credentialSubject", isinstance(subject, dict) and isinstance(subject.get("achievement"), dict),
                       "needs an achievement")
    issuer = doc.get("issuer")
    ok &= result.check("issuer", isinstance(issuer, dict) and isinstance(issuer.get("id"), str),
                       "needs an issuer profile with an id")
    return ok


def _check_dates(doc: dict, result: Verification, now: datetime, label: str) -> None:
    try:
        valid_from = parse_time(doc.get("validFrom"), "validFrom")
        result.check(f"{label} validFrom", valid_from <= now + timedelta(minutes=5),
                     f"not valid before {iso(valid_from)}")
        if "validUntil" in doc:
            until = parse_time(doc["validUntil"], "validUntil")
            stale = "stale: it expired" if label == "status list" else "expired"
            result.check(f"{label} validUntil", now <= until, f"{stale} on {iso(until)}")
    except ValueError as err:
        result.check(f"{label} dates", False, str(err))


def _check_status(doc: dict, status_doc: dict, result: Verification, did_documents, now) -> None:
    try:
        url, index = status_list.parse_entry(doc.get("credentialStatus"))
    except status_list.StatusListError as err:
        result.check("credentialStatus", False, str(err))
        return
    sub = Verification()
    if not isinstance(status_doc, dict):
        result.check("status list", False, "not a JSON object")
        return
    signer = _verify_proof_set(status_doc, sub, did_documents, None, "status list")
    issuer = doc["issuer"]["id"] if isinstance(doc.get("issuer"), dict) else None
    sub.check("status list issuer", status_doc.get("issuer") == issuer,
              f"issued by {status_doc.get('issuer')!r:.60}, not by the credential's issuer")
    sub.check("status list id", status_doc.get("id") == url, f"is {status_doc.get('id')!r:.80}, expected {url}")
    _check_dates(status_doc, sub, now, "status list")
    if sub.errors:
        result.checks += sub.checks
        result.errors += [f"status list rejected (stale or forged): {e}" for e in sub.errors]
        result.revocation = "unknown: the status list was rejected"
        return
    subject = status_doc.get("credentialSubject", {})
    try:
        if subject.get("type") != "BitstringStatusList" or subject.get("statusPurpose") != status_list.PURPOSE:
            raise status_list.StatusListError("credentialSubject is not a revocation BitstringStatusList")
        revoked = status_list.bit(status_list.decode(subject.get("encodedList")), index)
    except (status_list.StatusListError, AttributeError) as err:
        result.check("status list", False, str(err))
        return
    result.checks += sub.checks
    as_of = status_doc.get("validFrom")
    result.revocation = f"revoked (status list of {as_of})" if revoked else f"not revoked (as of {as_of})"
    result.check("revocation", not revoked, f"revoked by the issuer (status list of {as_of})"
                 if revoked else f"not revoked as of {as_of}; signed by {signer[:16]}…")


def verify(credential: dict | str | bytes, *, did_documents: dict | None = None,
           trusted_keys: set[str] | None = None, status_list_credential: dict | None = None,
           now: datetime | None = None) -> Verification:
    """Verify an OpenBadgeCredential; never raises on bad input, reports it instead.

    Args:
        credential: the parsed credential, or its JSON text.
        did_documents: DID -> DID document, for did:web issuers (did:key needs none).
        trusted_keys: Multikeys the expected issuer publishes; None skips this check (offline).
        status_list_credential: the fetched status list; None leaves revocation "not checked".
        now: the time to check dates against (default: now).
    """
    result = Verification()
    now = now or now_utc()
    if isinstance(credential, (str, bytes)):
        try:
            credential = json.loads(credential)
        except (ValueError, UnicodeDecodeError) as err:
            result.check("JSON", False, f"not valid JSON ({err})")
            return result
    if not isinstance(credential, dict):
        result.check("JSON", False, "a credential is a JSON object")
        return result
    result.claims = claims_of(credential)
    if _check_shape(credential, result):
        _verify_proof_set(credential, result, did_documents, trusted_keys, "credential")
        _check_dates(credential, result, now, "credential")
        if status_list_credential is not None:
            _check_status(credential, status_list_credential, result, did_documents, now)
    result.valid = not result.errors
    return result
