"""The shared tamper cases: one genuine certificate and every way of breaking it, for both verifiers.

`make_cases(base)` issues a genuine credential (did:key issuer, status list under `base`) and derives
each case from it. A case is a dict:

    name          readable id
    credential    the credential (a dict, or JSON text for the malformed ones)
    lists         status-list URL -> signed status list (the CLI gets it with --status-list, the
                  browser fetches it: the test serves these files at those URLs)
    did_document  for a did:web issuer, its DID document (the CLI gets it with --did-document, the
                  browser fetches it from BASE/.well-known/did.json)
    verdict       "valid", "invalid" or "signature valid, issuer not trusted"
    fail          check name -> words its detail must contain; every other check passes or is n/a

Both verifiers trust only `trusted_dids(base)`: the genuine did:key issuer and a did:web issuer at
`base` (the CLI through --trust, the site through its build-time pin). `python tests/verify_cases.py OUT.json` writes the list as JSON.
"""
from __future__ import annotations

import copy
import json
import re
import sys
from datetime import datetime, timedelta
from urllib.parse import urlparse

from minimega.classroom import credential, keys, status_list
from minimega.classroom.keys import Ed25519PrivateKey

SIG = "signature does not match the document"
NOT_TRUSTED = credential.NOT_TRUSTED
INDEX = 4242
ACHIEVEMENT = {"id": "https://course.example/achievements/0.1.0", "type": ["Achievement"],
               "achievementType": "Certificate", "name": "minimega: training frontier models across many GPUs",
               "description": "Passed the graded exam of minimega.",
               "criteria": {"narrative": "Scored at least 80% on an unproctored online exam."}, "version": "0.1.0",
               "otherIdentifier": [{"type": ["IdentifierEntry"], "identifier": "acme-2027@sha256:" + "5e" * 32,
                                    "identifierType": "ext:examBank"}]}   # the bank that graded it, as issued


class Signer:
    """A did:key issuer (seeded, so every run gets the same DID)."""

    def __init__(self, seed: int):
        self.private = Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)
        self.did = keys.did_key(self.private.public_key())
        self.vm = f"{self.did}#{keys.public_multikey(self.private.public_key())}"

    def sign(self, doc: dict, vm: str | None = None, created: datetime | None = None) -> dict:
        unsigned = {k: v for k, v in doc.items() if k != "proof"}
        return credential.add_proofs(unsigned, self.private, vm or self.vm, created=created)

    def issue(self, list_url: str, now: datetime, name="Ada Lovelace", issuer_name="minimega course") -> dict:
        doc = credential.build_credential(
            issuer={"id": self.did, "type": ["Profile"], "name": issuer_name, "url": "https://course.example/"},
            display_name=name, achievement=copy.deepcopy(ACHIEVEMENT), status=status_list.entry(list_url, INDEX),
            valid_from=now - timedelta(days=1), email_id=credential.email_identity("ada@example.org", "5a1t"),
            credential_id="urn:uuid:6f1c9d43-2b7e-4c55-9a36-0d1e8f2b7a10")
        return self.sign(doc, created=now - timedelta(days=1))

    def status(self, list_url: str, now: datetime, revoked=(), valid_from=None, ttl=timedelta(days=1),
               issuer=None) -> dict:
        start = valid_from or now - timedelta(hours=1)
        doc = status_list.list_credential(list_url=list_url, issuer=issuer or self.did, revoked=set(revoked),
                                          valid_from=credential.iso(start), valid_until=credential.iso(start + ttl))
        return self.sign(doc, created=start)


GENUINE, ATTACKER = Signer(7), Signer(66)
genuine_did = GENUINE.did


def web_signer(base: str, seed: int = 9, path: str = "") -> Signer:
    """A did:web issuer at `base` (its DID document is served at BASE/.well-known/did.json, or at
    BASE/PATH/did.json with a path)."""
    s = Signer(seed)
    s.did = keys.did_web(urlparse(base).netloc) + (f":{path}" if path else "")
    s.vm = f"{s.did}#{keys.public_multikey(s.private.public_key())}"
    return s


def trusted_dids(base: str) -> list[str]:
    return [genuine_did, web_signer(base).did]


def _edit(doc, path, value=None, delete=False):
    doc = copy.deepcopy(doc)
    d = doc
    for p in path[:-1]:
        d = d[p]
    if delete:
        del d[path[-1]]
    else:
        d[path[-1]] = value
    return doc


def _flip(value: str) -> str:
    """A proofValue with one base58 character changed (same length, still valid base58)."""
    i = len(value) // 2
    return value[:i] + ("2" if value[i] != "2" else "3") + value[i + 1:]


def _proof(doc, suite):
    return next(p for p in doc["proof"] if p["cryptosuite"] == suite)


def _with_proofs(doc, proofs):
    return {**copy.deepcopy(doc), "proof": proofs}


def make_cases(base: str, now: datetime | None = None) -> list[dict]:
    now = now or credential.now_utc()
    main_url = f"{base}/status/main"
    genuine = GENUINE.issue(main_url, now)
    main_list = GENUINE.status(main_url, now)
    rdfc, jcs = _proof(genuine, "eddsa-rdfc-2022"), _proof(genuine, "eddsa-jcs-2022")
    unsigned = {k: v for k, v in genuine.items() if k != "proof"}
    cases = []

    web = web_signer(base)
    web_doc = keys.did_document(web.did, [web.private.public_key()])

    def case(name, cred, fail=None, verdict=None, lists=None, did_document=None):
        fail = fail or {}
        cases.append({"name": name, "credential": cred, "lists": lists if lists is not None else {main_url: main_list},
                      "verdict": verdict or ("valid" if not fail else "invalid"), "fail": fail,
                      "did_document": did_document})

    def own_list(name):
        """A genuine credential with a status list of its own (so the browser can fetch this one)."""
        url = f"{base}/status/{name}"
        return GENUINE.issue(url, now), url

    both = {"eddsa-rdfc-2022 proof": SIG, "eddsa-jcs-2022 proof": SIG}

    # --- the genuine credential, and edits that change nothing signed -----------------------------
    case("genuine", genuine)
    case("genuine-keys-reordered", dict(reversed(list(copy.deepcopy(genuine).items()))))
    case("genuine-proofs-reversed", _with_proofs(genuine, [jcs, rdfc]))

    # --- signed claims edited ------------------------------------------------------------------
    case("edited-name", _edit(genuine, ["credentialSubject", "identifier", 0, "identityHash"], "Mallory"), both)
    case("edited-achievement", _edit(genuine, ["credentialSubject", "achievement", "name"], "PhD in physics"), both)
    case("edited-course-version", _edit(genuine, ["credentialSubject", "achievement", "version"], "9.9"), both)
    case("edited-description", _edit(genuine, ["credentialSubject", "achievement", "description"], "With honours."), both)
    case("edited-exam-bank", _edit(genuine, ["credentialSubject", "achievement", "otherIdentifier", 0, "identifier"],
                                   "private-bank@sha256:" + "00" * 32), both)
    case("edited-criteria", _edit(genuine, ["credentialSubject", "achievement", "criteria", "narrative"], "Proctored."), both)
    case("edited-validFrom", _edit(genuine, ["validFrom"], "2020-01-01T00:00:00Z"), both)
    case("added-validUntil", _edit(genuine, ["validUntil"], "2099-01-01T00:00:00Z"), both)
    case("removed-email-identity", _edit(genuine, ["credentialSubject", "identifier", 1], delete=True), both)
    case("edited-email-hash", _edit(genuine, ["credentialSubject", "identifier", 1, "identityHash"], "sha256$" + "0" * 64), both)
    case("edited-issuer-name", _edit(genuine, ["issuer", "name"], "Stanford University"), both)
    case("edited-issuer-url", _edit(genuine, ["issuer", "url"], "https://evil.example/"), both)
    case("edited-credential-id", _edit(genuine, ["id"], "urn:uuid:00000000-0000-4000-8000-000000000000"), both)
    # a term no context defines drops out of the RDF graph: only the jcs proof sees it
    case("added-undefined-claim", {**copy.deepcopy(genuine), "honours": "summa cum laude"},
         {"eddsa-jcs-2022 proof": SIG})
    case("edited-status-index", _edit(genuine, ["credentialStatus", "statusListIndex"], "17"), both)

    # --- issuer and key --------------------------------------------------------------------------
    att_url = f"{base}/status/attacker"
    resigned = ATTACKER.sign(_edit(_edit(unsigned, ["issuer", "id"], ATTACKER.did),
                                   ["credentialStatus"], status_list.entry(att_url, INDEX)))
    case("attacker-resigned", resigned, {"issuer trusted": NOT_TRUSTED}, verdict=NOT_TRUSTED,
         lists={att_url: ATTACKER.status(att_url, now)})
    case("attacker-claims-course-key", ATTACKER.sign(unsigned, vm=GENUINE.vm), both)
    case("edited-issuer-id", _edit(genuine, ["issuer", "id"], ATTACKER.did),
         {"eddsa-rdfc-2022 proof": "is not controlled by the issuer", "eddsa-jcs-2022 proof": "is not controlled by the issuer",
          "issuer trusted": "is not one of the 2 trusted issuers", "status list issuer": "not by the credential's issuer"})
    case("unknown-key-id", _with_proofs(genuine, [{**p, "verificationMethod": GENUINE.did + "#key-2"} for p in (rdfc, jcs)]),
         {"eddsa-rdfc-2022 proof": "unknown key id #key-2", "eddsa-jcs-2022 proof": "unknown key id #key-2"})
    case("key-id-without-fragment", _with_proofs(genuine, [{**p, "verificationMethod": GENUINE.did} for p in (rdfc, jcs)]),
         {"eddsa-rdfc-2022 proof": "no '#key' fragment", "eddsa-jcs-2022 proof": "no '#key' fragment"})

    # a did:web issuer: keys from its DID document, trusted by its DID
    url = f"{base}/status/web"
    web_list = {url: web.status(url, now)}
    case("did-web-genuine", web.issue(url, now), lists=web_list, did_document=web_doc)
    rotated = web_signer(base, seed=10)                         # a key the document does not list
    case("did-web-key-not-published", rotated.issue(url, now),
         {"eddsa-rdfc-2022 proof": "not an assertion method of " + web.did,
          "eddsa-jcs-2022 proof": "not an assertion method of " + web.did}, lists=web_list, did_document=web_doc)
    nowhere = web_signer(base, path="unpublished")              # BASE/unpublished/did.json does not exist
    url = f"{base}/status/unpublished"
    case("did-web-without-document", nowhere.issue(url, now),
         {"eddsa-rdfc-2022 proof": "no DID document for " + nowhere.did, "eddsa-jcs-2022 proof": "no DID document for",
          "issuer trusted": "is not one of the 2 trusted issuers",
          "status list eddsa-rdfc-2022 proof": "no DID document", "status list eddsa-jcs-2022 proof": "no DID document"},
         lists={url: nowhere.status(url, now)})

    # --- the proof set ------------------------------------------------------------------------
    case("rdfc-proof-flipped", _with_proofs(genuine, [{**rdfc, "proofValue": _flip(rdfc["proofValue"])}, jcs]),
         {"eddsa-rdfc-2022 proof": SIG})
    case("rdfc-proof-removed", _with_proofs(genuine, [jcs]),
         {"proof set": "found 1", "eddsa-rdfc-2022 proof": "missing"})
    case("jcs-proof-flipped", _with_proofs(genuine, [rdfc, {**jcs, "proofValue": _flip(jcs["proofValue"])}]),
         {"eddsa-jcs-2022 proof": SIG})
    case("jcs-proof-removed", _with_proofs(genuine, [rdfc]),
         {"proof set": "found 1", "eddsa-jcs-2022 proof": "missing"})
    case("duplicate-jcs-proof", _with_proofs(genuine, [rdfc, jcs, jcs]),
         {"proof set": "found 3", "eddsa-jcs-2022 proof": "2 proofs of this cryptosuite"})
    case("jcs-proof-twice-no-rdfc", _with_proofs(genuine, [jcs, jcs]),
         {"proof set": "found 2", "eddsa-rdfc-2022 proof": "missing", "eddsa-jcs-2022 proof": "2 proofs of this cryptosuite"})
    case("proof-as-object", _with_proofs(genuine, jcs), {"proof set": "found an object"}, )
    extra = credential.create_proof(unsigned, ATTACKER.private, ATTACKER.vm, "eddsa-jcs-2022")
    case("extra-proof", _with_proofs(genuine, [rdfc, jcs, {**extra, "cryptosuite": "ecdsa-jcs-2019"}]),
         {"proof set": "found 3"})
    case("proof-set-empty", _with_proofs(genuine, []), {"proof set": "found 0", "eddsa-rdfc-2022 proof": "missing",
                                                         "eddsa-jcs-2022 proof": "missing"})
    case("proof-removed", unsigned, {"proof set": "found no proof"})
    case("proof-not-an-object", _with_proofs(genuine, [rdfc, "z" + jcs["proofValue"]]),
         {"proof set": "found 2", "eddsa-jcs-2022 proof": "missing"})
    case("proof-values-swapped", _with_proofs(genuine, [{**rdfc, "proofValue": jcs["proofValue"]},
                                                          {**jcs, "proofValue": rdfc["proofValue"]}]), both)
    case("proof-value-truncated", _with_proofs(genuine, [rdfc, {**jcs, "proofValue": jcs["proofValue"][:50]}]),
         {"eddsa-jcs-2022 proof": "truncated"})
    case("proof-value-not-multibase", _with_proofs(genuine, [rdfc, {**jcs, "proofValue": "not base58!"}]),
         {"eddsa-jcs-2022 proof": "not a base58btc multibase string"})
    case("proof-purpose-changed", _with_proofs(genuine, [{**rdfc, "proofPurpose": "authentication"}, jcs]),
         {"eddsa-rdfc-2022 proof": 'proofPurpose is "authentication"'})
    case("proof-type-changed", _with_proofs(genuine, [rdfc, {**jcs, "type": "Ed25519Signature2020"}]),
         {"eddsa-jcs-2022 proof": "unsupported proof type"})
    case("rdfc-created-edited", _with_proofs(genuine, [{**rdfc, "created": "2020-01-01T00:00:00Z"}, jcs]),
         {"eddsa-rdfc-2022 proof": SIG})
    case("jcs-created-edited", _with_proofs(genuine, [rdfc, {**jcs, "created": "2020-01-01T00:00:00Z"}]),
         {"eddsa-jcs-2022 proof": SIG})
    case("jcs-proof-context-edited", _with_proofs(genuine, [rdfc, {**jcs, "@context": [credential.VC_V2]}]),
         {"eddsa-jcs-2022 proof": "the proof's @context differs"})
    case("proof-created-without-zone", _with_proofs(genuine, [rdfc, {**jcs, "created": jcs["created"].rstrip("Z")}]),
         {"eddsa-jcs-2022 proof": "created is missing or not an XML Schema dateTime with a time zone"})

    # --- dates, signed by the genuine issuer (a buggy or backdating issuer) ----------------------
    def resigned_with(field, value):
        return GENUINE.sign(_edit(unsigned, [field], value), created=now - timedelta(days=1))

    no_zone = "is missing or not an XML Schema dateTime with a time zone"
    stamp = credential.iso(now - timedelta(days=1))
    case("validFrom-without-zone", resigned_with("validFrom", stamp.rstrip("Z")), {"validFrom": no_zone})
    case("validFrom-date-only", resigned_with("validFrom", stamp[:10]), {"validFrom": no_zone})
    case("validFrom-space-separator", resigned_with("validFrom", stamp.replace("T", " ")), {"validFrom": no_zone})
    case("validFrom-impossible-date", resigned_with("validFrom", "2026-02-30T00:00:00Z"), {"validFrom": no_zone})
    case("not-yet-valid", resigned_with("validFrom", credential.iso(now + timedelta(days=3))),
         {"validFrom": "not valid before"})
    case("expired", resigned_with("validUntil", credential.iso(now - timedelta(days=2))), {"validUntil": "expired on"})
    case("validUntil-without-zone", resigned_with("validUntil", credential.iso(now + timedelta(days=30)).rstrip("Z")),
         {"validUntil": no_zone})
    case("valid-until-next-month", resigned_with("validUntil", credential.iso(now + timedelta(days=30))))
    case("credentialStatus-malformed", GENUINE.sign(_edit(unsigned, ["credentialStatus", "statusListIndex"], 4242)),
         {"credentialStatus": "statusListIndex must be a decimal string, got 4242"})

    # --- the credential's shape -------------------------------------------------------------------
    case("wrong-context", _edit(genuine, ["@context"], ["https://www.w3.org/2018/credentials/v1"]),
         {"@context": "must start with"})
    case("ob-context-missing", _edit(genuine, ["@context"], [credential.VC_V2]), {"@context": "must start with"})
    case("type-not-openbadge", _edit(genuine, ["type"], ["VerifiableCredential"]), {"type": "must include"})
    case("issuer-as-string", _edit(genuine, ["issuer"], GENUINE.did), {"issuer": "needs an issuer profile"})
    case("no-achievement", _edit(genuine, ["credentialSubject", "achievement"], delete=True),
         {"credentialSubject": "needs an object with an achievement"})
    case("malformed-json", json.dumps(genuine)[:-7], {"JSON": "not valid JSON"})
    case("json-array", "[1, 2, 3]", {"JSON": "a credential is a JSON object"})
    case("json-nan", json.dumps(genuine)[:-1] + ', "score": NaN}', {"JSON": "not valid JSON"})

    # --- the status list --------------------------------------------------------------------------
    cred, url = own_list("revoked")
    case("revoked", cred, {"revocation": "revoked by the issuer"}, lists={url: GENUINE.status(url, now, revoked={INDEX})})
    cred, url = own_list("stale")
    case("stale-status-list", cred, {"status list validUntil": "stale: it expired on"},
         lists={url: GENUINE.status(url, now, valid_from=now - timedelta(days=3))})
    cred, url = own_list("forged")
    forged = _edit(GENUINE.status(url, now, revoked={INDEX}), ["credentialSubject", "encodedList"],
                   status_list.encode(status_list.make_bits([])))
    case("forged-status-list", cred, {"status list eddsa-rdfc-2022 proof": SIG, "status list eddsa-jcs-2022 proof": SIG},
         lists={url: forged})
    cred, url = own_list("other-issuer")
    case("status-list-other-issuer", cred, {"status list issuer": "not by the credential's issuer"},
         lists={url: ATTACKER.status(url, now)})
    cred, url = own_list("claims-issuer")
    case("status-list-forged-issuer", cred,
         {"status list eddsa-rdfc-2022 proof": "is not controlled by the issuer",
          "status list eddsa-jcs-2022 proof": "is not controlled by the issuer"},
         lists={url: ATTACKER.status(url, now, issuer=GENUINE.did)})
    cred, url = own_list("wrong-id")
    case("status-list-wrong-id", cred, {"status list id": "expected " + url},
         lists={url: GENUINE.status(f"{base}/status/main", now)})
    cred, url = own_list("future")
    case("status-list-from-the-future", cred, {"status list validFrom": "not valid before"},
         lists={url: GENUINE.status(url, now, valid_from=now + timedelta(days=1))})
    cred, url = own_list("no-until")
    case("status-list-without-validUntil", cred, {"status list validUntil": "missing"},
         lists={url: GENUINE.sign(_edit(GENUINE.status(url, now), ["validUntil"], delete=True), created=now)})
    cred, url = own_list("rdfc-removed")
    lst = GENUINE.status(url, now)
    case("status-list-rdfc-proof-removed", cred,
         {"status list proof set": "found 1", "status list eddsa-rdfc-2022 proof": "missing"},
         lists={url: _with_proofs(lst, [_proof(lst, "eddsa-jcs-2022")])})
    cred, url = own_list("not-a-list")
    case("status-list-wrong-purpose", cred, {"status list contents": "not a revocation BitstringStatusList"},
         lists={url: GENUINE.sign(_edit(GENUINE.status(url, now), ["credentialSubject", "statusPurpose"], "suspension"),
                                  created=now)})
    cred, url = own_list("gzip-bomb")
    bomb = _edit(GENUINE.status(url, now), ["credentialSubject", "encodedList"],
                 status_list.encode(bytes(3 * 1024 * 1024)))              # 3 MiB of zeros in ~3 KiB
    case("status-list-gzip-bomb", cred, {"status list contents": "decodes to more than 262144 bytes"},
         lists={url: GENUINE.sign(bomb, created=now)})
    return cases


# words a passing check must never carry (a pass says what was found, not what could go wrong)
FAILURE_WORDS = ("missing", "expired", "stale", "not valid", "not one of", "does not match", "rejected",
                 "not controlled", "malformed", "unknown key", "not a ")


def assert_truthful(checks, case):
    """Exactly the expected checks fail, with the expected words; the others pass or say why they did not run."""
    assert [c["check"] for c in checks] == list(credential.CHECKS)
    failed = {c["check"]: c["detail"] for c in checks if c["status"] == "fail"}
    assert set(failed) == set(case["fail"]), (case["name"], failed)
    for name, words in case["fail"].items():
        assert words in failed[name], (case["name"], name, failed[name])
    for c in checks:
        assert c["status"] in ("pass", "fail", "n/a") and c["detail"], c
        if c["status"] == "pass":
            words = re.sub(r"\S+://\S+", "URL", c["detail"])      # a URL may hold any word
            assert not any(w in words for w in FAILURE_WORDS), (case["name"], c)
        if c["status"] == "n/a":
            assert c["detail"].startswith(("not checked", "no expiry date", "unknown:")), (case["name"], c)



if __name__ == "__main__":
    out = make_cases(sys.argv[2] if len(sys.argv) > 2 else "https://course.example")
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
    print(f"{len(out)} cases ({sum(c['verdict'] != 'valid' for c in out)} rejected) -> {sys.argv[1]}")
