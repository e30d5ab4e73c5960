"""Who a learner is: the display name signed on a certificate, the email they sign in with, and the keyed hash
of that email every limit is counted on."""
from __future__ import annotations

import hashlib
import hmac
import re
import unicodedata

from .errors import ExamError


# Characters that render as nothing (or reorder text) although Unicode does not class them as
# format characters: Hangul fillers, the braille blank, the Khmer inherent vowels, Mongolian
# free variation selectors and vowel separator, the combining grapheme joiner.
INVISIBLE = set("\u115f\u1160\u3164\uffa0\u2800\u17b4\u17b5\u180b\u180c\u180d\u180e\u180f\u034f")
MAX_COMBINING = 3
"""Combining marks allowed on one base character (Vietnamese needs 2; zalgo text uses dozens)."""
NAME_MAX = 100


def clean_name(name: str) -> str:
    """A display name as it will be signed: NFC, one line of 1..100 visible characters.

    Refused (not silently dropped, so what is signed is what was typed): control, format (bidi
    overrides, zero-width, tag characters), private-use, unassigned and separator characters other
    than the space, the invisible fillers of `INVISIBLE`, more than `MAX_COMBINING` combining marks on
    one character. Runs of spaces collapse to one.
    """
    if not isinstance(name, str):
        raise ExamError("display name: a string", 422)
    name = " ".join(unicodedata.normalize("NFC", name).split(" ")).strip(" ")
    name = re.sub(" {2,}", " ", name)
    run = visible = 0
    for ch in name:
        cat = unicodedata.category(ch)
        if cat in ("Cc", "Cf", "Co", "Cn", "Cs", "Zl", "Zp") or (cat == "Zs" and ch != " ") or ch in INVISIBLE:
            raise ExamError(f"display name: character U+{ord(ch):04X} ({unicodedata.name(ch, cat)}) is not "
                            "allowed; type the name with visible characters only", 422)
        if cat.startswith("M"):
            run += 1
            if run > MAX_COMBINING or visible == 0:
                raise ExamError(f"display name: at most {MAX_COMBINING} combining marks on one character", 422)
        else:
            run = 0
            visible += ch != " "
    if not 1 <= visible or len(name) > NAME_MAX:
        raise ExamError(f"display name: 1 to {NAME_MAX} visible characters", 422)
    return name


EMAIL = re.compile(r"[^@\s\x00-\x1f\x7f]{1,64}@[A-Za-z0-9.-]{1,189}\.[A-Za-z]{2,63}")


def clean_email(email: str) -> str:
    email = unicodedata.normalize("NFC", email or "").strip()
    if len(email) > 254 or not EMAIL.fullmatch(email):
        raise ExamError("email: not an address like name@example.org", 422)
    return email


def learner_key(pepper: bytes, email: str) -> str:
    """A learner's key: the database's pepper over their address (the store never holds the address)."""
    ident = f"email:{email.strip().lower()}"
    return hmac.new(pepper, ident.encode("utf-8"), hashlib.sha256).hexdigest()
