"""Issue -> verify round trip (Python API) and a tamper matrix where every case is rejected with its reason."""
import copy
import json
import os
import stat
from datetime import datetime, timedelta, timezone

import pytest

from minimega.classroom import credential, keys, status_list, verification_code
from minimega.classroom.keys import Ed25519PrivateKey, Keyring

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)
LIST_URL = "https://course.example/status/z6MkList"
INDEX = 4242


def achievement():
    return {"id": "https://course.example/achievements/0.1.0", "type": ["Achievement"], "achievementType": "Certificate",
            "name": "minimega: training frontier models across many GPUs", "description": "Passed the exam.",
            "criteria": {"narrative": "Scored at least 80%."}, "version": "0.1.0"}


class Signer:
    """A did:key issuer: key, DID, verification method."""

    def __init__(self, private=None):
        self.private = private or Ed25519PrivateKey.generate()
        self.did = keys.did_key(self.private.public_key())
        self.vm = f"{self.did}#{keys.public_multikey(self.private.public_key())}"

    def issue(self, name="Ada Lovelace", valid_from=NOW - timedelta(days=1), valid_until=None):
        doc = credential.build_credential(
            issuer={"id": self.did, "type": ["Profile"], "name": "minimega course", "url": "https://course.example/"},
            display_name=name, achievement=achievement(), status=status_list.entry(LIST_URL, INDEX),
            valid_from=valid_from, valid_until=valid_until,
            email_id=credential.email_identity("ada@example.org"))
        return credential.add_proofs(doc, self.private, self.vm, created=valid_from)

    def status(self, revoked=(), valid_from=NOW - timedelta(hours=1), ttl=timedelta(days=1), issuer=None):
        doc = status_list.list_credential(list_url=LIST_URL, issuer=issuer or self.did, revoked=set(revoked),
                                          valid_from=credential.iso(valid_from),
                                          valid_until=credential.iso(valid_from + ttl))
        return credential.add_proofs(doc, self.private, self.vm, created=valid_from)


@pytest.fixture(scope="module")
def signer():
    return Signer()


@pytest.fixture(scope="module")
def issued(signer):
    return signer.issue()


def test_round_trip_shows_every_claim(signer, issued):
    result = credential.verify(json.dumps(issued), status_list_credential=signer.status(),
                               trusted_keys={keys.public_multikey(signer.private.public_key())}, now=NOW)
    assert result.valid, result.errors
    c = result.claims
    assert (c["name"], c["course_version"], c["issuer_id"], c["valid_from"]) == \
        ("Ada Lovelace", "0.1.0", signer.did, credential.iso(NOW - timedelta(days=1)))
    assert c["achievement"].startswith("minimega") and c["email"] == "salted SHA-256 hash"
    assert result.revocation.startswith("not revoked")
    assert {c.name for c in result.checks if c.status == "pass"} >= {"eddsa-rdfc-2022 proof", "eddsa-jcs-2022 proof",
                                                                     "issuer key", "revocation"}
    assert result.status("issuer trusted") == "n/a"             # no trust list given: said, not assumed
    assert "ada@example.org" not in json.dumps(issued)             # only the salted hash


def test_email_hash_checks_out(issued):
    ident = next(i for i in issued["credentialSubject"]["identifier"] if i["identityType"] == "emailAddress")
    assert ident == credential.email_identity(" Ada@Example.org ", ident["salt"])


def _set(doc, path, value):
    d = doc
    for p in path[:-1]:
        d = d[p]
    d[path[-1]] = value
    return doc


def _resigned_by_other_key(signer, issued):
    other = Signer()
    doc = {k: v for k, v in issued.items() if k != "proof"}
    return credential.add_proofs(doc, other.private, signer.vm)           # claims to be the issuer's key


def _attacker_credential(signer, issued):
    return Signer().issue()                                               # valid, but not from the course


def _rdfc_only_edited(signer, issued):
    doc = copy.deepcopy(issued)
    rdfc = next(p for p in doc["proof"] if p["cryptosuite"] == "eddsa-rdfc-2022")
    rdfc["created"] = "2020-01-01T00:00:00Z"
    return doc


# name -> (make the tampered credential, extra verify kwargs, expected reason)
TAMPER = {
    "edited-name": (lambda s, c: _set(copy.deepcopy(c), ["credentialSubject", "identifier", 0, "identityHash"], "Mallory"),
                    {}, "signature does not match"),
    "edited-date": (lambda s, c: _set(copy.deepcopy(c), ["validFrom"], "2020-01-01T00:00:00Z"), {}, "signature does not match"),
    "edited-achievement": (lambda s, c: _set(copy.deepcopy(c), ["credentialSubject", "achievement", "name"], "PhD"),
                           {}, "signature does not match"),
    "edited-course-version": (lambda s, c: _set(copy.deepcopy(c), ["credentialSubject", "achievement", "version"], "9.9"),
                              {}, "signature does not match"),
    "edited-issuer": (lambda s, c: _set(copy.deepcopy(c), ["issuer", "id"], Signer().did), {}, "not controlled by the issuer"),
    "swapped-proofs": (lambda s, c: _set(_set(copy.deepcopy(c), ["proof", 0, "proofValue"], c["proof"][1]["proofValue"]),
                                         ["proof", 1, "proofValue"], c["proof"][0]["proofValue"]), {}, "signature does not match"),
    "truncated-proof": (lambda s, c: _set(copy.deepcopy(c), ["proof", 1, "proofValue"], c["proof"][1]["proofValue"][:50]),
                        {}, "truncated"),
    "proof-removed": (lambda s, c: {k: v for k, v in c.items() if k != "proof"}, {}, "found no proof"),
    "rdfc-proof-edited": (_rdfc_only_edited, {}, "eddsa-rdfc-2022 proof: signature does not match"),
    "wrong-key": (_resigned_by_other_key, {}, "signature does not match"),
    "unknown-key-id": (lambda s, c: _set(_set(copy.deepcopy(c), ["proof", 0, "verificationMethod"], s.did + "#key-2"),
                                         ["proof", 1, "verificationMethod"], s.did + "#key-2"), {}, "unknown key id"),
    "untrusted-issuer": (_attacker_credential, {"trusted": True}, "not one the issuer publishes"),
    "issuer-not-trusted": (_attacker_credential, {"issuers": True}, "is not one of the 1 trusted issuers"),
    "expired": (lambda s, c: s.issue(valid_from=NOW - timedelta(days=400), valid_until=NOW - timedelta(days=35)),
                {}, "expired on"),
    "not-yet-valid": (lambda s, c: s.issue(valid_from=NOW + timedelta(days=3)), {}, "not valid before"),
    "revoked": (lambda s, c: c, {"status": lambda s: s.status(revoked={INDEX})}, "revoked by the issuer"),
    "stale-status-list": (lambda s, c: c, {"status": lambda s: s.status(valid_from=NOW - timedelta(days=3))}, "stale"),
    "forged-status-list": (lambda s, c: c, {"status": lambda s: _set(s.status(revoked={INDEX}), ["credentialSubject", "encodedList"],
                                                                      status_list.encode(status_list.make_bits([])))},
                           "status list eddsa-jcs-2022 proof: signature does not match"),
    "status-list-other-issuer": (lambda s, c: c, {"status": lambda s: Signer().status()},
                                 "status list issuer: issued by"),
    "malformed-json": (lambda s, c: json.dumps(c)[:-7], {}, "not valid JSON"),
    "wrong-context": (lambda s, c: _set(copy.deepcopy(c), ["@context"], ["https://www.w3.org/2018/credentials/v1"]),
                      {}, "@context"),
    "not-an-object": (lambda s, c: "[1, 2, 3]", {}, "a credential is a JSON object"),
}


@pytest.mark.parametrize("case", list(TAMPER))
def test_tamper_matrix(signer, issued, case):
    make, extra, reason = TAMPER[case]
    tampered = make(signer, issued)
    kwargs = {"now": NOW}
    if "status" in extra:
        kwargs["status_list_credential"] = extra["status"](signer)
    if extra.get("trusted"):
        kwargs["trusted_keys"] = {keys.public_multikey(signer.private.public_key())}
    if extra.get("issuers"):
        kwargs["trusted_issuers"] = {signer.did}
    result = credential.verify(tampered, **kwargs)
    assert not result.valid
    assert any(reason in e for e in result.errors), (case, result.errors)
    if isinstance(tampered, dict) and case.startswith("edited-name"):
        assert result.claims["name"] == "Mallory"      # the edited claim is shown, flagged invalid


def test_did_web_and_rotation_keep_old_credentials_verifiable(tmp_path, capsys):
    folder = tmp_path / "keys"
    ring = Keyring.open(folder, create=True)
    assert "DEVELOPMENT SIGNING KEY" in capsys.readouterr().err
    pem = next(folder.glob("key-*.pem"))
    assert stat.S_IMODE(pem.stat().st_mode) == 0o600
    did = keys.did_web("course.example")
    old = Signer(ring.active.private)
    old.did, old.vm = did, f"{did}#{ring.active.fingerprint}"
    first = old.issue()
    ring.rotate(folder)
    new = Signer(ring.active.private)
    new.did, new.vm = did, f"{did}#{ring.active.fingerprint}"
    second = new.issue()
    doc = keys.did_document(did, Keyring.open(folder).publics)
    assert len(doc["assertionMethod"]) == 2
    for cred in (first, second):
        assert credential.verify(cred, did_documents={did: doc}, now=NOW).valid
    only_new = keys.did_document(did, [ring.active.public])
    result = credential.verify(first, did_documents={did: only_new}, now=NOW)
    assert not result.valid and any("unknown key id" in e for e in result.errors)
    assert not credential.verify(first, now=NOW).valid         # did:web needs its document


def test_key_file_permissions_and_env_key(tmp_path, monkeypatch):
    folder = tmp_path / "keys"
    Keyring.open(folder, create=True)
    pem = next(folder.glob("key-*.pem"))
    os.chmod(pem, 0o644)
    with pytest.raises(keys.KeyringError, match="chmod 600"):
        Keyring.open(folder)
    private = Ed25519PrivateKey.generate()
    monkeypatch.setenv(keys.ENV_KEY, keys.private_multikey(private))
    ring = Keyring.open(tmp_path / "empty")
    assert ring.active.fingerprint == keys.public_multikey(private.public_key())
    monkeypatch.setenv(keys.ENV_KEY, "not-a-key")
    with pytest.raises(keys.KeyringError, match=keys.ENV_KEY):
        Keyring.open(tmp_path / "empty")
    monkeypatch.delenv(keys.ENV_KEY)
    with pytest.raises(keys.KeyringError, match="no signing key"):
        Keyring.open(tmp_path / "empty")


def test_status_list_encoding():
    assert status_list.make_bits([0])[0] == 0x80 and status_list.make_bits([15])[1] == 0x01
    bits = status_list.decode(status_list.encode(status_list.make_bits({3, 94567})))
    assert len(bits) * 8 == status_list.LIST_BITS
    assert [i for i in (2, 3, 4, 94567) if status_list.bit(bits, i)] == [3, 94567]
    # the spec's example encodedList: 16 KiB of zeros
    spec = status_list.decode("uH4sIAAAAAAAAA-3BMQEAAADCoPVPbQwfoAAAAAAAAAAAAAAAAAAAAIC3AYbSVKsAQAAA")
    assert len(spec) == 16384 and not any(spec)


def test_verification_code_catches_typos():
    code = verification_code.new_code()
    assert verification_code.normalize(code.lower().replace("-", " ")) == code
    body = code.replace("-", "")
    for i in range(16):
        typo = body[:i] + ("1" if body[i] != "1" else "2") + body[i + 1:]
        with pytest.raises(verification_code.CodeError):
            verification_code.normalize(typo)
    swaps = [body[:i] + body[i + 1] + body[i] + body[i + 2:] for i in range(15) if body[i] != body[i + 1]]
    for swapped in swaps:
        with pytest.raises(verification_code.CodeError):
            verification_code.normalize(swapped)
    aliased = body[:16].replace("0", "O").replace("1", "I") + body[16]    # the check symbol is not aliased
    assert verification_code.normalize(aliased) == code
