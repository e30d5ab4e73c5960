"""Canonical forms and both cryptosuites against the W3C vc-di-eddsa test vectors and RFC 8785."""
import copy
import hashlib
import json
from datetime import datetime

import pytest

from classroom_support import EXAMPLES_CONTEXT, W3C
from minimega.classroom import canonical, credential, keys

# TestVectors/eddsa-rdfc-2022/proofCanonDataInt.txt and combinedHashDataInt.txt
RDFC_PROOF_CANON = (
    '_:c14n0 <http://purl.org/dc/terms/created> "2023-02-24T23:36:38Z"^^<http://www.w3.org/2001/XMLSchema#dateTime> .\n'
    "_:c14n0 <http://www.w3.org/1999/02/22-rdf-syntax-ns#type> <https://w3id.org/security#DataIntegrityProof> .\n"
    '_:c14n0 <https://w3id.org/security#cryptosuite> "eddsa-rdfc-2022"^^<https://w3id.org/security#cryptosuiteString> .\n'
    "_:c14n0 <https://w3id.org/security#proofPurpose> <https://w3id.org/security#assertionMethod> .\n"
    "_:c14n0 <https://w3id.org/security#verificationMethod> "
    "<https://vc.example/issuers/5678#z6MkrJVnaZkeFzdQyMZu1cgjg7k1pZZ6pvBQ7XJPt4swbTQ2> .\n")
RDFC_COMBINED = ("4c4d3890a157f8d611b13c265c2c22f39aa0a567c7c7dd9ba3e45cd579784eeb"
                 "517744132ae165a5349155bef0bb0cf2258fff99dfe1dbd914b938d775a36017")
# TestVectors/eddsa-jcs-2022/canonDocJCS.txt, proofCanonJCS.txt and combinedHashJCS.txt
JCS_DOC_CANON = (
    '{"@context":["https://www.w3.org/ns/credentials/v2","https://www.w3.org/ns/credentials/examples/v2"],'
    '"credentialSubject":{"alumniOf":"The School of Examples","id":"did:example:abcdefgh"},'
    '"description":"A minimum viable example of an Alumni Credential.",'
    '"id":"urn:uuid:58172aac-d8ba-11ed-83dd-0b3aef56cc33","issuer":"https://vc.example/issuers/5678",'
    '"name":"Alumni Credential","type":["VerifiableCredential","AlumniCredential"],"validFrom":"2023-01-01T00:00:00Z"}')
JCS_PROOF_CONFIG = {
    "@context": ["https://www.w3.org/ns/credentials/v2", "https://www.w3.org/ns/credentials/examples/v2"],
    "created": "2023-02-24T23:36:38Z", "cryptosuite": "eddsa-jcs-2022", "proofPurpose": "assertionMethod",
    "type": "DataIntegrityProof",
    "verificationMethod": "did:key:z6MkrJVnaZkeFzdQyMZu1cgjg7k1pZZ6pvBQ7XJPt4swbTQ2#z6MkrJVnaZkeFzdQyMZu1cgjg7k1pZZ6pvBQ7XJPt4swbTQ2"}
JCS_COMBINED = ("66ab154f5c2890a140cb8388a22a160454f80575f6eae09e5a097cabe539a1db"
                "59b7cb6251b8991add1ce0bc83107e3db9dbbab5bd2c28f687db1a03abc92f19")
CREATED = datetime.fromisoformat("2023-02-24T23:36:38+00:00")


@pytest.fixture(scope="module")
def key_pair():
    kp = json.loads((W3C / "key-pair.json").read_text())
    return keys.parse_private_multikey(kp["privateKeyMultibase"]), kp["publicKeyMultibase"]


def load(name):
    doc = json.loads((W3C / name).read_text())
    return doc, doc.pop("proof")


def test_multikey_round_trip(key_pair):
    private, public = key_pair
    assert keys.public_multikey(private.public_key()) == public
    assert keys.private_multikey(private) == "z3u2en7t5LR2WtQH5PfFqMqwVHBeXouLzo6haApm8XHqvjxq"
    assert keys.b58decode(keys.b58encode(b"\0\0abc")) == b"\0\0abc"


def test_rdfc_vector_intermediates():
    doc, proof = load("alumni-rdfc.json")
    config = {k: v for k, v in proof.items() if k != "proofValue"} | {"@context": doc["@context"]}
    assert canonical.rdfc(config, EXAMPLES_CONTEXT) == RDFC_PROOF_CANON
    combined = (hashlib.sha256(RDFC_PROOF_CANON.encode()).digest()
                + hashlib.sha256(canonical.rdfc(doc, EXAMPLES_CONTEXT).encode()).digest())
    assert combined.hex() == RDFC_COMBINED


def test_jcs_vector_intermediates():
    doc, _ = load("alumni-jcs.json")
    assert canonical.jcs(doc).decode() == JCS_DOC_CANON
    combined = hashlib.sha256(canonical.jcs(JCS_PROOF_CONFIG)).digest() + hashlib.sha256(canonical.jcs(doc)).digest()
    assert combined.hex() == JCS_COMBINED


@pytest.mark.parametrize("name, suite", [("alumni-rdfc.json", "eddsa-rdfc-2022"), ("alumni-jcs.json", "eddsa-jcs-2022")])
def test_w3c_vector_verifies_and_is_reproduced(key_pair, name, suite):
    private, public = key_pair
    doc, proof = load(name)
    assert credential.verify_proof(doc, proof, keys.parse_public_multikey(public), EXAMPLES_CONTEXT) is None
    ours = credential.create_proof(doc, private, proof["verificationMethod"], suite, CREATED, EXAMPLES_CONTEXT)
    assert ours == proof                      # Ed25519 is deterministic: byte-identical proofValue
    edited = copy.deepcopy(doc)
    edited["credentialSubject"]["alumniOf"] = "Another School"
    assert "signature does not match" in credential.verify_proof(edited, proof, keys.parse_public_multikey(public),
                                                                  EXAMPLES_CONTEXT)


# RFC 8785 §3.2.2.3 and appendix examples, plus ECMAScript Number::toString edge cases
@pytest.mark.parametrize("value, text", [
    (333333333.33333329, "333333333.3333333"), (1e30, "1e+30"), (4.50, "4.5"), (2e-3, "0.002"),
    (1e-27, "1e-27"), (1e21, "1e+21"), (1e20, "100000000000000000000"), (-0.0, "0"), (5e-7, "5e-7"),
    (1e-6, "0.000001"), (0.1 + 0.2, "0.30000000000000004"), (9007199254740991, "9007199254740991"),
])
def test_jcs_numbers(value, text):
    assert canonical.jcs(value).decode() == text


def test_jcs_rfc8785_sorting_and_strings():
    obj = {"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh",
           "1": "One", "\U0001f600": "Emoji: Grinning Face", "\u0080": "Control", "\u00f6": "Latin Small Letter O With Diaeresis"}
    keys_in_order = [k for k in json.loads(canonical.jcs(obj))]
    assert keys_in_order == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    assert canonical.jcs({"s": "\u20ac$\u000f\nA'B\"\\\\\"/"}).decode() == '{"s":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    with pytest.raises(canonical.CanonicalizationError):
        canonical.jcs(float("nan"))


def test_unknown_context_is_refused_not_fetched():
    with pytest.raises(canonical.CanonicalizationError, match="not bundled"):
        canonical.rdfc({"@context": ["https://example.org/evil-context"], "name": "x"})
