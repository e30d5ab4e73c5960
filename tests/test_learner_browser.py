"""A new learner's walk through the built site in chromium, in English (1280 px) and Dutch (390 px): home →
Start here → chapter 3 → step the ZeRO-3 animation forward and back → the quiz, one numeric item wrong (told
too high by more than 10 %, never by how much exactly, offered a retry and a hint, no worked answer yet), then
right with its unit → home shows chapter 3's progress, and so does the other language's home (one progress for
both); no console error. Also: search per language, the animations' controls, and
no page wider than a 390 px phone.
"""
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "build" / "screenshots"

WALK = {
    "en": dict(prefix="", width=1280, start="Start here", chapter="Chapter 3", step="Step forward", back="Step back",
               wrong="Not correct yet. Too high, by more than 10 %.", hint="Hint: Stage 1 shards only the optimizer states",
               worked="Worked answer:", right="Correct.", line="Your quiz progress in this chapter: 2 of 9 right",
               home="2 of 9 right (2 tried)", total="2 of", one="in 1 chapter.", home_link="Home"),
    "nl": dict(prefix="nl/", width=390, start="Begin hier", chapter="Hoofdstuk 3", step="Stap vooruit",
               back="Stap terug", wrong="Nog niet goed. Te hoog, met meer dan 10 %.", hint="Hint: Stage 1 shardt alleen de optimizer states",
               worked="Uitwerking:", right="Goed.", line="Je quizvoortgang in dit hoofdstuk: 2 van 9 goed",
               home="2 van 9 goed (2 geprobeerd)", total="2 van", one="in 1 hoofdstuk.", home_link="Start"),
}


class Watch:
    def __init__(self, page):
        self.errors = []
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))


@pytest.fixture(scope="module")
def browser(chromium):
    return chromium


def _no_sideways_scroll(page):
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


@pytest.mark.parametrize("lang", ["en", "nl"])
def test_new_learner_walk(site_server, browser, lang):
    w = WALK[lang]
    ctx = browser.new_context(viewport={"width": w["width"], "height": 900})
    page = ctx.new_page()
    watch = Watch(page)
    page.goto(f"{site_server}/{w['prefix']}")
    page.wait_for_selector(".mm-progress-summary li[data-tried]")
    assert page.locator(".mm-progress-summary li[data-bank='03-zero']").get_attribute("data-tried") == "0"
    page.locator("article a", has_text=w["start"]).first.click()                   # "New here? Start here"
    page.wait_for_url(f"**/{w['prefix']}start-here/")
    assert "min" in page.locator("article table").first.inner_text()
    assert _no_sideways_scroll(page)
    page.locator("article a", has_text=w["chapter"]).first.click()                 # the tour's chapter 3 step
    page.wait_for_url(f"**/{w['prefix']}03-zero/**")

    page.wait_for_selector("#anim-zero-3[data-ready='1']")                         # animate.js ran after the swap
    page.wait_for_selector(".mm-quiz[data-ready='1']")
    anim = page.locator("#anim-zero-3")
    anim.scroll_into_view_if_needed()
    caption = anim.locator(".mm-anim-caption")
    assert anim.get_attribute("data-frame") == "0"
    anim.focus()
    page.keyboard.press("ArrowRight")                                               # frame 1: gather the embeddings
    assert anim.get_attribute("data-frame") == "1" and "all-gather" in caption.inner_text()
    p_row = anim.locator("tbody tr").first.locator("td")
    assert "mm-s-full" in p_row.nth(0).get_attribute("class")
    assert "mm-s-shard" in p_row.nth(1).get_attribute("class")
    anim.get_by_role("button", name=w["step"]).click()                             # frame 2: computed, freed
    assert anim.get_attribute("data-frame") == "2"
    assert "mm-s-shard" in p_row.nth(0).get_attribute("class")
    anim.get_by_role("button", name=w["back"]).click()                             # and back: gathered again
    assert anim.get_attribute("data-frame") == "1" and "mm-s-full" in p_row.nth(0).get_attribute("class")
    anim.focus()
    page.keyboard.press("ArrowLeft")
    assert anim.get_attribute("data-frame") == "0"
    assert caption.get_attribute("aria-live") == "polite"

    page.check("#q-03-zero-faq-zero-stage-saves-most-0")                          # "Stage 3", right
    page.locator("#q-03-zero-faq-zero-stage-saves-most .mm-check").click()
    item = page.locator("#q-03-zero-fig1-stage1")                                  # 31.4 GB
    item.locator("input").fill("35")
    item.locator(".mm-check").click()
    feedback = item.locator(".mm-feedback")
    assert feedback.inner_text().startswith(w["wrong"]), feedback.inner_text()
    assert w["worked"] not in feedback.inner_text() and "31" not in feedback.inner_text()   # not yet
    assert "3.6" not in feedback.inner_text() and "3,6" not in feedback.inner_text()          # nor the difference
    item.locator(".mm-hint-btn").click()
    assert w["hint"] in feedback.inner_text()
    item.locator(".mm-retry").click()
    assert page.evaluate("document.activeElement.id") == "q-03-zero-fig1-stage1-in"
    page.keyboard.type("31.4 GB" if lang == "en" else "31,4 GB")                  # with its unit
    page.keyboard.press("Enter")
    assert feedback.inner_text().startswith(w["right"]), feedback.inner_text()
    assert "31" in feedback.inner_text() and "90/64" in feedback.inner_text()      # the worked answer now
    assert page.locator(".mm-chapter-progress").inner_text().startswith(w["line"])
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"learner-walk-{lang}.png"))

    page.goto(f"{site_server}/{w['prefix']}")                                      # home
    page.wait_for_selector(".mm-progress-summary li[data-tried]")
    li = page.locator(".mm-progress-summary li[data-bank='03-zero']")
    assert li.get_attribute("data-right") == "2" and w["home"] in li.inner_text()
    assert page.locator(".mm-progress-total").inner_text().startswith(w["total"])
    assert page.locator(".mm-progress-total").inner_text().endswith(w["one"])
    other = "nl/" if lang == "en" else ""                                  # the other edition: the same progress
    page.goto(f"{site_server}/{other}")
    page.wait_for_selector(".mm-progress-summary li[data-tried]")
    assert page.locator(".mm-progress-summary li[data-bank='03-zero']").get_attribute("data-right") == "2"
    page.goto(f"{site_server}/{w['prefix']}")
    page.locator(".mm-progress-reset").click()
    assert li.get_attribute("data-tried") == "0"
    assert watch.errors == [], watch.errors
    ctx.close()


def test_wrong_answers_get_a_band_the_worked_answer_on_request_and_units_convert(site_server, browser):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    watch = Watch(page)
    page.goto(f"{site_server}/03-zero/")
    page.wait_for_selector(".mm-quiz[data-ready='1']")
    item = page.locator("#q-03-zero-fig1-stage2")                                  # 16.6 GB
    fb = item.locator(".mm-feedback")
    for value, starts in (("10", "Not correct yet. Too low, by more than 10 %."),
                          ("16", "Not correct yet. Too low, by less than 10 %."),
                          ("166", "Not correct yet. Too high, by a factor of 10 or more"),
                          ("26", "Not correct yet. Too high, by more than 50 %.")):
        item.locator("input").fill(value)
        item.locator(".mm-check").click()
        assert fb.inner_text().startswith(starts), fb.inner_text()
        assert "6.6" not in fb.inner_text() and "Worked answer:" not in fb.inner_text(), fb.inner_text()
    item.locator(".mm-worked-btn").click()                                         # only when asked for
    assert "Worked answer:" in fb.inner_text()
    item.locator("input").fill("16640 MB")                                          # another prefix, converted
    item.locator(".mm-check").click()
    assert fb.inner_text().startswith("Correct."), fb.inner_text()
    item.locator("input").fill("16.6 kg")
    item.locator(".mm-check").click()
    assert "kg" in fb.inner_text() and not fb.inner_text().startswith("Correct")
    one = page.locator("#q-03-zero-table1-1t-stage3")                               # "show the worked answer" on request
    one.locator("input").fill("1")
    one.locator(".mm-check").click()
    one.locator(".mm-worked-btn").click()
    assert "Worked answer:" in one.locator(".mm-feedback").inner_text()
    page.goto(f"{site_server}/02-data-parallel/")                 # another bank's own hint, on the first wrong try
    page.wait_for_selector(".mm-quiz[data-ready='1']")
    ring = page.locator("#q-02-data-parallel-ring-allreduce-bytes")
    ring.locator("input").fill("1")
    ring.locator(".mm-check").click()
    ring.locator(".mm-hint-btn").click()
    assert "Hint: A ring all-reduce is a reduce-scatter followed by an all-gather" in \
        ring.locator(".mm-feedback").inner_text()
    # numbers read the page's way, suffixes where the unit counts things, examples in the item's own unit
    for prefix, cases in (("", (("", "Type a number first, for example 12.5 MB."), ("2,869", "Correct."),
                                ("2869 MB", "Correct."), ("5B", "Correct."), ("5,000M", "Correct."),
                                ("", "for example 12.5 billion parameters or 5B."))),
                          ("nl/", (("2,869", "Nog niet goed. Te laag, met een factor 10 of meer"),
                                   ("2.869", "Goed."), ("2868,9 MB", "Goed."), ("5B", "Goed.")))):
        page.goto(f"{site_server}/{prefix}01-memory/")
        page.wait_for_selector(".mm-quiz[data-ready='1']")
        if prefix:                                   # the English answers, shown on the Dutch page: one progress
            restored = page.locator("#q-01-memory-gpt3-layer-activations .mm-feedback").inner_text()
            assert restored.startswith("Eerder antwoord: Goed."), restored
            assert page.locator("#q-01-memory-gpt3-layer-activations input").input_value() == "2869"
        for i, (typed, starts) in enumerate(cases):
            form = page.locator("#q-01-memory-" + ("gpt3-layer-activations" if i < 3
                                                  else "max-params-80gb"))
            form.locator("input").fill(typed)
            form.locator(".mm-check").click()
            text = form.locator(".mm-feedback").inner_text()
            assert (text.startswith(starts) if typed else starts in text), (prefix, typed, text)
    assert watch.errors == [], watch.errors
    ctx.close()


@pytest.mark.parametrize("lang,query,foreign", [("en", "gradient", "/nl/"), ("nl", "gradiënt", None)])
def test_search_returns_pages_of_the_current_language(site_server, browser, lang, query, foreign):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    page.goto(f"{site_server}/{'nl/' if lang == 'nl' else ''}03-zero/")
    page.locator(".md-search__input").click()
    page.keyboard.type(query, delay=30)                                             # material searches on keyup
    page.wait_for_selector(".md-search-result__item")
    hrefs = page.eval_on_selector_all(".md-search-result__item a", "els => els.map(e => e.href)")
    assert hrefs
    if lang == "en":
        assert not any(foreign in h for h in hrefs), hrefs
    else:
        assert all("/nl/" in h for h in hrefs), hrefs
    assert not any("undefined" in h for h in hrefs), hrefs                         # every section has its page
    ctx.close()


def test_animation_controls_and_phone_width(site_server, browser):
    ctx = browser.new_context(viewport={"width": 390, "height": 844})
    page = ctx.new_page()
    watch = Watch(page)
    page.goto(f"{site_server}/08-pipeline-parallel/")
    page.wait_for_selector("#anim-pipeline-1f1b[data-ready='1']", state="attached")
    anim = page.locator("#anim-pipeline-1f1b")
    page.locator("label", has_text="1F1B").first.click()                           # its tab
    anim.focus()
    page.keyboard.press("End")
    assert anim.get_attribute("data-frame") == str(len(json.loads(anim.get_attribute("data-frames"))["frames"]) - 1)
    page.keyboard.press("Home")
    assert anim.get_attribute("data-frame") == "0"
    page.keyboard.press(" ")                                                        # play
    page.wait_for_function("Number(document.querySelector('#anim-pipeline-1f1b').dataset.frame) >= 2", timeout=5000)
    page.keyboard.press(" ")                                                        # pause
    frame = anim.get_attribute("data-frame")
    page.wait_for_timeout(1500)
    assert anim.get_attribute("data-frame") == frame
    assert _no_sideways_scroll(page)
    for path in ("start-here/", "nl/03-zero/", "07-tensor-parallel/", "15-long-context/"):   # a covering sample
        page.goto(f"{site_server}/{path}")
        assert _no_sideways_scroll(page), path
    assert watch.errors == [], watch.errors
    ctx.close()


CODE_BLOCKS = """() => Array.from(document.querySelectorAll('article .highlight pre > code')).map(c => {
  const d = c.closest('details');
  return {lines: c.innerText.replace(/\\n$/, '').split('\\n').length, folded: !!(d && !d.open),
          wide: c.scrollWidth > c.clientWidth + 1 || c.closest('pre').scrollWidth > c.closest('pre').clientWidth + 1};
})"""


def test_code_blocks_carry_the_idea_and_never_scroll_sideways(site_server, browser, site_build):
    """In every chapter at 1280 px: the median code block shown (not folded) is at most 20 lines, every chapter
    shows at least one of 20 lines or fewer, and no block, folded ones opened, is wider than its box."""
    import statistics
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    shown, wide = [], []
    chapters = sorted(p.name for p in site_build.out.glob("[0-9][0-9]-*") if p.is_dir())
    assert len(chapters) == 17
    for slug in chapters:
        page.goto(f"{site_server}/{slug}/")
        blocks = page.evaluate(CODE_BLOCKS)
        mine = [b["lines"] for b in blocks if not b["folded"]]
        assert mine and min(mine) <= 20, f"{slug}: no embedded block of 20 lines or fewer ({mine})"
        shown += mine
        page.evaluate("document.querySelectorAll('article details').forEach(d => d.open = true)")
        wide += [(slug, b["lines"]) for b in page.evaluate(CODE_BLOCKS) if b["wide"]]
    median = statistics.median(shown)
    print(f"code blocks shown: {len(shown)}, median {median} lines")
    assert median <= 20, median
    assert wide == [], wide
    ctx.close()
