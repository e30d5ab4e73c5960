"""The exam page keeps the certificate, in Debian's chromium on the bare page (the same exam.js as the site's):
pass, reload, and the code and its links are still there, in English and in Dutch; the deadline in local time with
a countdown, the answered counter sticky at the top, the result at the top; no control is shown that cannot act,
and none that is shown throws."""
import re
from urllib.parse import quote

import pytest

from classroom_support import answer_key, free_port, make_config, served

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    from minimega.classroom.service import create_app

    tmp = tmp_path_factory.mktemp("exam-page")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    app = create_app(make_config(tmp, base_url=base))                 # no site built: the bare page
    with served(app, port):
        yield base, app


def _visible_buttons(page):
    return [b for b in page.locator("#mm-exam button").all() if b.is_visible()]


def test_pass_reload_and_the_certificate_is_still_there(service, chromium):
    base, app = service
    expect = sync_api.expect
    ctx = chromium.new_context(timezone_id="Europe/Amsterdam", viewport={"width": 390, "height": 800})
    page = ctx.new_page()
    trouble = []
    page.on("pageerror", lambda e: trouble.append(str(e)))
    page.on("console", lambda m: m.type == "error" and trouble.append(m.text))
    page.on("response", lambda r: r.status >= 400 and trouble.append(f"{r.status} {r.request.method} {r.url}"))

    page.goto(f"{base}/exam/")
    expect(page.locator("#mm-exam-finish")).to_be_hidden()               # nothing to finish before signing in
    page.get_by_label(re.compile("Your email")).fill("grace@example.org")
    page.get_by_role("button", name="Send me a sign-in link").click()
    page.goto(page.locator("#mm-exam-dev-link").get_attribute("href"))
    expect(page.locator("#mm-exam-limits")).to_contain_text("attempts left today")
    expect(page.locator("#mm-exam-mine")).to_be_hidden()                 # no certificate yet
    expect(page.locator("#mm-exam-finish")).to_be_hidden()
    page.get_by_label(re.compile("Name, as it should appear")).fill("Grace Hopper")
    page.get_by_role("button", name="Start the exam").click()
    expect(page.locator("fieldset.mm-exam-q").first).to_be_visible()

    status = page.locator("#mm-exam-status").inner_text()
    assert not re.search(r"\d{4}-\d\d-\d\dT", status), status           # not raw ISO UTC: local time
    assert re.search(r"\d+ h \d+ min \d+ s left", page.locator("#mm-exam-countdown").inner_text())
    progress = page.locator("#mm-exam-progress")
    assert progress.evaluate("e => getComputedStyle(e).position") == "sticky"
    first_q = page.locator("fieldset.mm-exam-q").first.bounding_box()
    assert progress.bounding_box()["y"] < first_q["y"]                   # the counter above the questions

    (aid,) = app.state.store.conn().execute("SELECT id FROM attempts").fetchone()
    key = answer_key(app.state.store, aid)
    for n, (right, _) in sorted(key.items()):
        if "value" in right:
            page.fill(f"#q{n}-value", repr(right["value"]))
        else:
            for i in ([right["choice"]] if "choice" in right else right["choices"]):
                page.check(f"#q{n}-c{i}")
        page.locator(f"#q{n} .mm-exam-save").click()
        expect(page.locator(f"#fb{n}")).to_have_text("Recorded.")
    page.mouse.wheel(0, 5000)                                           # scrolled down: the counter stays in view
    assert 0 <= progress.bounding_box()["y"] < 100
    expect(progress).to_contain_text(f"{len(key)} of {len(key)} answered")
    page.locator("#mm-exam-finish").click()

    expect(page.locator("#mm-exam-result h2")).to_have_text("Passed")
    code = page.locator("#mm-exam-code").inner_text().split(": ")[1]
    expect(page.locator("#mm-exam-review h2")).to_be_visible()         # the review is in (then the page scrolls)
    result_y, review_y = page.evaluate("() => ['mm-exam-result', 'mm-exam-review'].map("
                                       "id => document.getElementById(id).getBoundingClientRect().top)")
    assert result_y < review_y                   # the result above the review (both read at one scroll position)
    expect(page.locator("#mm-exam-exam")).to_be_hidden()                 # not below 48 locked questions
    expect(page.locator("#mm-exam-finish")).to_be_hidden()

    page.reload()                                                       # the learner comes back later
    mine = page.locator("#mm-exam-mine")
    expect(mine).to_be_visible()
    item = mine.locator(f"li[data-code='{code}']")
    expect(item).to_contain_text(code)
    hrefs = [a.get_attribute("href") for a in item.locator("a").all()]
    # the check symbol may be one of Crockford's *~$=U: the query escapes it as a URL would (= is %3D)
    assert hrefs == [f"/api/v1/credentials/{code}", f"/certificates/{code}", f"/certificates/{code}.svg",
                     f"/verify/?c={quote(code, safe='*')}"], hrefs
    for href in hrefs[:3]:
        assert page.request.get(base + href).status == 200, href
    expect(page.locator("#mm-exam-finish")).to_be_hidden()

    # every control shown can act: click each, none throws (the old page threw on "Finish" with nothing open)
    for name in ("Review my last attempt", "Back to the start"):
        page.get_by_role("button", name=name).click()
        expect(mine).to_be_visible()
    for button in _visible_buttons(page):
        if button.get_attribute("id") not in ("mm-exam-signout", "mm-exam-begin"):
            button.click()
    assert "cannot" not in " ".join(trouble) and not trouble, trouble

    page.goto(f"{base}/nl/exam/")                                      # the same learner, in Dutch
    expect(page.locator(f"#mm-exam-mine li[data-code='{code}']")).to_contain_text("uitgereikt")
    expect(page.locator("#mm-exam-mine-h")).to_have_text("Jouw certificaten")
    assert not trouble, trouble
    ctx.close()


@pytest.fixture(scope="module")
def slow_service(tmp_path_factory):
    """A service with the 5-minute minimum attempt time and a clock the test moves."""
    import time

    from minimega.classroom.service import create_app

    now = [time.time()]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    app = create_app(make_config(tmp_path_factory.mktemp("exam-early"), base_url=base, min_attempt_s=300),
                     clock=lambda: now[0])
    with served(app, port):
        yield base, app, now


def test_an_early_finish_says_when_next_to_the_button_and_dutch_numbers(slow_service, chromium):
    """Finish within the minimum time: the message sits next to the button, visible, counting down (it used to go
    into the hidden result section). Then, the time passed, the Dutch result and review print Dutch numbers: a
    decimal comma, "6,3 %", and each answer to the significant figures its question asks."""
    base, app, now = slow_service
    expect = sync_api.expect
    ctx = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    trouble = []
    page.on("pageerror", lambda e: trouble.append(str(e)))
    page.goto(f"{base}/nl/exam/")
    page.fill("#mm-exam-email", "ada@example.org")
    page.click("#mm-exam-send")
    page.goto(page.locator("#mm-exam-dev-link").get_attribute("href"))
    page.fill("#mm-exam-name", "Ada Lovelace")
    page.click("#mm-exam-begin")
    expect(page.locator("fieldset.mm-exam-q").first).to_be_visible()
    (aid,) = app.state.store.conn().execute("SELECT id FROM attempts").fetchone()
    key = answer_key(app.state.store, aid)
    n, (right, _) = min((n, r) for n, r in key.items() if "value" in r[0])     # one answer, typed the Dutch way
    page.fill(f"#q{n}-value", repr(right["value"]).replace(".", ","))
    page.locator(f"#q{n} .mm-exam-save").click()
    expect(page.locator(f"#fb{n}")).to_have_text("Vastgelegd.")
    page.on("dialog", lambda d: d.accept())                            # "unanswered count as wrong": finish anyway
    page.click("#mm-exam-finish")
    status = page.locator("#mm-exam-finish-status")
    expect(status).to_be_visible()
    expect(status).to_contain_text("Te vroeg om af te ronden: dat kan over")
    first = int(re.search(r"over (\d+) s", status.inner_text()).group(1))
    assert 290 <= first <= 301, first
    page.wait_for_function("first => Number((/over (\\d+) s/.exec(document.getElementById("
                           "'mm-exam-finish-status').textContent) || [0, 999])[1]) < first", arg=first,
                           timeout=3000)                                   # counting down
    box = page.locator("#mm-exam-finish").bounding_box()
    near = status.bounding_box()
    assert abs(near["y"] - box["y"]) < box["height"]                   # on the button's line, in its paragraph
    assert status.evaluate("e => e.parentElement === document.getElementById('mm-exam-finish').parentElement")
    now[0] += 301
    page.click("#mm-exam-finish")
    total = len(key)
    percent = f"{round(100 / total, 1):g}".replace(".", ",")              # 1 of 16: 6,3 %
    expect(page.locator("#mm-exam-score")).to_contain_text(f"({percent} %)")
    expect(page.locator("#mm-exam-review h2")).to_be_visible()
    review = page.evaluate("""async (aid) => (await (await fetch(`/api/v1/attempts/${aid}/review`, {headers:
        {Authorization: `Bearer ${localStorage.getItem("minimega.exam.session")}`}})).json()).items""", aid)
    numeric = [q for q in review if q["type"] == "numeric"]
    assert numeric
    for q in numeric:                          # "Antwoord: 1,10 GB": the figures asked, a decimal comma, no point
        shown = page.locator(f"#mm-exam-review section[data-number='{q['number']}'] p",
                             has_text=re.compile("^Antwoord: ")).inner_text().split(": ")[1].split()[0]
        digits = re.sub(r"^[-0]*", "", shown.replace(",", ""))
        fits = len(digits) == q["sig"] if "," in shown else len(digits.rstrip("0")) <= q["sig"] <= len(digits)
        assert "." not in shown and fits, (shown, q["sig"], q["answer"])
    assert not trouble, trouble
    ctx.close()
