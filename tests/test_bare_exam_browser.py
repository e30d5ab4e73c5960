"""The bare exam page of a service with no course site, in Debian's chromium: a Dutch learner opens /nl/exam/,
signs in through the mailed (development) link, which brings them back to /nl/exam/, and takes an attempt in
Dutch. An English learner on /exam/ gets English. No 404, no console error, no request leaving the service."""

import pytest

from classroom_support import answer_key, free_port, make_config, served
from minimega.classroom.exam import CHAPTERS

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def bare_service(tmp_path_factory):
    from minimega.classroom.service import create_app

    tmp = tmp_path_factory.mktemp("bare-exam")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    app = create_app(make_config(tmp, base_url=base))                 # tmp/site does not exist: no site built
    with served(app, port):
        yield base, app


def _watched(chromium, base):
    ctx = chromium.new_context()
    page = ctx.new_page()
    trouble = []
    page.on("pageerror", lambda e: trouble.append(str(e)))
    page.on("console", lambda m: m.type == "error" and trouble.append(m.text))
    page.on("response", lambda r: r.status >= 400 and trouble.append(f"{r.status} {r.request.method} {r.url}"))
    page.on("request", lambda r: r.url.startswith((base, "data:")) or trouble.append(f"outside: {r.url}"))
    return ctx, page, trouble


def test_a_dutch_learner_takes_the_exam_on_the_bare_dutch_page(bare_service, chromium):
    base, app = bare_service
    expect = sync_api.expect
    ctx, page, trouble = _watched(chromium, base)
    page.goto(f"{base}/nl/")                                         # the service's home, in Dutch
    page.wait_for_url(f"{base}/nl/exam/")
    assert page.evaluate("document.documentElement.lang") == "nl"
    expect(page.locator("#mm-exam-rules")).to_contain_text(f"{len(CHAPTERS)} vragen")
    page.get_by_label("Je e-mailadres").fill("jan@example.org")
    page.get_by_role("button", name="Stuur me een inloglink").click()
    link = page.locator("#mm-exam-dev-link").get_attribute("href")
    assert link.startswith(f"{base}/nl/exam/#signin="), link            # the mail leads back to the Dutch page
    page.goto(link)
    expect(page.locator("#mm-exam-limits")).to_contain_text("Je hebt vandaag (UTC) nog 3 van 3 pogingen.")
    page.get_by_label("Je naam, zoals die op het certificaat moet staan").fill("Jan Jansen")
    page.get_by_role("button", name="Start het examen").click()
    expect(page.locator("fieldset.mm-exam-q")).to_have_count(len(CHAPTERS))
    (aid, lang), = app.state.store.conn().execute("SELECT id, lang FROM attempts").fetchall()
    assert lang == "nl"                                               # the page's language started the attempt
    expect(page.locator("#q1 legend")).to_have_text("Vraag 1")
    page.locator("#q1 input").first.wait_for()
    response = answer_key(app.state.store, aid)[1][0]
    if "value" in response:
        page.fill("#q1-value", str(response["value"]).replace(".", ","))
    else:
        page.check(f"#q1-c{response['choice'] if 'choice' in response else response['choices'][0]}")
    page.locator("#q1 .mm-exam-save").click()
    expect(page.locator("#fb1")).to_have_text("Vastgelegd.")
    page.get_by_role("link", name="English").click()                  # the other language, same attempt
    page.wait_for_url(f"{base}/exam/")
    assert page.evaluate("document.documentElement.lang") == "en"
    expect(page.locator("#mm-exam-rules")).to_contain_text(f"{len(CHAPTERS)} questions")
    expect(page.locator("fieldset.mm-exam-q[data-locked]")).to_have_count(1)   # resumed: the answer stays locked
    ctx.close()
    assert trouble == [], trouble
