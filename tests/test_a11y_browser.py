"""WCAG 2.1 A and AA on the built course, in Debian's chromium, with axe-core (the axe.min.js that
axe-playwright-python bundles; nothing is fetched), and the course with the keyboard alone.

The axe test walks every page in the built site's navigation (so a new chapter or tool is covered the day it is
added), English and Dutch, each at 1280 and at 390 px, then the exam in each of its states (signed out, link sent,
signed in, in the exam, finished with its review, certificates listed) and the verify page holding a certificate:
no serious or critical violation anywhere; moderate and minor ones are printed.

English is measured in material's light scheme, Dutch in its dark one (the browser's prefers-color-scheme; the
colours come from the same stylesheets in both languages), so each page is seen in both schemes. Cost: one chromium, one tab per
language; each page is loaded once and measured at both widths (the viewport is resized in place); color-contrast
runs on one element per distinct style, each style once in the walk (`SAMPLE_JS`); a Dutch page, the English templates translated, gets the rules
other than contrast at the phone width only (each rule once per language and width pair: ~60 s less).
"""
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from classroom_support import answer_key, free_port, make_config, served
from minimega.classroom import trust
from minimega.classroom.keys import Keyring

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api")
axe_module = pytest.importorskip("axe_playwright_python.sync_playwright")
pytest.importorskip("uvicorn")

TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
BLOCKING = ("serious", "critical")
WIDTHS = (1280, 390)
AXE_JS = axe_module.Axe().axe_script
EXPECT_S = 20                          # expect()'s wait: pages settle slowly on a loaded two-core machine


@pytest.fixture(autouse=True)
def patient_expect():
    sync_api.expect.set_options(timeout=EXPECT_S * 1000)
    yield
    sync_api.expect.set_options(timeout=5000)           # Playwright's default, for the other files' tests
# color-contrast is most of axe's time: it finds each text element's background from the elements under it, and
# a chapter has ~1,000 text elements outside its ~4,000 highlighted-code and KaTeX spans. Its verdict depends on
# the text's colour, on whether the text is large (axe's rule: 18 pt, or 14 pt and bold; 4.5:1 below, 3:1 above),
# on its shadow (measured in ems: a shadow keeps the size in the key) and on the colours behind it, so it runs on
# one element of each distinct (colour, large, shadow, the backgrounds up to the first opaque one): 30-60 per page,
# and each once in the whole walk: a style measured on an earlier view (most of a page's: the pages share their
# templates) is not measured again. An element on a background image or gradient is its own sample on every view.
SAMPLE_JS = """known => {
  known = new Set(known);
  const memo = new Map();
  const behind = el => {                     // the backgrounds from el up to the first opaque one
    if (!el) return 'page';
    if (memo.has(el)) return memo.get(el);
    const s = getComputedStyle(el), c = s.backgroundColor;
    let key;
    if (s.backgroundImage !== 'none') key = 'image' + memo.size;               // its own sample
    else if (c !== 'rgba(0, 0, 0, 0)' && c !== 'transparent' && !c.startsWith('rgba') && s.opacity === '1') key = c;
    else key = c + '@' + s.opacity + '>' + behind(el.parentElement);
    memo.set(el, key);
    return key;
  };
  const seen = new Set(), fresh = [];
  document.querySelectorAll('[data-mm-contrast]').forEach(e => e.removeAttribute('data-mm-contrast'));
  document.querySelectorAll('body *').forEach(e => {
    if (![...e.childNodes].some(c => c.nodeType === 3 && c.textContent.trim())) return;
    const s = getComputedStyle(e);
    const pt = Math.ceil(parseFloat(s.fontSize) * 72) / 96;                  // axe's points, rounded as axe does
    const large = pt >= 18 || (pt >= 14 && parseFloat(s.fontWeight) >= 700);
    const shadow = s.textShadow === 'none' ? '' : s.textShadow + '@' + s.fontSize;
    const key = [s.color, large, shadow, behind(e)].join('|');
    if (seen.has(key)) return;
    seen.add(key);
    if (known.has(key)) return;                                               // measured on an earlier view
    e.setAttribute('data-mm-contrast', '');
    fresh.push(key);
  });
  return {styles: seen.size, fresh};
}"""
# no colour is read mid-transition (a hovered button fading to its hover colour)
STILL_CSS = "*, *::before, *::after { transition: none !important; animation: none !important; }"


def _axe(page, known: set, rules: bool = True) -> list[dict]:
    """One axe run: every WCAG A/AA rule on the whole page (``rules``; else color-contrast alone), color-contrast
    on the samples only (its selector narrowed to them with `axe.configure`, once per page load): one element of
    each style not in ``known``, the styles measured on earlier views, which this run adds to."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.evaluate(AXE_JS)
        page.evaluate("() => axe.configure({rules: [{id: 'color-contrast', selector: '[data-mm-contrast]'}]})")
        page.add_style_tag(content=STILL_CSS)
    page.evaluate("() => window.mmA11yScan && window.mmA11yScan()")     # the scrolling boxes for this width
    # A transition caught halfway (the phone drawer's titles fading) reads as a contrast failure of a colour no
    # one ever sees at rest: every running animation and transition is finished before the scan.
    page.evaluate("() => document.getAnimations().forEach(a => { try { a.finish(); } catch (e) {} })")
    styles = page.evaluate(SAMPLE_JS, sorted(known))
    assert styles["styles"] > 0, page.url
    if not rules and not styles["fresh"]:
        return []                                   # every style on this view was measured on an earlier one
    only = {"type": "tag", "values": TAGS} if rules else {"type": "rule", "values": ["color-contrast"]}
    found = page.evaluate("o => axe.run(document, o).then(r => r.violations)",
                          {"runOnly": only, "resultTypes": ["violations"], "iframes": False})
    known.update(k for k in styles["fresh"] if "image" not in k)     # an image's key is unique to its page
    return found


class Report:
    """Each view's violations: blocking (serious, critical) fail the test; the rest are printed."""

    def __init__(self):
        self.blocking, self.other, self.views = [], [], 0
        self.styles: set = set()                  # the text styles color-contrast has measured (`SAMPLE_JS`)

    def check(self, page, view: str, rules: bool = True):
        self.views += 1
        t = time.monotonic()
        found = _axe(page, self.styles, rules)
        if os.environ.get("MM_A11Y_VERBOSE"):
            print(f"{time.monotonic() - t:5.1f} s  {view}: {sorted(v['id'] for v in found)}", flush=True)
        for v in found:
            lines = [f"{view}: {v['id']} ({v['impact']}, {len(v['nodes'])}): {v['help']}"] + [
                f"    {n['target']} {(n.get('failureSummary') or '').splitlines()[-1:]}" for n in v["nodes"][:3]]
            (self.blocking if v["impact"] in BLOCKING else self.other).append("\n".join(lines))


def _settle(page):
    page.wait_for_load_state("load")
    page.wait_for_function("() => !document.querySelector('.mm-quiz:not([data-ready]), .mm-anim:not([data-ready])')")


def _both_widths(page, report, view, first, rules_at=WIDTHS):
    """Measures the loaded page at `first` width, then at the other; returns the width it was left at. Contrast is
    measured at both; the other rules at the widths in ``rules_at``."""
    widths = WIDTHS if first == WIDTHS[0] else WIDTHS[::-1]
    for k, w in enumerate(widths):
        if k:
            page.set_viewport_size({"width": w, "height": 800})
        report.check(page, f"{view} @{w}", rules=w in rules_at)
    return widths[-1]


@pytest.fixture(scope="module")
def course(tmp_path_factory, site_build):
    """The session's built site (`site_support.site_build`) copied, pinned to this service's issuer (what a build
    with $MINIMEGA_TRUSTED_ISSUERS set writes: `trust.write_site_files`) and served by the exam service, so the
    exam and the verify pages work at the same origin as the chapters."""
    from minimega.classroom.service import create_app

    tmp = tmp_path_factory.mktemp("a11y")
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


def _nav(page, base: str) -> list[str]:
    hrefs = page.eval_on_selector_all("nav.md-nav--primary a.md-nav__link[href]", "els => els.map(e => e.href)")
    out = []
    for h in hrefs:
        h = h.split("#")[0]
        if h.startswith(base) and h not in out:
            out.append(h)
    return out


def _answer(page, n: int, response: dict):
    if "value" in response:
        page.fill(f"#q{n}-value", repr(response["value"]))
    else:
        for i in ([response["choice"]] if "choice" in response else response["choices"]):
            page.check(f"#q{n}-c{i}")
    page.locator(f"#q{n} .mm-exam-save").click()
    sync_api.expect(page.locator(f"#fb{n}")).not_to_be_empty()


def _exam_states(page, app, base, lang, report, width):
    """The exam page in each state, and the verify page with the certificate it issued."""
    expect = sync_api.expect
    prefix = "" if lang == "en" else "/nl"
    page.goto(f"{base}{prefix}/exam/")
    width = _both_widths(page, report, f"{lang} exam signed out", width)
    page.fill("#mm-exam-email", f"a11y-{lang}@example.org")
    page.locator("#mm-exam-send").click()
    expect(page.locator("#mm-exam-dev-link")).to_be_visible()
    width = _both_widths(page, report, f"{lang} exam link sent", width)
    page.goto(page.locator("#mm-exam-dev-link").get_attribute("href"))
    expect(page.locator("#mm-exam-start")).to_be_visible()
    width = _both_widths(page, report, f"{lang} exam signed in", width)
    page.fill("#mm-exam-name", "Ada Lovelace")
    page.locator("#mm-exam-begin").click()
    expect(page.locator("fieldset.mm-exam-q").first).to_be_visible()
    aid = app.state.store.conn().execute("SELECT id FROM attempts ORDER BY rowid DESC LIMIT 1").fetchone()[0]
    key = answer_key(app.state.store, aid)
    _answer(page, 1, key[1][0])
    width = _both_widths(page, report, f"{lang} exam in progress", width)
    for n in sorted(key)[1:]:
        _answer(page, n, key[n][0] if n != 2 else key[n][1])         # one wrong: the review shows both kinds
    page.locator("#mm-exam-finish").click()
    expect(page.locator("#mm-exam-review h2")).to_be_visible()
    width = _both_widths(page, report, f"{lang} exam finished, review", width)
    page.reload()
    expect(page.locator("#mm-exam-mine li")).to_have_count(1)
    width = _both_widths(page, report, f"{lang} exam certificates", width)
    page.goto(base + page.locator("#mm-exam-mine a[href*='/verify/?c=']").get_attribute("href"))
    expect(page.locator("#mm-verify-verdict")).to_have_attribute("data-valid", "true")
    return _both_widths(page, report, f"{lang} verify with a certificate", width)


@pytest.mark.timeout(1500)             # ~120 page views; see the module docstring for what it costs
def test_every_page_and_exam_state_has_no_serious_violation(course, chromium):
    base, app = course
    t0 = time.monotonic()
    report, trouble = Report(), []
    # English: every rule at both widths. Dutch (the same templates, translated): contrast at both widths in the
    # dark scheme, the other rules (names, labels, lang) at the phone width, where the drawer holds the navigation.
    for lang, home, scheme, rules_at in (("en", "/", "light", WIDTHS), ("nl", "/nl/", "dark", (390,))):
        ctx = chromium.new_context(viewport={"width": WIDTHS[0], "height": 800}, locale=lang, color_scheme=scheme)
        page = ctx.new_page()
        page.on("pageerror", lambda e: trouble.append(str(e)))
        page.goto(base + home)
        pages = _nav(page, base)
        assert len(pages) >= 20, pages
        assert all(p.startswith(base + home) for p in pages), pages
        width = WIDTHS[0]
        for url in pages:
            if url.rstrip("/").endswith(("/exam", "/verify")):
                continue                            # below, in their states
            if page.url != url:
                page.goto(url)
            _settle(page)
            width = _both_widths(page, report, f"{lang} {url[len(base):]}", width, rules_at)
        _exam_states(page, app, base, lang, report, width)
        ctx.close()
    took = time.monotonic() - t0
    print(f"\naxe-core (WCAG 2.1 A/AA) on {report.views} page views in {took:.1f} s; "
          f"{len(report.other)} moderate or minor:", *report.other, sep="\n")
    assert not trouble, trouble
    assert report.views >= 4 * 20 + 4 * 7, report.views
    assert not report.blocking, "\n".join(report.blocking)


# --- the keyboard alone -------------------------------------------------------------------------------------

# Where the focus is, and whether it shows: an outline or a ring on the element (or, for an input drawn by its
# label, on the label), and the element or that label on screen.
FOCUS_JS = """() => {
  let e = document.activeElement;
  while (e && e.tagName === 'IFRAME' && e.contentDocument && e.contentDocument.activeElement)
    e = e.contentDocument.activeElement;                 // a figure's page: where the focus is inside it
  if (!e || e === e.ownerDocument.body) return null;
  const shown = x => { const s = x.ownerDocument.defaultView.getComputedStyle(x);
    return (s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) > 0) || s.boxShadow !== 'none'; };
  const big = x => { const r = x.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  // an input drawn by a label: its own, or (material's palette toggle) the label right after it
  const labels = [...(e.labels || [])];
  if (e.nextElementSibling && e.nextElementSibling.tagName === 'LABEL') labels.push(e.nextElementSibling);
  const visible = (shown(e) && big(e)) || labels.some(l => shown(l) && big(l));
  return {id: e.id, tag: e.tagName, cls: String(e.className), text: (e.textContent || '').trim().slice(0, 40),
          visible: !!visible};
}"""


class Keys:
    """Drives a page with the keyboard alone, checking at every stop that the focus can be seen."""

    def __init__(self, page):
        self.page, self.hidden, self.presses = page, [], 0

    def press(self, key: str):
        self.page.keyboard.press(key)
        self.presses += 1
        where = self.page.evaluate(FOCUS_JS)
        if where and not where["visible"]:
            # read again once the page has painted: a key that changes the page (Enter on a form) can be read
            # while the page's script is still re-rendering it on a loaded machine; a ring missing from the painted
            # page is what fails
            self.page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
            where = self.page.evaluate(FOCUS_JS)
            if where and not where["visible"]:
                self.hidden.append(where)
        return where

    def follow(self):
        """Enter on the focused link, which loads another page."""
        with self.page.expect_navigation():
            self.page.keyboard.press("Enter")
        self.presses += 1

    def tab_to(self, selector: str, limit: int = 120):
        """Tab until the focused element matches `selector`."""
        for _ in range(limit):
            self.press("Tab")
            if self.page.evaluate("s => !!document.activeElement && document.activeElement.matches(s)", selector):
                return
        raise AssertionError(f"{limit} presses of Tab never reached {selector!r} on {self.page.url}")

    def arrow_to(self, element_id: str, limit: int = 12):
        """In a radio group: arrow down until `element_id` has the focus (and so is checked)."""
        for _ in range(limit):
            if self.page.evaluate("() => document.activeElement.id") == element_id:
                if not self.page.evaluate("() => document.activeElement.checked"):
                    self.press("Space")                  # Tab lands on a group's first radio without checking it
                return
            self.press("ArrowDown")
        raise AssertionError(f"arrow keys never reached #{element_id}")


@pytest.mark.timeout(600)
def test_keyboard_alone_quiz_animation_exam_and_certificate(course, chromium):
    base, app = course
    expect = sync_api.expect
    ctx = chromium.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    keys = Keys(page)
    trouble = []
    page.on("pageerror", lambda e: trouble.append(str(e)))

    page.goto(f"{base}/03-zero/")                               # a step-through: focus it, step it with the arrows
    _settle(page)
    anim = page.locator(".mm-anim").first
    keys.tab_to(".mm-anim", limit=300)
    expect(anim).to_have_attribute("data-frame", "0")
    keys.press("ArrowRight")
    keys.press("ArrowRight")
    expect(anim).to_have_attribute("data-frame", "2")
    keys.press("End")
    last = len(json.loads(anim.get_attribute("data-frames"))["frames"]) - 1
    expect(anim).to_have_attribute("data-frame", str(last))
    keys.tab_to(".mm-anim button[aria-label='First frame']")      # its own buttons work from the keyboard too
    keys.press("Enter")
    expect(anim).to_have_attribute("data-frame", "0")

    item = "#q-03-zero-faq-zero-stage-saves-most"                 # a practice question: bank option 0 is its key
    keys.tab_to(f"{item} input")
    keys.arrow_to("q-03-zero-faq-zero-stage-saves-most-0")
    keys.tab_to(f"{item} .mm-check")
    keys.press("Enter")
    expect(page.locator(f"{item} .mm-feedback")).to_contain_text("Correct.")

    page.goto(f"{base}/exam/")                                 # the exam: sign in, sit it, finish, verify
    keys.tab_to("#mm-exam-email")
    page.keyboard.type("keys@example.org")
    keys.press("Enter")
    expect(page.locator("#mm-exam-dev-link")).to_be_visible()
    keys.tab_to("#mm-exam-dev-link")
    keys.follow()
    keys.tab_to("#mm-exam-name")
    page.keyboard.type("Grace Hopper")
    keys.press("Enter")
    expect(page.locator("fieldset.mm-exam-q").first).to_be_visible()
    aid = app.state.store.conn().execute("SELECT id FROM attempts ORDER BY rowid DESC LIMIT 1").fetchone()[0]
    key = answer_key(app.state.store, aid)
    for n, (right, _) in sorted(key.items()):
        if "value" in right:
            keys.tab_to(f"#q{n}-value")
            page.keyboard.type(repr(right["value"]))
        elif "choice" in right:
            keys.tab_to(f"#q{n} input")
            keys.arrow_to(f"q{n}-c{right['choice']}")
        else:
            for i in right["choices"]:
                keys.tab_to(f"#q{n}-c{i}")
                keys.press("Space")
        keys.tab_to(f"#q{n} .mm-exam-save")
        keys.press("Enter")
        expect(page.locator(f"#fb{n}")).not_to_be_empty()
    keys.tab_to("#mm-exam-finish", limit=400)
    keys.press("Enter")
    expect(page.locator("#mm-exam-score")).to_contain_text(f"{len(key)} of {len(key)}")
    keys.tab_to("#mm-exam-verify", limit=400)
    keys.follow()
    expect(page.locator("#mm-verify-verdict")).to_have_attribute("data-valid", "true")
    expect(page.locator("#mm-verify-claims")).to_contain_text("Grace Hopper")
    ctx.close()
    print(f"\nkeyboard only: {keys.presses} key presses")
    assert not keys.hidden, f"focus not visible at: {keys.hidden[:10]}"
    assert not trouble, trouble
