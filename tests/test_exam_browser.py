"""The exam as a learner meets it, in Debian's chromium: from the course's navigation to the exam page, sign in
through the development mail link, start, reload mid-exam and continue, finish, review, download the credential
and verify it on the site's /verify/ page. No 404, no console error, no request leaving the service."""
import contextlib
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from classroom_support import answer_key, free_port, make_config, served
from minimega.classroom import trust
from minimega.classroom.exam import CHAPTERS
from minimega.classroom.keys import Keyring

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]

if not Path(CHROMIUM).exists():
    pytest.skip("needs Debian chromium at /usr/bin/chromium", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def service(tmp_path_factory, site_build):
    """The session's built site (`site_support.site_build`) copied and pinned to this service's issuer, as a build
    with $MINIMEGA_TRUSTED_ISSUERS set pins it (`trust.write_site_files`, the build hook's call: test_site.py checks
    the build makes it), served by the exam service at one origin with the chapters."""
    from minimega.classroom.service import create_app

    tmp = tmp_path_factory.mktemp("exam-browser")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    site = tmp / "site"
    shutil.copytree(site_build.out, site)
    config = make_config(tmp, site_dir=site, base_url=base)
    ring = Keyring.open(config.keys_path, create=True)
    trust.write_site_files(site, env={trust.ENV: " ".join(trust.service_issuers(config.issuer_did, ring.publics))})
    app = create_app(config)
    with served(app, port):
        yield base, app


def answer(page, n, response):
    if "value" in response:
        page.fill(f"#q{n}-value", repr(response["value"]))
    else:
        for i in ([response["choice"]] if "choice" in response else response["choices"]):
            page.check(f"#q{n}-c{i}")
    page.locator(f"#q{n} .mm-exam-save").click()
    sync_api.expect(page.locator(f"#fb{n}")).to_have_text("Recorded.")


def test_sign_in_reload_finish_review_download_verify(service, tmp_path, playwright):
    base, app = service
    expect = sync_api.expect
    with contextlib.nullcontext(playwright) as p:         # the session's Playwright (conftest.py)
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        ctx = browser.new_context(accept_downloads=True)
        page = ctx.new_page()
        errors, missing, outside = [], [], []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("response", lambda r: r.status >= 400 and missing.append(f"{r.status} {r.request.method} {r.url}"))
        page.on("request", lambda r: r.url.startswith((base, "data:", "blob:")) or outside.append(r.url))

        page.goto(f"{base}/")                                           # the home page links the exam
        page.locator("article a[href$='exam/']").first.click()
        page.wait_for_url(re.compile(re.escape(f"{base}/exam/") + r"(#.*)?$"))   # tracking may add a #fragment
        assert page.locator(".md-header").count() == 1                   # inside the site's theme
        assert page.locator("nav a[href$='exam/']").count() >= 1           # and in its navigation
        rules = page.locator("#mm-exam-rules")
        total, pass_mark = len(CHAPTERS), math.ceil(0.8 * len(CHAPTERS))   # one question per chapter, 80%
        expect(rules).to_contain_text(f"{total} questions")              # the service's own numbers
        for words in (f"{pass_mark} correct answers", "3 attempts per UTC day", "1 hour later",
                      "review after you finish"):
            expect(rules).to_contain_text(words)

        page.get_by_label("Your email").fill("ada@example.org")
        page.get_by_role("button", name="Send me a sign-in link").click()
        page.locator("#mm-exam-dev-link").click()                        # development mode: the mailed link
        page.get_by_label("Name, as it should appear on the certificate").fill("Ada Lovelace")
        page.get_by_role("button", name="Start the exam").click()
        expect(page.locator("fieldset.mm-exam-q")).to_have_count(total)
        (aid,) = [r[0] for r in app.state.store.conn().execute("SELECT id FROM attempts")]
        key = answer_key(app.state.store, aid)
        titles = json.loads(page.locator("#mm-exam").get_attribute("data-chapters"))
        expect(page.locator("#q1 .mm-exam-chapter")).to_have_text(f"Chapter 1: {titles['1']}")   # the site's titles
        for n in range(1, 6):
            answer(page, n, key[n][0])

        page.reload()                                                    # resume: same attempt, answers locked
        expect(page.locator("fieldset.mm-exam-q")).to_have_count(total)
        expect(page.locator("fieldset.mm-exam-q[data-locked]")).to_have_count(5)
        expect(page.locator("#fb3")).to_have_text("Recorded.")
        assert page.locator("#q3 input").first.is_disabled()
        for n in range(6, total + 1):
            answer(page, n, key[n][0] if n != total else key[n][1])       # one wrong on purpose
        assert app.state.store.conn().execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 1

        page.get_by_role("button", name="Finish and see my score").click()
        assert total - 1 >= pass_mark
        expect(page.locator("#mm-exam-score")).to_contain_text(f"{total - 1} of {total}")
        expect(page.locator(".mm-exam-review-item")).to_have_count(total)
        expect(page.locator(f".mm-exam-review-item[data-number='{total}'] h3")).to_contain_text("not correct")
        expect(page.locator(".mm-exam-review-item[data-number='1'] h3")).to_contain_text(": correct")
        with page.expect_download() as dl:
            page.locator("#mm-exam-download").click()
        saved = tmp_path / "credential.json"
        dl.value.save_as(saved)
        cred = json.loads(saved.read_text())
        assert cred["credentialSubject"]["identifier"][0]["identityHash"] == "Ada Lovelace"

        page.goto(f"{base}/verify/")
        page.set_input_files("#mm-verify-file", str(saved))
        expect(page.locator("#mm-verify-verdict")).to_have_attribute("data-valid", "true")
        expect(page.locator("#mm-verify-claims")).to_contain_text("Ada Lovelace")
        browser.close()
    assert errors == [] and missing == [] and outside == [], (errors, missing, outside)


def test_practice_quiz_options_are_shuffled_at_every_render(service, playwright):
    """The site shuffles a practice item's options client-side; grading still uses bank indices."""
    base, _ = service
    with contextlib.nullcontext(playwright) as p:         # the session's Playwright (conftest.py)
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page()
        orders = set()
        for _ in range(8):
            page.goto(f"{base}/03-zero/")
            page.wait_for_selector(".mm-quiz[data-ready='1']")
            values = page.eval_on_selector_all("#q-03-zero-faq-zero-stage-saves-most input", "els => els.map(e => e.value)")
            orders.add(tuple(values))
        page.check("#q-03-zero-faq-zero-stage-saves-most-0")             # bank index 0 is the key, wherever shown
        page.locator("#q-03-zero-faq-zero-stage-saves-most .mm-check").click()
        sync_api.expect(page.locator("#q-03-zero-faq-zero-stage-saves-most .mm-feedback")).to_contain_text("Correct.")
        browser.close()
    assert len(orders) >= 3, orders                                       # 24 orders possible; 8 renders
