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
PAGES = sorted(p for p in COURSE.rglob("*.md") if "assets" not in p.relative_to(COURSE).parts
               and not p.name.endswith(".nl.md"))


def twin_of(page: Path) -> Path:
    return page.with_name(page.name[:-3] + ".nl.md")


def url_of(page: Path) -> str:
    """The English page's URL below the site root: ``03-zero/``, ``exam/``, ``""`` for the home page."""
    rel = page.relative_to(COURSE).with_suffix("")
    return "" if rel.name == "index" and rel.parent == Path(".") else \
        (f"{rel.parent}/" if rel.name == "index" else f"{rel}/")


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
        '{{ figure("zero-breakdown", "Bytes per GPU, in het Nederlands") }}\n\n```python\n--8<-- "src/minimega/estimate.py:x"\n```\n')
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
    for word in ("Controleer", "Vraag 1.", f"{len(nl_bank.items)} vragen.", "Deze quiz opnieuw beginnen", "Jouw antwoord"):
        assert word in out, word
    for word in (">Check<", "Question 1.", "Reset this quiz", "Your answer"):
        assert word not in out, word
    english = _run("{{ quiz() }}", _page("03-zero.md", "03-zero/", "en"))   # also the stand-in under /nl/
    assert sitebuild.inline(en_bank.items[0].prompt) in english and 'lang="en"' in english


def test_figure_caption_and_links_come_from_the_dutch_page():
    out = _run('{{ figure("zero-breakdown", "Gestapelde GB per GPU") }}', _page("index.nl.md", "nl/", "nl"))
    assert 'src="../assets/figures/zero-breakdown.html"' in out        # the root's figure pages, from /nl/
    assert "<figcaption>Gestapelde GB per GPU</figcaption>" in out


def test_exam_page_in_dutch_has_dutch_rules_titles_and_form():
    out = _run("{{ exam_page() }}", _page("exam/index.nl.md", "nl/exam/", "nl"))
    assert html.unescape(out).count("45 vragen, 3 uit elk van de 15 hoofdstukken") == 1
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
        for key in ("href", "src"):
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
    assert 'href="../../labs/03-zero.ipynb"' in zero and 'src="../../assets/figures/zero-breakdown.html"' in zero


def test_dutch_search_index_holds_the_dutch_pages(built):
    index = json.loads((built / "search" / "search_index.json").read_text(encoding="utf-8"))
    assert set(index["config"]["lang"]) == {"en", "nl"}
    docs = index["docs"]
    dutch = [d["location"] for d in docs if "geheugencalculator" in (d["title"] + d["text"]).lower()]
    assert dutch and all(loc.startswith("nl/") for loc in dutch), dutch
    assert any(d["location"] == "nl/verify/" and "Een certificaat verifiëren" in d["title"] for d in docs)
