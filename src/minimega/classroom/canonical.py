"""Canonical bytes for signing: RFC 8785 JSON (JCS) and RDF Dataset Canonicalization (RDFC-1.0).

A signature covers bytes, a credential is JSON: both proofs on a certificate first turn the JSON into
one canonical byte string.

- `jcs(value)` — RFC 8785: object members sorted by their UTF-16 code units, no whitespace, strings
  escaped as ECMAScript's `JSON.stringify` does, numbers in ECMAScript's shortest form. Used by
  `eddsa-jcs-2022`; the verify page reimplements it in a dozen lines of JS.
- `rdfc(document)` — the JSON-LD document expanded to RDF and canonicalized (pyld's URDNA2015, the
  algorithm RDFC-1.0 standardised) into sorted N-Quads. Used by `eddsa-rdfc-2022`. Contexts come
  from the files bundled in `contexts/`; nothing is ever fetched, so an unknown context is an error.
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources

CONTEXT_FILES = {
    "https://www.w3.org/ns/credentials/v2": "credentials-v2.json",
    "https://w3id.org/security/data-integrity/v2": "data-integrity-v2.json",
    "https://purl.imsglobal.org/spec/ob/v3p0/context-3.0.3.json": "ob-v3p0-context-3.0.3.json",
}
"""Context URL -> bundled file (see contexts/README.md for where each came from)."""


class CanonicalizationError(ValueError):
    """The input cannot be canonicalized (a non-JSON value, an unknown JSON-LD context, ...)."""


# ---------------------------------------------------------------------------------------------
# RFC 8785 JSON Canonicalization Scheme
# ---------------------------------------------------------------------------------------------

def _number(x: int | float) -> str:
    """ECMAScript Number::toString for a finite double (RFC 8785 §3.2.2.3)."""
    if isinstance(x, bool):
        raise CanonicalizationError("booleans are not numbers")
    if isinstance(x, int):
        if abs(x) > 2**53:
            raise CanonicalizationError(f"integer {x} is not exactly representable as an IEEE double")
        x = float(x)
    if not math.isfinite(x):
        raise CanonicalizationError(f"{x} has no JSON form")
    if x == 0:
        return "0"                                   # also -0
    sign = "-" if x < 0 else ""
    # repr gives the shortest digits that round-trip, as ECMAScript does; only the layout differs.
    digits, point = _shortest_digits(abs(x))
    k, n = len(digits), point                        # value = 0.digits * 10**n
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        out = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return sign + out


def _shortest_digits(x: float) -> tuple[str, int]:
    """(digits, n) with x == 0.d1d2...dk × 10**n and the fewest digits that round-trip."""
    r = repr(x)                                      # e.g. '333333333.3333333', '1e+30', '1e-27'
    mant, _, exp = r.partition("e")
    e = int(exp) if exp else 0
    whole, _, frac = mant.partition(".")
    if frac == "0":
        frac = ""
    digits = (whole + frac).lstrip("0")
    lead_zeros = len(whole + frac) - len((whole + frac).lstrip("0"))
    n = len(whole) - lead_zeros + e
    return digits.rstrip("0") or "0", n


def _string(s: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as err:
        raise CanonicalizationError(f"string holds a lone surrogate: {s!r}") from err
    return json.dumps(s, ensure_ascii=False)         # escapes exactly ", \ and U+0000..U+001F


def _jcs(value) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (int, float)):
        return _number(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_jcs(v) for v in value) + "]"
    if isinstance(value, dict):
        if any(not isinstance(k, str) for k in value):
            raise CanonicalizationError("object keys must be strings")
        keys = sorted(value, key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(_string(k) + ":" + _jcs(value[k]) for k in keys) + "}"
    raise CanonicalizationError(f"{type(value).__name__} is not a JSON value")


def jcs(value) -> bytes:
    """RFC 8785 canonical JSON of `value`, UTF-8 encoded."""
    return _jcs(value).encode("utf-8")


# ---------------------------------------------------------------------------------------------
# RDF Dataset Canonicalization over bundled contexts
# ---------------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def bundled_context(url: str) -> dict:
    """The parsed context document bundled for `url`."""
    name = CONTEXT_FILES.get(url)
    if name is None:
        raise CanonicalizationError(
            f"JSON-LD context {url!r} is not bundled (known: {sorted(CONTEXT_FILES)}); "
            "minimega never fetches contexts")
    return json.loads(resources.files(__package__).joinpath("contexts", name).read_text("utf-8"))


def document_loader(extra: dict[str, dict] | None = None):
    """A pyld document loader that serves only bundled contexts (plus `extra`, e.g. test fixtures)."""
    extra = dict(extra or {})

    def load(url, options=None):
        doc = extra[url] if url in extra else bundled_context(url)
        return {"contextUrl": None, "documentUrl": url, "document": doc}

    return load


def rdfc(document: dict, extra_contexts: dict[str, dict] | None = None) -> str:
    """Canonical N-Quads of a JSON-LD document (RDFC-1.0 / URDNA2015)."""
    from pyld import jsonld

    try:
        return jsonld.normalize(document, {
            "algorithm": "URDNA2015", "format": "application/n-quads",
            "documentLoader": document_loader(extra_contexts),
        })
    except jsonld.JsonLdError as err:
        cause = err
        while cause.__cause__ is not None:               # pyld wraps the loader's error several times
            cause = cause.__cause__
        if isinstance(cause, CanonicalizationError):
            raise cause from err
        raise CanonicalizationError(f"JSON-LD processing failed: {cause}") from err
