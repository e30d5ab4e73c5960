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

`verify` checks the proof set (exactly one proof of each suite, each valid), the key (did:key
offline, did:web from a DID document), that the key's controller is the issuer, that the issuer is
one the verifier trusts, the dates, and revocation when a status list is given. It reports every
check as pass, fail or n/a in words that match, and every signed claim, so that nobody has to trust
a bare "valid"; the verify page runs the same checks with the same words.
"""
from __future__ import annotations

import hashlib
import json
import re
import secrets
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from . import canonical, keys, status_list
from .keys import Ed25519PrivateKey, KeyringError
from .claims import claims_of  # noqa: F401  (re-exported)

VC_V2 = "https://www.w3.org/ns/credentials/v2"
OB_V3 = "https://purl.imsglobal.org/spec/ob/v3p0/context-3.0.3.json"
CONTEXT = [VC_V2, OB_V3]
SUITES = ("eddsa-rdfc-2022", "eddsa-jcs-2022")


def now_utc() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


DATETIME = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$", re.ASCII)
"""An XML Schema dateTime *with* a time zone; the verify page uses the same pattern."""


def parse_time(value: object, name: str) -> datetime:
    """The instant `value` names, or ValueError: only `DATETIME` strings (a date without a zone is ambiguous)."""
    m = DATETIME.fullmatch(value) if isinstance(value, str) else None
    try:
        if m is None:
            raise ValueError
        t = datetime.fromisoformat(value[:19] + (m.group(8).replace("Z", "+00:00")))
    except ValueError:
        raise ValueError(f"{name} is missing or not an XML Schema dateTime with a time zone: {show(value)}") from None
    return t


def show(value: object, limit: int = 60) -> str:
    """`value` as compact JSON, cut at `limit` characters: how checks quote what they found (as the JS does)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":")) if value is not None else "missing"
    return text if len(text) <= limit else text[:limit] + "…"


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
#
# [Note: one list of checks, three statuses] Every verification reports the same checks in the same
# order (`CHECKS`), each "pass", "fail" or "n/a" with words that say what was found: a pass never
# carries failure words, and a check that could not run says why it did not. The verify page
# (course/assets/verify/verify-core.js) produces the same names, statuses and words; the shared
# tamper cases (tests/verify_cases.py) hold the two to each other.

PASS, FAIL, NA = "pass", "fail", "n/a"

CHECKS = ("JSON", "@context", "type", "credentialSubject", "issuer",
          "proof set", "eddsa-rdfc-2022 proof", "eddsa-jcs-2022 proof", "issuer trusted",
          "validFrom", "validUntil", "credentialStatus",
          "status list proof set", "status list eddsa-rdfc-2022 proof", "status list eddsa-jcs-2022 proof",
          "status list issuer", "status list id", "status list validFrom", "status list validUntil",
          "status list contents", "revocation")
"""Every check, in report order (plus "issuer key" after "issuer trusted" when `trusted_keys` is given)."""

NOT_TRUSTED = "signature valid, issuer not trusted"


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    """PASS, FAIL or NA."""
    detail: str


@dataclass
class Verification:
    """The verdict, every check behind it, and every signed claim."""

    valid: bool = False
    checks: list[Check] = field(default_factory=list)
    claims: dict = field(default_factory=dict)
    revocation: str = "not checked (offline)"

    def add(self, name: str, ok: bool, passed: str, failed: str) -> bool:
        """Record `name` as a pass with the words `passed`, or a fail with the words `failed`."""
        self.checks.append(Check(name, PASS if ok else FAIL, passed if ok else failed))
        return ok

    def skip(self, name: str, why: str) -> None:
        self.checks.append(Check(name, NA, why))

    def status(self, name: str) -> str | None:
        return next((c.status for c in self.checks if c.name == name), None)

    @property
    def errors(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if c.status == FAIL]

    @property
    def signature_valid(self) -> bool:
        """Both proofs verify, whoever the signer is."""
        return all(self.status(n) == PASS for n in ("proof set", "eddsa-rdfc-2022 proof", "eddsa-jcs-2022 proof"))

    @property
    def verdict(self) -> str:
        if self.valid:
            return "valid"
        if self.status("issuer trusted") == FAIL and self.signature_valid:
            others = [c for c in self.checks if c.status == FAIL and c.name != "issuer trusted"]
            return NOT_TRUSTED if not others else "invalid"
        return "invalid"

    def to_dict(self) -> dict:
        return {"valid": self.valid, "verdict": self.verdict, "errors": self.errors,
                "revocation": self.revocation, "claims": self.claims,
                "checks": [{"check": c.name, "status": c.status, "detail": c.detail} for c in self.checks]}


def verify_proof(document: dict, proof: dict, public, extra_contexts=None) -> str | None:
    """None if `proof` is a valid signature on `document` (without its `proof`) by `public`, else why not."""
    suite = proof.get("cryptosuite")
    if proof.get("type") != "DataIntegrityProof" or suite not in SUITES:
        return f"unsupported proof type {show(proof.get('type'))} / cryptosuite {show(suite)}"
    if proof.get("proofPurpose") != "assertionMethod":
        return f"proofPurpose is {show(proof.get('proofPurpose'))}, expected \"assertionMethod\""
    config = {k: v for k, v in proof.items() if k != "proofValue"}
    if "@context" in config and config["@context"] != document.get("@context"):
        return "the proof's @context differs from the document's"
    if suite == "eddsa-rdfc-2022":      # jcs signs the proof exactly as written (with or without @context)
        config["@context"] = document.get("@context")
    try:
        parse_time(proof.get("created"), "created")
    except ValueError as err:
        return str(err)
    try:
        signature = keys.multibase_decode(proof.get("proofValue", ""))
    except KeyringError:
        return "proofValue is not a base58btc multibase string"
    if len(signature) != 64:
        return f"proofValue holds {len(signature)} bytes, an Ed25519 signature has 64 (truncated?)"
    try:
        data = _hash_data(document, config, suite, extra_contexts)
    except (canonical.CanonicalizationError, ValueError):
        return f"cannot canonicalize the document for {suite} with the bundled contexts"
    if not keys.verify_signature(public, signature, data):
        return "signature does not match the document (edited, or signed by another key)"
    return None


def _issuer_id(doc: dict):
    issuer = doc.get("issuer")
    return issuer.get("id") if isinstance(issuer, dict) else issuer


def _check_proof_set(doc: dict, r: Verification, did_documents, label: str) -> str | None:
    """The proof set checks: exactly one proof of each suite, each valid and by the issuer's key.

    Returns the signer's Multikey when every proof passes.
    """
    p = f"{label}proof set"
    proofs = doc.get("proof")
    expected = f"one {SUITES[0]} proof and one {SUITES[1]} proof"
    if not isinstance(proofs, list):
        found = "an object" if isinstance(proofs, dict) else ("no proof" if proofs is None else show(proofs))
        r.add(p, False, "", f"proof must be an array holding {expected}; found {found}")
        for s in SUITES:
            r.skip(f"{label}{s} proof", "not checked: the proof set is malformed")
        return None
    suites = [q.get("cryptosuite") if isinstance(q, dict) else None for q in proofs]
    well_formed = len(proofs) == 2 and all(isinstance(q, dict) for q in proofs) and sorted(map(str, suites)) == sorted(SUITES)
    r.add(p, well_formed, f"{expected}", f"expected {expected}; found {len(proofs)}: {show(suites, 120)}")
    unsecured = {k: v for k, v in doc.items() if k != "proof"}
    issuer_id = _issuer_id(doc)
    signers = []
    for suite in SUITES:
        name = f"{label}{suite} proof"
        mine = [q for q in proofs if isinstance(q, dict) and q.get("cryptosuite") == suite]
        if len(mine) != 1:
            r.add(name, False, "", "missing" if not mine else f"{len(mine)} proofs of this cryptosuite, expected one")
            continue
        vm = mine[0].get("verificationMethod")
        try:
            public = keys.resolve_verification_method(vm, did_documents)
        except (KeyringError, ValueError) as err:
            r.add(name, False, "", str(err))
            continue
        if vm.split("#")[0] != issuer_id:
            r.add(name, False, "", f"key {show(vm, 80)} is not controlled by the issuer {show(issuer_id, 80)}")
            continue
        why = verify_proof(unsecured, mine[0], public)
        fingerprint = keys.public_multikey(public)
        if r.add(name, why is None, f"signature valid, by the issuer's key {fingerprint[:16]}…", why or ""):
            signers.append(fingerprint)
    return signers[0] if well_formed and len(signers) == 2 and signers[0] == signers[1] else None


def _check_shape(doc: dict, r: Verification) -> bool:
    ctx = doc.get("@context")
    ok = r.add("@context", isinstance(ctx, list) and ctx[:1] == [VC_V2] and OB_V3 in ctx,
               "VC 2.0 and Open Badges 3.0.3", f"must start with {VC_V2} and include {OB_V3}; found {show(ctx)}")
    types = doc.get("type") if isinstance(doc.get("type"), list) else []
    ok &= r.add("type", {"VerifiableCredential", "OpenBadgeCredential"} <= set(map(str, types)),
                "VerifiableCredential, OpenBadgeCredential",
                f"must include VerifiableCredential and OpenBadgeCredential; found {show(doc.get('type'))}")
    subject = doc.get("credentialSubject")
    ok &= r.add("credentialSubject", isinstance(subject, dict) and isinstance(subject.get("achievement"), dict),
                "an achievement subject", "needs an object with an achievement")
    issuer = doc.get("issuer")
    ok &= r.add("issuer", isinstance(issuer, dict) and isinstance(issuer.get("id"), str),
                str(_issuer_id(doc))[:100], "needs an issuer profile with an id")
    return ok


def _check_dates(doc: dict, r: Verification, now: datetime, label: str) -> None:
    try:
        valid_from = parse_time(doc.get("validFrom"), "validFrom")
        r.add(f"{label}validFrom", valid_from <= now + timedelta(minutes=5),
              f"valid since {doc['validFrom']}", f"not valid before {doc['validFrom']}")
    except ValueError as err:
        r.add(f"{label}validFrom", False, "", str(err).removeprefix("validFrom "))
    if "validUntil" not in doc:
        if label:
            r.add(f"{label}validUntil", False, "", "missing: a status list without one could be replayed for ever")
        else:
            r.skip("validUntil", "no expiry date")
        return
    try:
        until = parse_time(doc["validUntil"], "validUntil")
        r.add(f"{label}validUntil", now <= until,
              f"{'fresh' if label else 'valid'} until {doc['validUntil']}",
              f"{'stale: it expired' if label else 'expired'} on {doc['validUntil']}")
    except ValueError as err:
        r.add(f"{label}validUntil", False, "", str(err).removeprefix("validUntil "))


STATUS_LIST_CHECKS = CHECKS[CHECKS.index("status list proof set"):]


def _check_status(doc: dict, status_doc, r: Verification, did_documents, now: datetime) -> None:
    try:
        url, index = status_list.parse_entry(doc.get("credentialStatus"))
        r.add("credentialStatus", True, f"revocation entry {index} of {url}", "")
    except status_list.StatusListError as err:
        r.add("credentialStatus", False, "", str(err))
        for name in STATUS_LIST_CHECKS:
            r.skip(name, "not checked: the credential has no usable status entry")
        r.revocation = "unknown: no usable status entry"
        return
    if status_doc is None:
        for name in STATUS_LIST_CHECKS:
            r.skip(name, "not checked: no status list (offline or unreachable)")
        return
    if not isinstance(status_doc, dict):
        r.add("status list proof set", False, "", "the status list is not a JSON object")
        for name in STATUS_LIST_CHECKS[1:]:
            r.skip(name, "not checked: the status list is not a JSON object")
        r.revocation = "unknown: the status list was rejected"
        return
    n = len(r.checks)
    signer = _check_proof_set(status_doc, r, did_documents, "status list ")
    issuer = _issuer_id(doc)
    r.add("status list issuer", status_doc.get("issuer") == issuer, "the credential's issuer",
          f"issued by {show(status_doc.get('issuer'), 80)}, not by the credential's issuer")
    r.add("status list id", status_doc.get("id") == url, f"{url}",
          f"is {show(status_doc.get('id'), 80)}, expected {url}")
    _check_dates(status_doc, r, now, "status list ")
    revoked = None
    subject = status_doc.get("credentialSubject")
    try:
        if not isinstance(subject, dict) or subject.get("type") != "BitstringStatusList" \
                or subject.get("statusPurpose") != status_list.PURPOSE:
            raise status_list.StatusListError("not a revocation BitstringStatusList")
        revoked = status_list.bit(status_list.decode(subject.get("encodedList")), index)
        r.add("status list contents", True, f"a revocation list of {len(status_list.decode(subject['encodedList'])) * 8} bits", "")
    except status_list.StatusListError as err:
        r.add("status list contents", False, "", str(err))
    as_of = status_doc.get("validFrom")
    if any(c.status == FAIL for c in r.checks[n:]) or signer is None:
        r.skip("revocation", "unknown: the status list was rejected")
        r.revocation = "unknown: the status list was rejected"
        return
    r.revocation = f"revoked (status list of {as_of})" if revoked else f"not revoked (as of {as_of})"
    r.add("revocation", not revoked, f"not revoked as of {as_of}", f"revoked by the issuer (status list of {as_of})")


def verify(credential: dict | str | bytes, *, trusted_issuers: dict[str, str] | set[str] | None = None,
           did_documents: dict | None = None, trusted_keys: set[str] | None = None,
           status_list_credential: dict | None = None, now: datetime | None = None) -> Verification:
    """Verify an OpenBadgeCredential; never raises on bad input, reports it instead.

    Args:
        credential: the parsed credential, or its JSON text.
        trusted_issuers: the issuer DIDs to accept (DID -> where the trust comes from); a valid
            signature by any other issuer is reported as "signature valid, issuer not trusted".
            None leaves the "issuer trusted" check n/a (library use only: the CLI and the verify
            page always pass a list, possibly empty).
        did_documents: DID -> DID document, for did:web issuers (did:key needs none).
        trusted_keys: Multikeys the expected issuer publishes; adds an "issuer key" check.
        status_list_credential: the fetched status list; None leaves revocation "not checked".
        now: the time to check dates against (default: now).
    """
    r = Verification()
    now = now or now_utc()
    if isinstance(credential, (str, bytes)):
        try:
            credential = json.loads(credential, parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError, RecursionError):
            credential = _NOT_JSON
    if not isinstance(credential, dict):
        r.add("JSON", False, "", "not valid JSON" if credential is _NOT_JSON else "a credential is a JSON object")
        for name in CHECKS[1:]:
            r.skip(name, "not checked: no credential to check")
        r.revocation = "not checked: no credential"
        return r
    r.add("JSON", True, "a JSON object", "")
    r.claims = claims_of(credential)
    if not _check_shape(credential, r):
        for name in CHECKS[CHECKS.index("proof set"):]:
            r.skip(name, "not checked: the credential is not an Open Badges 3.0 credential")
        r.revocation = "not checked: not an Open Badges credential"
        return r
    signer = _check_proof_set(credential, r, did_documents, "")
    issuer = _issuer_id(credential)
    if trusted_issuers is None:
        r.skip("issuer trusted", "not checked: no list of trusted issuers given")
    elif issuer in trusted_issuers:
        r.add("issuer trusted", True, "a trusted issuer", "")
    else:
        r.add("issuer trusted", False, "",
              f"{show(issuer, 80)} is not one of the {len(trusted_issuers)} trusted issuers"
              + (f" ({NOT_TRUSTED})" if signer else ""))
    if trusted_keys is not None:
        r.add("issuer key", signer in trusted_keys, "published by the issuer",
              f"key {str(signer)[:20]}… is not one the issuer publishes")
    _check_dates(credential, r, now, "")
    _check_status(credential, status_list_credential, r, did_documents, now)
    r.valid = not any(c.status == FAIL for c in r.checks)
    return r


_NOT_JSON = object()


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")        # Python's json accepts NaN and Infinity; JSON does not
