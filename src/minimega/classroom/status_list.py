"""Revocation by W3C Bitstring Status List v1.0.

Every credential gets one random index into a list of `LIST_BITS` bits (16 KiB, the spec's minimum,
so that one index hides among 131,072). Revoking sets that bit. The list is published as a
`BitstringStatusListCredential` signed by the same issuer, with a short `validUntil`: a verifier
rejects a list that is stale (past `validUntil`) or forged (bad proof, other issuer), so an old
"not revoked" answer cannot be replayed for ever.

Encoding (spec §2.1): bit 0 is the most significant bit of byte 0; the bytes are GZIP-compressed
and written as multibase base64url without padding (prefix ``u``).
"""
from __future__ import annotations

import base64
import binascii
import gzip
import json
import re
import zlib

LIST_BITS = 131_072
PURPOSE = "revocation"
MAX_LIST_BYTES = 16 * LIST_BITS // 8
"""The largest decoded list a verifier accepts (256 KiB, 16 times ours): a gzip bomb stops here."""


class StatusListError(ValueError):
    """A status list or entry that does not follow the spec."""


def encode(bits: bytes | bytearray) -> str:
    # mtime=0 makes the bytes, hence the signature input, a function of the bits alone
    packed = gzip.compress(bytes(bits), compresslevel=9, mtime=0)
    return "u" + base64.urlsafe_b64encode(packed).rstrip(b"=").decode("ascii")


def decode(encoded: str) -> bytes:
    """The list's bytes; StatusListError if it is not base64url of a gzip of at most MAX_LIST_BYTES."""
    if not isinstance(encoded, str) or not encoded.startswith("u"):
        raise StatusListError("encodedList must be multibase base64url (prefix 'u')")
    body = encoded[1:]
    if not re.fullmatch(r"[A-Za-z0-9_-]*", body):
        raise StatusListError("encodedList does not decode (base64url, then gzip)")
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        inflate = zlib.decompressobj(wbits=31)              # gzip framing
        bits = inflate.decompress(raw, MAX_LIST_BYTES + 1)
    except (ValueError, binascii.Error, zlib.error):
        raise StatusListError("encodedList does not decode (base64url, then gzip)") from None
    if len(bits) > MAX_LIST_BYTES:
        raise StatusListError(f"encodedList decodes to more than {MAX_LIST_BYTES} bytes")
    if not inflate.eof:
        raise StatusListError("encodedList does not decode (base64url, then gzip)")
    return bits


def make_bits(revoked: list[int] | set[int], size: int = LIST_BITS) -> bytearray:
    bits = bytearray(size // 8)
    for i in revoked:
        if not 0 <= i < size:
            raise StatusListError(f"index {i} outside a list of {size} bits")
        bits[i // 8] |= 0x80 >> (i % 8)
    return bits


def bit(bits: bytes, index: int) -> bool:
    if not 0 <= index < len(bits) * 8:
        raise StatusListError(f"statusListIndex {index} outside a list of {len(bits) * 8} bits")
    return bool(bits[index // 8] & (0x80 >> (index % 8)))


def entry(list_url: str, index: int) -> dict:
    """The `credentialStatus` a credential carries."""
    return {"id": f"{list_url}#{index}", "type": "BitstringStatusListEntry", "statusPurpose": PURPOSE,
            "statusListIndex": str(index), "statusListCredential": list_url}


def list_credential(*, list_url: str, issuer: str, revoked: list[int] | set[int],
                    valid_from: str, valid_until: str) -> dict:
    """The unsigned status list credential (sign it with `credential.add_proofs`)."""
    return {
        "@context": ["https://www.w3.org/ns/credentials/v2"],
        "id": list_url,
        "type": ["VerifiableCredential", "BitstringStatusListCredential"],
        "issuer": issuer,
        "validFrom": valid_from,
        "validUntil": valid_until,
        "credentialSubject": {"id": f"{list_url}#list", "type": "BitstringStatusList",
                              "statusPurpose": PURPOSE, "encodedList": encode(make_bits(revoked))},
    }


def parse_entry(status: object) -> tuple[str, int]:
    """(status list URL, index) of a credential's `credentialStatus`, validated."""
    if not isinstance(status, dict):
        raise StatusListError("credentialStatus is missing or not an object")
    if status.get("type") != "BitstringStatusListEntry" or status.get("statusPurpose") != PURPOSE:
        raise StatusListError("credentialStatus is not a BitstringStatusListEntry for revocation")
    index = status.get("statusListIndex")
    if not isinstance(index, str) or not re.fullmatch(r"[0-9]{1,9}", index):
        raise StatusListError(f"statusListIndex must be a decimal string, got {_show(index)}")
    url = status.get("statusListCredential")
    if not isinstance(url, str) or not url.startswith(("https://", "http://")):
        raise StatusListError(f"statusListCredential must be a URL, got {_show(url)}")
    return url, int(index)


def _show(value) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":")) if value is not None else "missing"
    return text if len(text) <= 60 else text[:60] + "…"
