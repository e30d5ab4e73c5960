"""The verify page on the shared tamper cases (tests/verify_cases.py): under Node (the page's verifier
module) and in chromium (the built page, its pinned trust, its rendering). Every check's name, status
and words must equal what `credential.verify`, the CLI's verifier, reports for the same input."""
import contextlib
import functools
import http.server
import json
import shutil
import subprocess
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

import verify_cases
from verify_cases import assert_truthful
from minimega.classroom import credential, trust
from minimega.classroom.claims import claims_of

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "course" / "assets" / "verify" / "verify-core.js"
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def status_list_of(case):
    cred = case["credential"]
    url = (cred.get("credentialStatus") or {}).get("statusListCredential") if isinstance(cred, dict) else None
    return case["lists"].get(url) if isinstance(url, str) else None


def text_of(case) -> str:
    cred = case["credential"]
    return cred if isinstance(cred, str) else json.dumps(cred)


def did_documents(case) -> dict:
    doc = case["did_document"]
    return {doc["id"]: doc} if doc else {}


def python_checks(case, base) -> tuple[str, list[list[str]]]:
    """What the CLI's verifier says about `case`: (verdict, [[check, status, detail], …])."""
    r = credential.verify(text_of(case), trusted_issuers=set(verify_cases.trusted_dids(base)),
                          did_documents=did_documents(case), status_list_credential=status_list_of(case))
    return r.verdict, [[c.name, c.status, c.detail] for c in r.checks]


def test_verify_core_under_node_matches_python(tmp_path):
    if not shutil.which("node"):
        pytest.skip("node not installed")
    base = "https://course.example"
    cases = verify_cases.make_cases(base)
    data = tmp_path / "cases.json"
    data.write_text(json.dumps([{"name": c["name"], "text": text_of(c), "list": status_list_of(c),
                                 "dids": did_documents(c)} for c in cases]))
    script = tmp_path / "run.js"
    script.write_text("""
const V = require(process.argv[2]);
const cases = JSON.parse(require("fs").readFileSync(process.argv[3]));
(async () => {
  const out = {};
  for (const c of cases)
    out[c.name] = await V.verifyCredential(c.text,
      { trustedIssuers: JSON.parse(process.argv[4]), statusList: c.list, didDocuments: c.dids });
  console.log(JSON.stringify(out));
})();
""")
    run = subprocess.run(["node", str(script), str(CORE), str(data), json.dumps(verify_cases.trusted_dids(base))],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    js = json.loads(run.stdout)
    for case in cases:
        got = js[case["name"]]
        verdict, checks = python_checks(case, base)
        assert [[c["check"], c["status"], c["detail"]] for c in got["checks"]] == checks, case["name"]
        assert got["verdict"] == verdict == case["verdict"], case["name"]
        assert_truthful(got["checks"], case)


# --- the built page in chromium ------------------------------------------------------------------

class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory, site_build):
    """The session's site (`site_support.site_build`), copied and pinned to the genuine issuer as a build with
    $MINIMEGA_TRUSTED_ISSUERS set pins it (`trust.write_site_files`, the build hook's own call; test_site.py
    checks the build makes it), plus each case's status lists at their URLs."""
    if not Path(CHROMIUM).exists():
        pytest.skip("needs Debian chromium at /usr/bin/chromium")
    pytest.importorskip("playwright.sync_api")
    out = tmp_path_factory.mktemp("verify-site") / "site"
    shutil.copytree(site_build.out, out)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(out)))
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    trust.write_site_files(out, env={trust.ENV: " ".join(verify_cases.trusted_dids(base))})
    cases = verify_cases.make_cases(base)
    for case in cases:
        for url, doc in case["lists"].items():
            path = out / urlparse(url).path.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(doc))
        if case["did_document"]:
            (out / ".well-known").mkdir(exist_ok=True)
            (out / ".well-known" / "did.json").write_text(json.dumps(case["did_document"]))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield base, out, cases
    httpd.shutdown()


@pytest.fixture(scope="module")
def page(served, playwright):
    with contextlib.nullcontext(playwright) as p:          # the session's Playwright (conftest.py)
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        pg = browser.new_page()
        errors = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.errors = errors
        yield pg
        browser.close()


def verify_in_page(pg, text: str) -> dict:
    pg.evaluate("document.getElementById('mm-verify-result').replaceChildren()")
    pg.fill("#mm-verify-text", text)
    pg.click("#mm-verify-button")
    pg.wait_for_selector("#mm-verify-verdict", timeout=20_000)
    return pg.evaluate("""() => ({
        verdict: document.getElementById('mm-verify-verdict').dataset.verdict,
        valid: document.getElementById('mm-verify-verdict').dataset.valid,
        headline: document.getElementById('mm-verify-verdict').textContent,
        checks: [...document.querySelectorAll('#mm-verify-checks tr[data-check]')].map(r => ({
            check: r.dataset.check, status: r.dataset.status,
            mark: r.querySelector('.mm-check-status').textContent,
            detail: r.querySelector('.mm-check-detail').textContent})),
        claims: document.getElementById('mm-verify-claims').textContent,
        bank: [...document.querySelectorAll('#mm-verify-claims tr[data-claim="exam_bank"] td')].map(td => td.textContent)})""")


@pytest.mark.browser
def test_page_on_every_shared_case(served, page):
    base, site, cases = served
    assert json.loads((site / trust.SITE_FILE).read_text()) == \
        {"issuers": [{"id": did, "name": "this site's issuer"} for did in verify_cases.trusted_dids(base)]}
    page.goto(f"{base}/verify/")
    pinned = page.locator("#mm-verify-pinned")
    pinned.filter(has_text="This site trusts 2 issuers").wait_for()
    assert all(did in pinned.inner_text() for did in verify_cases.trusted_dids(base))
    marks = {"pass": "✓ pass", "fail": "✗ fail", "n/a": "– n/a"}
    for case in cases:
        got = verify_in_page(page, text_of(case))
        verdict, checks = python_checks(case, base)
        assert [[c["check"], c["status"], c["detail"]] for c in got["checks"]] == checks, case["name"]
        assert got["verdict"] == verdict == case["verdict"], case["name"]
        assert got["valid"] == str(case["verdict"] == "valid").lower()
        assert_truthful(got["checks"], case)
        assert all(c["mark"] == marks[c["status"]] for c in got["checks"]), case["name"]
        if verdict == credential.NOT_TRUSTED:
            assert got["headline"].startswith("Signature valid, issuer not trusted: " + verify_cases.ATTACKER.did)
        if verdict == "valid":
            assert got["headline"].startswith("Valid certificate") and "Ada Lovelace" in got["claims"]
            if isinstance(case["credential"], dict):          # the bank row: the line the CLI prints
                assert got["bank"] == [claims_of(case["credential"])["exam_bank"]] != [None], case["name"]
    assert page.errors == []


@pytest.mark.browser
def test_page_trusts_only_its_pin(served, page):
    """The same genuine credential, with the pin emptied or naming someone else: not trusted."""
    base, _, cases = served
    genuine = text_of(cases[0])
    for pin in ({"issuers": []}, {"issuers": [{"id": verify_cases.ATTACKER.did, "name": "x"}]}):
        body = json.dumps(pin)
        page.route(f"{base}/verify/trusted-issuers.json",
                   lambda route: route.fulfill(status=200, body=body, content_type="application/json"))
        page.goto(f"{base}/verify/")
        said = "pins no issuer" if not pin["issuers"] else "trusts 1 issuer: " + verify_cases.ATTACKER.did
        page.locator("#mm-verify-pinned").filter(has_text=said).wait_for()
        got = verify_in_page(page, genuine)
        assert got["verdict"] == credential.NOT_TRUSTED and got["valid"] == "false"
        trusted = next(c for c in got["checks"] if c["check"] == "issuer trusted")
        assert trusted["status"] == "fail" and f"is not one of the {len(pin['issuers'])} trusted issuers" in trusted["detail"]
        page.unroute(f"{base}/verify/trusted-issuers.json")
    page.goto(f"{base}/verify/")
    assert verify_in_page(page, genuine)["verdict"] == "valid"
    assert page.errors == []


@pytest.mark.browser
def test_dutch_page_names_every_check_in_dutch(served, page):
    """/nl/verify/: the same checks and statuses as the CLI, each shown under its Dutch name."""
    from test_verify_names import PAGE_JS, dutch_check_names
    names = dutch_check_names(PAGE_JS.read_text(encoding="utf-8"))
    base, _, cases = served
    page.goto(f"{base}/nl/verify/")
    page.locator("#mm-verify-pinned").filter(has_text="Deze site vertrouwt 2 uitgevers").wait_for()
    for case in (cases[0], next(c for c in cases if c["verdict"] == "invalid")):
        verify_in_page(page, text_of(case))
        shown = page.evaluate("""[...document.querySelectorAll('#mm-verify-checks tr[data-check]')]
            .map(r => [r.dataset.check, r.dataset.status, r.querySelector('th').textContent])""")
        _, checks = python_checks(case, base)
        assert [[c, s] for c, s, _ in shown] == [[c, s] for c, s, _ in checks], case["name"]
        assert [name for _, _, name in shown] == [names[c] for c, _, _ in checks], case["name"]
    assert page.errors == []
