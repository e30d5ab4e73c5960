"""The course's theme without mkdocs-material's script bundle (overrides/main.html, theme.js, search.js), and what
the build now does in its place: formulas typeset by KaTeX when the site is built (tools/math_hook.py), tables in
their scrolling box, each chapter's quiz progress line written under its title. Then, in chromium: the colour
scheme's toggle and its memory, the code blocks' copy button, search from the keyboard, and a chapter that does not
move once it is shown (layout shift at a phone's width).
"""
import re

import pytest

pytestmark = pytest.mark.browser

BUNDLE = re.compile(r'<script src="[^"]*assets/javascripts/bundle\.[0-9a-f]+\.min\.js"')
RAW_FORMULA = re.compile(r'class="arithmatex">\\[(\[]')


def _pages(site):
    return sorted(p for p in site.rglob("*.html") if "assets" not in p.parts)


def test_pages_load_the_course_scripts_not_materials_bundle(site_build):
    pages = _pages(site_build.out)
    assert len(pages) > 40
    for page in pages:
        text = page.read_text(encoding="utf-8")
        if "__config" not in text:                      # redirects, figure pages: not theme pages
            continue
        assert not BUNDLE.search(text), page
        ours = [s for s in re.findall(r'<script src="([^"]+)"', text) if "assets/javascripts/" in s]
        assert ours and ours[0].endswith("javascripts/theme.js"), (page, ours[:3])   # first: it defines document$
        assert 'classList.replace("no-js", "js")' in text


def test_formulas_are_typeset_when_the_site_is_built(site_build):
    site = site_build.out
    typeset = 0
    for page in _pages(site):
        text = page.read_text(encoding="utf-8")
        assert not RAW_FORMULA.search(text), f"{page}: a formula left for the browser"
        typeset += text.count('class="arithmatex" data-typeset="1"><span class="katex')
    assert typeset > 500
    ch3 = (site / "03-zero" / "index.html").read_text(encoding="utf-8")
    assert '<annotation encoding="application/x-tex">N_d</annotation>' in ch3      # the MathML screen readers read
    ch2 = (site / "02-data-parallel" / "index.html").read_text(encoding="utf-8")
    assert re.search(r'<div class="arithmatex" data-typeset="1"><span class="katex-display">', ch2)   # display math


def test_tables_sit_in_their_scrolling_box_and_the_progress_line_is_written(site_build):
    ch3 = (site_build.out / "03-zero" / "index.html").read_text(encoding="utf-8")
    tables = re.findall(r"(.{80})<table>", ch3, re.S)
    assert tables and all(t.endswith('<div class="md-typeset__table">') for t in tables), tables
    assert re.search(r'</h1>\s*<p class="mm-chapter-progress mm-progress-summary">Your quiz progress in this chapter: '
                     r'0 of 9 right \(0 tried\)\. <a href="#quiz">Go to the quiz</a></p>', ch3)
    nl = (site_build.out / "nl" / "03-zero" / "index.html").read_text(encoding="utf-8")
    assert "Je quizvoortgang in dit hoofdstuk: 0 van 9 goed (0 geprobeerd). " in nl


def _context(chromium, **kw):
    ctx = chromium.new_context(**{"viewport": {"width": 1280, "height": 900}, **kw})
    page = ctx.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    return ctx, page, errors


def test_the_colour_scheme_follows_the_system_then_the_readers_choice(site_server, chromium):
    ctx, page, errors = _context(chromium, color_scheme="dark")
    page.goto(f"{site_server}/03-zero/")
    scheme = "document.body.getAttribute('data-md-color-scheme')"
    assert page.evaluate(scheme) == "slate"                                 # the system's dark setting
    toggle = page.locator("form[data-md-component=palette] label:not([hidden])")
    assert toggle.count() == 1 and toggle.get_attribute("title") == "Switch to light mode"
    toggle.click()
    assert page.evaluate(scheme) == "default"
    assert page.locator("form[data-md-component=palette] label:not([hidden])").get_attribute("title") == "Switch to dark mode"
    page.goto(f"{site_server}/nl/01-memory/")                               # remembered across pages and languages
    assert page.evaluate(scheme) == "default"
    assert errors == [], errors
    ctx.close()


def test_the_copy_button_copies_the_code(site_server, chromium):
    ctx, page, errors = _context(chromium, permissions=["clipboard-read", "clipboard-write"])
    page.goto(f"{site_server}/03-zero/")
    block = page.locator("div.highlight").filter(has=page.locator("button.md-clipboard")).first
    button = block.locator("button.md-clipboard")
    assert button.get_attribute("aria-label") == "Copy to clipboard"
    block.scroll_into_view_if_needed()
    button.click()
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied.strip() and copied.strip() == block.locator("code").inner_text().strip()
    page.locator(".md-dialog--active", has_text="Copied to clipboard").wait_for()
    assert errors == [], errors
    ctx.close()


def test_search_from_the_keyboard(site_server, chromium):
    ctx, page, errors = _context(chromium)
    page.goto(f"{site_server}/03-zero/")
    page.locator("article").click(position={"x": 5, "y": 5})
    page.keyboard.press("/")                                                # opens search, the box takes the focus
    assert page.evaluate("document.activeElement.classList.contains('md-search__input')")
    assert page.locator("#__search").is_checked()
    page.keyboard.type("pipeline bubble", delay=10)
    page.wait_for_selector(".md-search-result__item")
    assert re.match(r"\d+ matching documents", page.locator(".md-search-result__meta").inner_text())
    first = page.locator(".md-search-result__item a").first
    assert "pipeline" in first.inner_text().lower()
    page.keyboard.press("ArrowDown")
    assert page.evaluate("document.activeElement === document.querySelector('.md-search-result__item a')")
    page.keyboard.press("Escape")
    assert not page.locator("#__search").is_checked()
    page.keyboard.press("/")
    page.keyboard.press("Enter")                                            # Enter follows the first result
    page.wait_for_url(re.compile(r".*/\d\d-[a-z-]+/(#.*)?$"))
    assert errors == [], errors
    ctx.close()


LAYOUT_SHIFT = """window.__shift = 0; new PerformanceObserver(list => {
  for (const e of list.getEntries()) if (!e.hadRecentInput) window.__shift += e.value;
}).observe({type: "layout-shift", buffered: true});"""


@pytest.mark.parametrize("slug", ["03-zero/", "nl/08-pipeline-parallel/", "calculator/"])
def test_a_page_does_not_move_once_it_is_shown(site_server, chromium, slug):
    ctx, page, errors = _context(chromium, viewport={"width": 412, "height": 823}, is_mobile=True)
    page.add_init_script(LAYOUT_SHIFT)
    # a phone's CPU (Lighthouse's 4x slowdown): the page is shown before its scripts have run, as on a phone
    ctx.new_cdp_session(page).send("Emulation.setCPUThrottlingRate", {"rate": 4})
    page.goto(f"{site_server}/{slug}", wait_until="load")
    page.wait_for_timeout(1500)
    shift = page.evaluate("window.__shift")
    # Lighthouse calls below 0.1 good. Measured: 0.000-0.002 here; 0.119 (chapter 3) and 0.380 (Dutch chapter 8)
    # with the formulas typeset in the browser, 0.138 (Dutch chapter 8) without KaTeX's fonts preloaded
    assert shift < 0.1, f"{slug}: layout shift {shift:.3f}"
    assert errors == [], errors
    ctx.close()


def test_the_table_of_contents_marks_the_section_being_read(site_server, chromium):
    ctx, page, errors = _context(chromium)
    page.goto(f"{site_server}/03-zero/")
    active = ".md-sidebar--secondary a.md-nav__link--active"
    for section in ("takeaway", "quiz", "why"):
        page.evaluate("id => document.getElementById(id).scrollIntoView()", section)
        page.wait_for_function("([sel, id]) => document.querySelector(sel)?.hash === '#' + id", arg=[active, section])
        assert page.locator(active).count() == 1
    assert errors == [], errors
    ctx.close()


def test_the_open_tab_is_underlined_not_only_darker(site_server, chromium):
    ctx, page, errors = _context(chromium)
    page.goto(f"{site_server}/03-zero/")
    tabs = page.locator(".tabbed-set").first
    borders = lambda: tabs.locator(".tabbed-labels > label").evaluate_all(    # noqa: E731
        "ls => ls.map(l => getComputedStyle(l).borderBottomColor)")
    first = borders()
    assert first[0] not in ("rgba(0, 0, 0, 0)", "transparent") and set(first[1:]) == {"rgba(0, 0, 0, 0)"}, first
    tabs.locator(".tabbed-labels > label").nth(1).click()
    second = borders()
    assert second[1] == first[0] and second[0] == "rgba(0, 0, 0, 0)", second
    assert errors == [], errors
    ctx.close()


def test_search_keeps_results_on_the_site_and_shows_their_text_as_text(site_server, chromium):
    """The index is read as data: a location off the site is dropped, markup in a title or text is shown as text."""
    import json
    ctx, page, errors = _context(chromium)
    docs = [{"location": "javascript:alert(1)", "title": "zebra trap", "text": "zebra"},
            {"location": "https://elsewhere.example/", "title": "zebra away", "text": "zebra"},
            {"location": "03-zero/", "title": "zebra <img src=x onerror=alert(2)>", "text": "<b>zebra</b> here"}]
    page.route("**/search/search_index.json", lambda route: route.fulfill(
        content_type="application/json", body=json.dumps({"config": {}, "docs": docs})))
    page.goto(f"{site_server}/03-zero/")
    page.locator(".md-search__input").click()
    page.keyboard.type("zebra", delay=10)
    page.wait_for_selector(".md-search-result__item")
    hrefs = page.eval_on_selector_all(".md-search-result__item a", "els => els.map(e => e.href)")
    assert hrefs == [f"{site_server}/03-zero/"], hrefs
    assert page.locator(".md-search-result__item img, .md-search-result__item b").count() == 0
    assert "zebra here" in page.locator(".md-search-result__item").inner_text()
    assert errors == [], errors
    ctx.close()
