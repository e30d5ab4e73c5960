"""The Dutch edition of the course site (/nl/, mkdocs-static-i18n): twins, hooks, build, search.

Every course page has a Dutch twin (``NN-slug.nl.md``) with the English page's structure
(tests/twins.py); on a Dutch page the hooks render the Dutch quiz bank, Dutch quiz controls and
decimal commas; the strict build holds both editions (the session's one build, tests/site_support.py);
its search index holds the Dutch text. Browser checks (marker `browser`) switch languages, take the
Dutch exam against a stubbed API, and take screenshots at 1280 and 390 px.
"""
import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import unquote, urlsplit

import pytest

import twins
from minimega.classroom import sitebuild
from minimega.classroom.quiz import load_bank

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "course"
STATIC = ROOT / "src" / "minimega" / "classroom" / "static"
CONFIG = {"config_file_path": str(ROOT / "mkdocs.yml"), "docs_dir": "course"}
CHAPTERS = sorted(p for p in (ROOT / "quizzes").glob("*.yaml"))    # one practice bank per chapter
PAGES = sorted(p for p in COURSE.rglob("*.md") if "assets" not in p.relative_to(COURSE).parts
               and not p.name.endswith(".nl.md"))


def twin_of(page: Path) -> Path:
    return page.with_name(page.name[:-3] + ".nl.md")


def url_of(page: Path) -> str:
    """The English page's URL below the site root: ``03-zero/``, ``exam/``, ``""`` for the home page."""
    rel = page.relative_to(COURSE).with_suffix("")
    return "" if rel.name == "index" and rel.parent == Path(".") else \
        (f"{rel.parent}/" if rel.name == "index" else f"{rel}/")


def dutch_title_of_chapter_3() -> str:
    """The exam page's Dutch title for chapter 3: its twin's H1, else its Dutch bank's title."""
    twin = COURSE / "03-zero.nl.md"
    if twin.is_file():
        return re.search(r"^#\s+3\.\s+(.+?)\s*(\{.*\})?\s*$", twin.read_text(encoding="utf-8"), re.M).group(1)
    return load_bank(ROOT / "quizzes" / "03-zero.yaml", "nl").title


# ---------------------------------------------------------------------------------------------
# Twins: every page has one, with the English page's structure

@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(COURSE)))
def test_every_page_has_a_dutch_twin_with_the_english_structure(page):
    twin = twin_of(page)
    assert twin.is_file(), f"{page.relative_to(ROOT)} has no Dutch twin: write {twin.relative_to(ROOT)}"
    diff = twins.differences(twins.structure(page.read_text(encoding="utf-8")),
                             twins.structure(twin.read_text(encoding="utf-8")))
    assert not diff, f"{twin.relative_to(ROOT)} differs from {page.name}:\n  " + "\n  ".join(diff)


def test_no_dutch_twin_without_an_english_page():
    orphans = [p for p in COURSE.rglob("*.nl.md") if not p.with_name(p.name[:-6] + ".md").is_file()]
    assert not orphans, f"Dutch pages without an English page: {orphans}"


def test_twin_check_names_each_change():
    en = twins.structure(
        '---\ntitle: A\n---\n# Title { #top }\n\n## Why\n\nSee [the lab](labs/01-memory.ipynb), '
        '{{ num("model_state_bytes(1, 1, 0)", ".0f") }} bytes.\n\n'
        '{{ figure("zero-breakdown", "Bytes per GPU") }}\n\n```python\n--8<-- "src/minimega/estimate.py:x"\n```\n')
    good = twins.structure(
        '---\ntitle: B\n---\n# Titel { #top }\n\n## Waarom { #why }\n\nZie [het lab](labs/01-memory.ipynb), '
        '{{ num("model_state_bytes(1, 1, 0)", ".0f") }} bytes.\n\n'
        '{{ figure("zero-breakdown", "Bytes per GPU, in het Nederlands") }}\n\n'
        '```python\n--8<-- "src/minimega/estimate.py:x"\n```\n')
    assert en.headings == [(1, "top"), (2, "why")] and twins.differences(en, good) == []
    bad = twins.structure(
        '# Titel { #top }\n\n## Waarom\n\n### Extra { #extra }\n\nZie [het lab](labs/02-data-parallel.ipynb), '
        '{{ num("model_state_bytes(1, 1, 1)", ".0f") }} bytes.\n\n'
        '{{ figure("comm-vs-dp", "Bytes") }}\n\n```python\n--8<-- "src/minimega/estimate.py:y"\n```\n')
    found = "\n".join(twins.differences(en, bad))
    for expected in ("macro calls differ", 'num("model_state_bytes(1, 1, 1)"', 'figure("comm-vs-dp", …)',
                     "snippet include lines differ", "code blocks differ", "headings per level differ",
                     "heading ids differ", "'why'", "'waarom'", "link targets differ", "labs/02-data-parallel.ipynb"):
        assert expected in found, (expected, found)


# ---------------------------------------------------------------------------------------------
# Hooks on a Dutch page

def _page(src_path: str, url: str, locale: str | None):
    file = SimpleNamespace(src_path=src_path, **({"locale": locale} if locale else {}))
    return SimpleNamespace(url=url, file=file)


def _run(markdown: str, page) -> str:
    return sitebuild.on_page_markdown(markdown, page, CONFIG, None)


def test_num_writes_a_decimal_comma_on_a_dutch_page():
    nl, en = _page("03-zero.nl.md", "nl/03-zero/", "nl"), _page("03-zero.md", "03-zero/", "en")
    call = '{{ num("model_state_bytes(7.5e9, 64, 2) / GB", ".1f") }} GB'
    assert _run(call, nl) == "16,6 GB" and _run(call, en) == "16.6 GB"
    big = '{{ num("model_state_bytes(7.5e9, 64, 0) / 1e6", ",.1f") }}'
    assert _run(big, nl) == "120\u2009000,0" and _run(big, en) == "120\u2009000.0"
    assert _run(call, _page("03-zero.md", "03-zero/", None)) == "16.6 GB"      # no i18n plugin: English


def test_quiz_on_a_dutch_page_renders_the_dutch_bank_in_dutch():
    en_bank = load_bank(ROOT / "quizzes" / "03-zero.yaml")
    nl_bank = load_bank(ROOT / "quizzes" / "03-zero.yaml", "nl")
    out = _run("{{ quiz() }}", _page("03-zero.nl.md", "nl/03-zero/", "nl"))
    assert out.count('class="mm-item"') == len(nl_bank.items) and 'lang="nl"' in out
    for en_item, nl_item in zip(en_bank.items, nl_bank.items):
        assert sitebuild.inline(nl_item.prompt) in out, nl_item.id
        assert sitebuild.inline(en_item.prompt) not in out, f"{en_item.id}: English question on the Dutch page"
    dutch = ("Controleer", "Vraag 1.", f"{len(nl_bank.items)} vragen.", "Deze quiz opnieuw beginnen", "Jouw antwoord")
    for word in dutch:
        assert word in out, word
    for word in (">Check<", "Question 1.", "Reset this quiz", "Your answer"):
        assert word not in out, word
    assert [sitebuild.page_stem(p) for p in ("03-zero.nl.md", "exam/index.nl.md", "zero-1.5b.md")] == \
        ["03-zero", "exam", "zero-1.5b"]
    english = _run("{{ quiz() }}", _page("03-zero.md", "03-zero/", "en"))   # also the stand-in under /nl/
    assert sitebuild.inline(en_bank.items[0].prompt) in english and 'lang="en"' in english


def test_figure_caption_and_links_come_from_the_dutch_page():
    out = _run('{{ figure("zero-breakdown", "Gestapelde GB per GPU") }}', _page("index.nl.md", "nl/", "nl"))
    assert 'src="../assets/figures/nl/zero-breakdown.html"' in out     # the Dutch figure page, from /nl/
    assert "<figcaption>Gestapelde GB per GPU</figcaption>" in out
    stand_in = _run('{{ figure("zero-breakdown", "Bytes per GPU") }}', _page("index.md", "nl/", "en"))
    assert 'src="../assets/figures/zero-breakdown.html"' in stand_in    # an English stand-in stays English


def test_exam_page_in_dutch_has_dutch_rules_titles_and_form():
    out = _run("{{ exam_page() }}", _page("exam/index.nl.md", "nl/exam/", "nl"))
    n = len(list((ROOT / "quizzes" / "exam").glob("[0-9][0-9]-*.yaml")))   # exam chapters (17 has practice only)
    assert html.unescape(out).count(f"{3 * n} vragen, 3 uit elk van de {n} hoofdstukken") == 1
    titles = json.loads(html.unescape(re.search(r'data-chapters="([^"]*)"', out).group(1)))
    assert titles["3"] == dutch_title_of_chapter_3() and len(titles) == len(CHAPTERS), titles
    english_words = _texts((STATIC / "exam-body.html").read_text(encoding="utf-8"))
    assert english_words, "exam-body.html has no words?"
    left = [w for w in english_words if w in _texts(out)]
    assert not left, f"English words on the Dutch exam page: {left}"


# ---------------------------------------------------------------------------------------------
# The build: both editions, strict, with Dutch search

class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs, self.text = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("href", "src", "data-src"):
            if a.get(key) and tag in ("a", "link", "script", "img", "iframe", "source"):
                self.refs.append(a[key])

    def handle_data(self, data):
        if data.strip():
            self.text.append(data.strip())


def _texts(markup: str) -> list[str]:
    p = _Refs()
    p.feed(markup)
    return [t for t in p.text if t not in ("{{rules}}",)]


@pytest.fixture(scope="module")
def built(site_build):
    return site_build.out


def test_every_page_is_built_in_dutch_under_nl(built):
    for page in PAGES:
        out = built / "nl" / url_of(page) / "index.html"
        assert out.is_file(), f"{page.name}: no {out.relative_to(built)}"
        text = out.read_text(encoding="utf-8")
        assert '<html lang="nl"' in text, out
        assert "Hoofdstukken" in text and "Geheugencalculator" in text, f"{out}: navigation not in Dutch"
        assert re.search(r'hreflang="en" class="md-select__link"', text), f"{out}: no language switcher"
    home = (built / "nl" / "index.html").read_text(encoding="utf-8")
    assert "Gestapelde GB per GPU aan parameters" in home and "minimega: hoe frontier-modellen" in home


def test_dutch_chapter_pages_carry_the_dutch_quiz_and_the_english_anchors(built):
    """Each chapter's /nl/ page is built from its twin: the Dutch bank's questions, the skeleton's ids.
    Fails for a chapter until its twin (NN-slug.nl.md) is merged, as the twin test does."""
    chapters = sorted(p for p in PAGES if re.match(r"\d\d-", p.name))
    problems = []
    for page in chapters:
        text = (built / "nl" / url_of(page) / "index.html").read_text(encoding="utf-8")
        bank = load_bank(ROOT / "quizzes" / f"{page.stem}.yaml", "nl")
        if 'class="mm-quiz" lang="nl"' not in text or sitebuild.inline(bank.items[0].prompt) not in text:
            problems.append(f"{page.stem}: /nl/{url_of(page)} has no Dutch quiz (is {twin_of(page).name} merged?)")
            continue
        english_ids = re.findall(r'<h2 id="([^"]+)"', (built / url_of(page) / "index.html").read_text(encoding="utf-8"))
        if re.findall(r'<h2 id="([^"]+)"', text) != english_ids:
            problems.append(f"{page.stem}: the Dutch h2 ids differ from the English {english_ids}")
    assert len(chapters) == len(CHAPTERS) and not problems, "\n".join(problems)


def test_dutch_pages_reach_figures_labs_and_assets(built):
    """Every local href/src on a /nl/ page resolves to a built file (figures, labs, scripts, the root's pins)."""
    checked, missing = 0, []
    for f in sorted((built / "nl").rglob("*.html")):
        p = _Refs()
        p.feed(f.read_text(encoding="utf-8"))
        for ref in p.refs:
            parts = urlsplit(ref)
            if parts.scheme or parts.netloc or not parts.path:
                continue
            target = (f.parent / unquote(parts.path)).resolve() if not parts.path.startswith("/") \
                else built / unquote(parts.path).lstrip("/")
            if target.is_dir():
                target = target / "index.html"
            checked += 1
            if not target.is_file():
                missing.append(f"{f.relative_to(built)} -> {ref}")
    assert checked > 500 and not missing, missing[:20]
    zero = (built / "nl" / "03-zero" / "index.html").read_text(encoding="utf-8")
    assert 'href="../../labs/03-zero.ipynb"' in zero and 'src="../../assets/figures/nl/zero-breakdown.html"' in zero


def test_dutch_chapters_embed_only_dutch_figures_and_every_figure_has_a_dutch_page(built):
    """A twin's iframes point at assets/figures/nl/; each figure's Dutch page is there, in lang="nl"."""
    from minimega.figures import plots
    embedded = set()
    for page in sorted(COURSE.glob("*.nl.md")):
        url = url_of(page.with_name(page.name.removesuffix(".nl.md") + ".md"))
        text = (built / "nl" / url / "index.html").read_text(encoding="utf-8")
        srcs = re.findall(r'<iframe data-src="([^"]+)"', text)
        english = [s for s in srcs if "/figures/nl/" not in s]
        assert not english, f"/nl/{url} embeds English figures {english}"
        embedded |= {s.rsplit("/", 1)[1].removesuffix(".html") for s in srcs}
    assert embedded and embedded <= set(plots.FIGURES)
    for name in plots.FIGURES:
        page = built / "assets" / "figures" / "nl" / f"{name}.html"
        assert page.is_file(), f"no Dutch page for figure {name}"
        head = page.read_text(encoding="utf-8")[:600]
        assert '<html lang="nl">' in head and 'src="../../vendor/plotly/plotly-basic.min.js"' in page.read_text(encoding="utf-8")


def test_dutch_search_index_holds_the_dutch_pages(built):
    """The Dutch edition searches its own index (tools/learner_hook.py splits the merged one per language)."""
    index = json.loads((built / "nl" / "search" / "search_index.json").read_text(encoding="utf-8"))
    assert set(index["config"]["lang"]) == {"en", "nl"}
    docs = index["docs"]
    dutch = [d["location"] for d in docs if "geheugencalculator" in (d["title"] + d["text"]).lower()]
    assert dutch and all(loc.startswith("nl/") for loc in dutch), dutch
    assert any(d["location"] == "nl/verify/" and "Een certificaat verifiëren" in d["title"] for d in docs)


# ---------------------------------------------------------------------------------------------
# In chromium: the language switcher, the Dutch exam against a stubbed API, screenshots


@pytest.fixture(scope="module")
def browser(chromium):
    return chromium                       # the session's one chromium (conftest.py)


def _context(browser, base, width=1280):
    ctx = browser.new_context(viewport={"width": width, "height": 900})
    page = ctx.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and not m.text.startswith("Failed to load resource")
            and errors.append(m.text))
    page.on("response", lambda r: r.status >= 400 and errors.append(f"HTTP {r.status} {r.url}"))
    return ctx, page, errors


def _switch(page, lang):
    """Open the header's language menu and pick `lang`, as a reader does."""
    page.locator(".md-header__option .md-select button").hover()
    page.locator(f"a.md-select__link[hreflang='{lang}']").click()


@pytest.mark.browser
def test_switcher_follows_the_page_and_its_section(site_build, browser):
    base = site_build.base
    ctx, page, errors = _context(browser, base)
    seen = []
    _stub_api(page, seen)
    page.goto(f"{base}/")
    page.locator("article a[href$='exam/']").first.click()
    page.wait_for_url(re.compile(re.escape(f"{base}/exam/") + r"(#.*)?$"))
    _switch(page, "nl")
    page.wait_for_url(re.compile(re.escape(f"{base}/nl/exam/") + r"(#.*)?$"))
    assert page.evaluate("document.documentElement.lang") == "nl"
    assert page.locator("h1").inner_text().rstrip("¶") == "Examen met certificaat"
    page.wait_for_selector("#mm-exam[data-booted='1']")
    assert [q for _, p, q in seen if p == "/exam"] == ["lang=en", "lang=nl"]    # the rules, in each language
    page.locator("article a[href$='verify/']").first.click()              # within the Dutch edition
    page.wait_for_url(re.compile(re.escape(f"{base}/nl/verify/") + r"(#.*)?$"))
    page.evaluate("location.hash = '#' + document.querySelector('article h2[id]').id")   # a section of the page
    hash_ = page.evaluate("location.hash")
    _switch(page, "en")                                                   # the switcher follows the page shown
    page.wait_for_url(re.compile(re.escape(f"{base}/verify/") + r"(#.*)?$"))
    assert page.evaluate("location.hash") == hash_, "the other language opens at the same section"
    assert page.evaluate("document.documentElement.lang") == "en"
    assert page.locator("h1").inner_text().rstrip("¶") == "Verify a certificate"
    assert errors == [], errors
    ctx.close()


@pytest.mark.browser
def test_dutch_search_finds_a_dutch_page(site_build, browser):
    base = site_build.base
    ctx, page, errors = _context(browser, base)
    page.goto(f"{base}/nl/")
    page.locator("label.md-search__icon, .md-search__input").first.click()
    page.locator("input.md-search__input").press_sequentially("geheugencalculator", delay=10)
    first = page.locator(".md-search-result__item a").first
    first.wait_for()
    assert "/nl/calculator/" in first.get_attribute("href")
    assert errors == [], errors
    ctx.close()


ATTEMPT = {"attempt_id": "a1", "display_name": "Ada", "total": 2, "pass_mark": 2, "expires_at": "2030-01-01T10:00:00Z",
           "questions": [{"number": 1, "chapter": 3, "chapter_title": "ZeRO", "type": "numeric", "unit": "GB",
                          "question": "Hoeveel GB per GPU onder stage 2?"},
                         {"number": 2, "chapter": 1, "chapter_title": "Geheugen", "type": "multiple",
                          "question": "Welke states?", "choices": ["Parameters", "Gradiënten"]}],
           "responses": {}}
REVIEW = {"score": 2, "total": 2, "items": [
    {"number": 1, "chapter": 3, "type": "numeric", "question": "Hoeveel GB?", "unit": "GB", "correct": True,
     "response": {"value": 16.6}, "answer": 16.6, "explain": "2 Psi + ..."},
    {"number": 2, "chapter": 1, "type": "multiple", "question": "Welke states?", "correct": True,
     "response": {"choices": [0, 1]}, "choices": ["Parameters", "Gradiënten"], "key": None, "explains": [],
     "explain": "Modeltoestanden schalen met het aantal parameters."}]}


def _stub_api(page, seen):
    """The exam service's answers, canned: enough for exam.js to show every part of the page."""
    def handle(route):
        req = route.request
        url = urlsplit(req.url)
        path = url.path.removeprefix("/api/v1")
        seen.append((req.method, path, req.post_data if req.method == "POST" else url.query))
        body = {("GET", "/exam"): {"rules": "Regels van de service."},
                ("GET", "/me"): {"open_attempt": None, "attempts_left_today": 3, "attempts_per_day": 3,
                                 "cooldown_until": None, "last_attempt": None},
                ("POST", "/attempts"): ATTEMPT,
                ("POST", "/attempts/a1/finish"): {"passed": True, "score": 2, "total": 2, "percent": 100,
                                                  "pass_mark": 2, "credential": {"code": "ABC123"}},
                ("GET", "/attempts/a1/review"): REVIEW}.get((req.method, path), {})
        route.fulfill(status=200, content_type="application/json", body=json.dumps(body))
    page.route("**/api/v1/**", handle)


# Every word exam.js writes on an English page; none may show on the Dutch one.
ENGLISH_EXAM_WORDS = ["attempts left today", "Question ", "Chapter ", "Your answer", "Choose all that apply",
                      "Save answer", "Recorded.", "answered;", "Passed", "were needed", "Verification code",
                      "Download the credential", "Printable certificate", "Verify it", "Review:", "Right.", "Wrong.",
                      "Sign in", "Start the exam", "Sign out", "Finish and see my score"]


@pytest.mark.browser
def test_a_dutch_user_takes_the_exam_in_dutch(site_build, browser, tmp_path):
    base = site_build.base
    ctx, page, errors = _context(browser, base)
    seen = []
    _stub_api(page, seen)
    page.add_init_script("localStorage.setItem('minimega.exam.session', 'stub')")
    page.goto(f"{base}/nl/exam/")
    page.wait_for_selector("#mm-exam[data-booted='1']")
    assert "Je hebt vandaag (UTC) nog 3 van 3 pogingen." in page.locator("#mm-exam-limits").inner_text()
    page.fill("#mm-exam-name", "Ada")
    page.click("#mm-exam-begin")
    page.wait_for_selector("#q1")
    start = next(json.loads(body) for method, path, body in seen if (method, path) == ("POST", "/attempts"))
    assert start["lang"] == "nl"
    assert page.locator("#q1 legend").inner_text() == "Vraag 1"
    page.fill("#q1-value", "16,6")                                      # a Dutch decimal comma
    page.locator("#q1 .mm-exam-save").click()
    page.wait_for_function("document.getElementById('fb1').textContent === 'Vastgelegd.'")
    assert page.input_value("#q1-value") == "16,6"                                 # shown back as written
    saved = next(json.loads(body) for method, path, body in seen if path == "/attempts/a1/answers/1")
    assert saved == {"value": 16.6}
    page.check("#q2-c0")
    page.check("#q2-c1")
    page.locator("#q2 .mm-exam-save").click()
    page.wait_for_function("document.getElementById('fb2').textContent === 'Vastgelegd.'")
    exam_text = page.locator("#mm-exam").inner_text()
    assert "Hoofdstuk 1: " in exam_text and "Kies alle juiste opties." in exam_text
    assert f"Hoofdstuk 3: {dutch_title_of_chapter_3()}" in exam_text     # the questions hide once it is finished
    assert "2 van 2 beantwoord" in exam_text
    page.click("#mm-exam-finish")
    page.wait_for_selector(".mm-exam-review-item")
    assert page.locator("#mm-exam-verify").get_attribute("href") == "/nl/verify/?c=ABC123"
    text = page.locator("#mm-exam").inner_text() + page.locator("#mm-exam-signin").inner_html()
    assert "Geslaagd" in text and "Nabespreking: 2 van 2" in text and "Goed. Modeltoestanden schalen met het aantal parameters." in text
    assert "Jouw antwoord: 16,6 GB" in text and "Antwoord: 16,6 GB" in text
    english = [w for w in ENGLISH_EXAM_WORDS if w in text]
    assert not english, f"English on the Dutch exam page: {english}"
    page.screenshot(path=str(tmp_path / "exam-nl.png"), full_page=True)
    assert errors == [], errors
    ctx.close()


@pytest.mark.browser
def test_dutch_verify_page_speaks_dutch_and_finds_its_pins(site_build, browser):
    base = site_build.base
    ctx, page, errors = _context(browser, base)
    page.goto(f"{base}/nl/verify/")
    page.wait_for_function("document.getElementById('mm-verify-pinned').textContent !== ''")
    assert page.locator("#mm-verify-pinned").inner_text().startswith("Deze site")
    page.fill("#mm-verify-text", '{"not": "a credential"}')
    page.click("#mm-verify-button")
    page.wait_for_selector("#mm-verify-verdict")
    box = page.locator("#mm-verify-result").inner_text()
    assert box.startswith("Niet geldig") and "Redenen:" in box and "✗ fout" in box
    assert "did not load" not in box, box                               # trusted-issuers and contexts found
    assert errors == [], errors
    ctx.close()


@pytest.mark.browser
def test_quiz_feedback_follows_the_quiz_language(site_build, browser):
    """quiz.js takes its words from the quiz box's lang (the bank's language, set by the hook). Until the
    chapter twins land, /nl/03-zero/ is the English stand-in, so the box is switched to Dutch here; with
    the twin it already is."""
    base = site_build.base
    ctx, page, errors = _context(browser, base)
    page.goto(f"{base}/nl/03-zero/")
    page.wait_for_selector(".mm-quiz[data-ready='1']")
    page.evaluate("document.querySelector('.mm-quiz').lang = 'nl'")
    page.check("#q-03-zero-faq-zero-stage-saves-most-0")                 # "Stage 3", the right option
    page.locator("#q-03-zero-faq-zero-stage-saves-most .mm-check").click()
    status = page.locator("#q-03-zero-faq-zero-stage-saves-most .mm-feedback")
    assert status.inner_text().startswith("Goed."), status.inner_text()
    page.fill("#q-03-zero-fig1-stage2-in", "16,6")                       # a Dutch decimal comma is read
    page.locator("#q-03-zero-fig1-stage2 .mm-check").click()
    assert page.locator("#q-03-zero-fig1-stage2 .mm-feedback").inner_text().startswith("Goed.")
    page.locator("#q-03-zero-fig1-stage1 .mm-check").click()
    empty = page.locator("#q-03-zero-fig1-stage1 .mm-feedback").inner_text()
    assert empty == "Vul eerst een getal in, bijvoorbeeld 12,5 GB."              # in the item's own unit
    assert page.locator(".mm-progress").inner_text() == "9 vragen. Goed beantwoord: 2 van 9 (2 geprobeerd)."
    assert errors == [], errors
    ctx.close()


@pytest.mark.browser
def test_dutch_calculator_answers_in_dutch(site_build, browser):
    from minimega import estimate as est
    base = site_build.base
    ctx, page, errors = _context(browser, base)
    page.goto(f"{base}/nl/calculator/")
    status = page.locator(".mm-calc-status")
    page.wait_for_function("document.querySelector('.mm-calc-status').textContent !== ''")
    py = est.memory_per_gpu(est.MemoryConfig(**est.PRESETS["zero-7.5b"]))
    expected = f"{py['total'] / 1e9:.1f}".replace(".", ",")
    assert status.inner_text().startswith(f"Totaal per GPU: {expected} GB (past niet in 80 GB)"), status.inner_text()
    rows = page.locator(".mm-calc-table tbody th").all_inner_texts()
    assert rows[:2] == ["parameters", "gradiënten"] and "totaal op de GPU" in rows
    page.wait_for_function("document.querySelector('.mm-perf-status').textContent !== ''")
    assert page.locator(".mm-perf-status").inner_text().startswith("Globale batch ")
    assert errors == [], errors
    ctx.close()


@pytest.mark.browser
@pytest.mark.parametrize("width", [1280, 390])
def test_screenshots_english_and_dutch(site_build, browser, tmp_path_factory, width):
    shots = tmp_path_factory.getbasetemp() / "screenshots-nl"
    shots.mkdir(exist_ok=True)
    base = site_build.base
    ctx, page, errors = _context(browser, base, width)
    _stub_api(page, [])                                                   # the exam page asks for its rules
    for path, name in (("03-zero/", "zero-en"), ("nl/", "home-nl"), ("nl/calculator/", "calculator-nl"),
                       ("nl/exam/", "exam-nl"), ("nl/verify/", "verify-nl")):
        page.goto(f"{base}/{path}")
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(shots / f"{name}-{width}.png"))
        # nothing wider than the screen: no sideways scrolling on a phone
        assert page.evaluate("document.documentElement.scrollWidth") <= width, (name, width)
    if width == 390:
        page.locator("label.md-header__button[for='__drawer']").click()   # the Dutch navigation drawer
        page.wait_for_timeout(400)
        page.screenshot(path=str(shots / f"drawer-nl-{width}.png"))
        assert "Hoofdstukken" in page.locator("nav.md-nav--primary").inner_text()
    else:
        _switch(page, "en")
        page.wait_for_url(re.compile(re.escape(f"{base}/verify/") + r"(#.*)?$"))
    assert errors == [], errors
    ctx.close()


def test_every_nav_title_has_a_dutch_translation():
    """A nav entry without a `nav_translations` line would show its English title on the Dutch site."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    block = text[text.index("nav_translations:"):text.index("\nhooks:")]
    translated = {line.split(":", 1)[0].strip() for line in block.splitlines()[1:] if ":" in line}
    nav = text[text.index("\nnav:"):]
    titles = re.findall(r"^\s*- ([^:\n]+):", nav, re.M)
    missing = [t for t in titles if t.strip() not in translated]
    assert not missing, f"add to nav_translations in mkdocs.yml: {missing}"
