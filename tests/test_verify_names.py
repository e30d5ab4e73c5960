"""The Dutch verify page's check names: one for every check `minimega cert verify` can report.

Both verifiers name their checks in English (credential.CHECKS, verify-core.js CHECKS) and the tests
hold their words to each other; the Dutch page shows each check under a Dutch name looked up by that
English name, which stays the row's ``data-check``.
"""
import re
from pathlib import Path

from minimega.classroom import credential

PAGE_JS = Path(__file__).resolve().parents[1] / "course" / "assets" / "verify" / "verify-page.js"


def dutch_check_names(js: str) -> dict[str, str]:
    """The ``checkNames`` table of verify-page.js's Dutch words, as written there."""
    block = re.search(r"checkNames:\s*\{(.*?)\n\s*\},", js, re.S)
    assert block, "verify-page.js has no checkNames table in its Dutch words"
    pairs = re.findall(r'^\s*"([^"]+)":\s*"([^"]+)",?\s*$', block.group(1), re.M)
    body = [line for line in block.group(1).splitlines() if line.strip() and not line.strip().startswith("/")]
    assert len(pairs) == len(body), "checkNames holds a line that is not a \"check\": \"naam\" pair"
    names = dict(pairs)
    assert len(names) == len(pairs), "checkNames names a check twice"
    return names


def test_every_check_the_verifier_reports_has_a_dutch_name():
    names = dutch_check_names(PAGE_JS.read_text(encoding="utf-8"))
    missing = [c for c in credential.CHECKS if c not in names]
    assert not missing, f"no Dutch name in verify-page.js checkNames for {missing}"
    assert set(names) == set(credential.CHECKS), f"checkNames names checks no verifier reports: {set(names) - set(credential.CHECKS)}"
    assert all(nl != en for en, nl in names.items()), [en for en, nl in names.items() if nl == en]
    assert len(set(names.values())) == len(names), "two checks share a Dutch name"


def test_the_page_shows_the_dutch_name_and_keeps_the_check_id():
    js = PAGE_JS.read_text(encoding="utf-8")
    assert "tr.dataset.check = c.check;" in js and 'el("th", name)' in js
