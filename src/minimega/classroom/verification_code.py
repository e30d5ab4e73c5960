"""Short human verification codes: 80 random bits in Crockford base32, plus a check character.

``7G3K-Q0ZB-1M4X-8RTD-$``: 16 data characters (10 bytes) in groups of four and one check symbol,
the value mod 37 (Crockford's extra symbols ``*~$=U`` cover 32..36). Reading it back forgives
case, hyphens and spaces, and the look-alikes I/L (read as 1) and O (read as 0); a single mistyped
character, or two swapped neighbours, fails the check instead of finding another certificate.
"""
from __future__ import annotations

import secrets

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
CHECK = ALPHABET + "*~$=U"
_ALIASES = str.maketrans({"I": "1", "L": "1", "O": "0"})


class CodeError(ValueError):
    pass


def _check_symbol(body: str) -> str:
    value = 0
    for ch in body:
        value = value * 32 + ALPHABET.index(ch)
    return CHECK[value % 37]


def new_code() -> str:
    n = int.from_bytes(secrets.token_bytes(10), "big")
    body = "".join(ALPHABET[(n >> (5 * i)) & 31] for i in reversed(range(16)))
    return "-".join(body[i:i + 4] for i in range(0, 16, 4)) + "-" + _check_symbol(body)


def normalize(code: str) -> str:
    """The canonical form of a typed code, or `CodeError` saying what is wrong."""
    if not isinstance(code, str):
        raise CodeError("a verification code is text")
    raw = code.strip().upper().replace("-", "").replace(" ", "")
    if len(raw) != 17:
        raise CodeError(f"a verification code has 16 characters and a check symbol, got {len(raw)}")
    body, check = raw[:16].translate(_ALIASES), raw[16]
    if bad := sorted({ch for ch in body if ch not in ALPHABET}):
        raise CodeError(f"characters {''.join(bad)!r} are not in a verification code")
    if check not in CHECK or _check_symbol(body) != check:
        raise CodeError("the check symbol does not match: a character is mistyped")
    return "-".join(body[i:i + 4] for i in range(0, 16, 4)) + "-" + check
