"""Every chapter figure, English and Dutch, and the calculator's chart, on a 1280 px screen and a 390 px phone
(each figure in two of its four views, chosen so every figure meets both languages and both widths:
`covering_cases`).

Each figure is measured where a reader sees it: in its iframe on the chapter page, after the frame took
the height the figure asked for. From plotly's SVG (getBoundingClientRect): the title, tick labels,
axis titles, legend, annotations and value labels lie inside the figure; no tick label overlaps another
or the legend; the title and axis titles overlap nothing; value labels lie inside the plot area (plotly
clips them there); the plot area keeps a legible size. Screenshots go to a temporary folder, and to
$MINIMEGA_SCREENSHOTS when set.
"""
import os
import re
from pathlib import Path

import pytest

from minimega.figures import plots

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.browser

COURSE = Path(__file__).resolve().parents[1] / "course"
WIDTHS = (1280, 390)
FIGURE_CALL = re.compile(r'\{\{\s*figure\(\s*"([a-z0-9-]+)"')
MIN_PLOT = 150          # px: the smallest plot area (each way) still worth reading
MIN_FONT = 10           # px: the smallest tick label font


def chapter_figures() -> list[tuple[str, str]]:
    """(figure, page slug) for every figure a chapter embeds, at the first page that embeds it."""
    where: dict[str, str] = {}
    for md in sorted(COURSE.glob("*.md")):
        for name in FIGURE_CALL.findall(md.read_text(encoding="utf-8")):
            where.setdefault(name, md.stem)
    return sorted(where.items())


FIGS = chapter_figures()

# Runs in the page that holds the plot (`sel`): boxes of every text plotly drew, in that page's pixels.
MEASURE = """sel => {
  const gd = document.querySelector(sel);
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const texts = q => [...gd.querySelectorAll(q)].filter(e => {
    const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0 && e.textContent.trim() !== '';
  }).map(e => ({text: e.textContent.trim(), box: box(e), font: parseFloat(getComputedStyle(e).fontSize)}));
  const fig = box(gd), s = gd._fullLayout._size;
  return {
    figure: fig, viewport: [0, 0, document.documentElement.clientWidth, window.innerHeight],
    plot: [fig[0] + s.l, fig[1] + s.t, fig[0] + s.l + s.w, fig[1] + s.t + s.h],
    title: texts('.gtitle'),
    ticks: texts('g[class$="tick"] > text, g[class$="tick2"] > text'),
    axis_titles: [...gd.querySelectorAll('.infolayer text')].filter(e => /^[xy][0-9]*title$/.test(e.getAttribute('class')))
      .filter(e => e.textContent.trim() !== '').map(e => ({text: e.textContent.trim(), box: box(e)})),
    legend: [...gd.querySelectorAll('.legend')].filter(e => e.querySelector('.legendtext'))
      .map(e => ({text: 'legend', box: box(e)})),
    annotations: texts('.annotation-text'),
    values: texts('g.textpoint > text, text.bartext'),
  };
}"""


def _overlap(a, b, tol=1.0) -> bool:
    return min(a[2], b[2]) - max(a[0], b[0]) > tol and min(a[3], b[3]) - max(a[1], b[1]) > tol


def _inside(a, outer, tol=1.0) -> bool:
    return a[0] >= outer[0] - tol and a[1] >= outer[1] - tol and a[2] <= outer[2] + tol and a[3] <= outer[3] + tol


def layout_problems(m: dict) -> list[str]:
    """Every way the measured figure `m` fails to fit, in words (empty when it fits)."""
    bad = []
    bounds = [max(m["figure"][0], m["viewport"][0]), m["figure"][1],
              min(m["figure"][2], m["viewport"][2]), m["figure"][3]]
    if not m["title"]:
        bad.append("no title drawn")
    for group in ("title", "ticks", "axis_titles", "legend", "annotations", "values"):
        for t in m[group]:
            if not _inside(t["box"], bounds):
                bad.append(f"{group} {t['text']!r} at {[round(v) for v in t['box']]} is cut off by "
                           f"{[round(v) for v in bounds]}")
    ticks = m["ticks"]
    for i, a in enumerate(ticks):
        if a["font"] < MIN_FONT:
            bad.append(f"tick label {a['text']!r} in {a['font']} px type")
        for b in ticks[i + 1:]:
            if _overlap(a["box"], b["box"]):
                bad.append(f"tick labels {a['text']!r} and {b['text']!r} overlap")
    values = m["values"]
    for i, a in enumerate(values):
        for b in values[i + 1:]:
            if _overlap(a["box"], b["box"], tol=-3):        # closer than 3 px, "16.0" "16.0" reads "16.016.0"
                bad.append(f"value labels {a['text']!r} and {b['text']!r} run together")
    pairs = [("legend", g) for g in ("ticks", "axis_titles", "title", "annotations", "values")]
    pairs += [("title", g) for g in ("ticks", "axis_titles", "annotations", "values")]
    pairs += [("axis_titles", "ticks")]
    for g1, g2 in pairs:
        for a in m[g1]:
            for b in m[g2]:
                if _overlap(a["box"], b["box"]):
                    bad.append(f"{g1} {a['text']!r} overlaps {g2} {b['text']!r}")
    for v in m["values"]:
        if not _inside(v["box"], m["plot"], tol=2.0):
            bad.append(f"value label {v['text']!r} lies outside the plot area, where plotly clips it")
    w, h = m["plot"][2] - m["plot"][0], m["plot"][3] - m["plot"][1]
    if w < MIN_PLOT or h < MIN_PLOT:
        bad.append(f"plot area {w:.0f} x {h:.0f} px, less than {MIN_PLOT} px")
    return bad


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    dirs = [tmp_path_factory.mktemp("figure-screenshots")]
    if os.environ.get("MINIMEGA_SCREENSHOTS"):
        dirs.append(Path(os.environ["MINIMEGA_SCREENSHOTS"]))
        dirs[-1].mkdir(parents=True, exist_ok=True)
    return dirs


@pytest.fixture(scope="module")
def pages(chromium, site_server):
    """One page per width, reused by every figure: it navigates only when the chapter changes."""
    out, ctxs = {}, []
    for width in WIDTHS:
        ctx = chromium.new_context(viewport={"width": width, "height": 900})
        ctxs.append(ctx)
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
        page.on("console", lambda msg, errors=errors: msg.type == "error" and errors.append(msg.text))
        out[width] = (page, errors)
    yield out
    for ctx in ctxs:
        ctx.close()


def _goto(page, url):
    if page.url.split("#")[0] != url:
        page.goto(url)


def _save(element, shots, name):
    element.screenshot(path=str(shots[0] / name))
    for extra in shots[1:]:
        (extra / name).write_bytes((shots[0] / name).read_bytes())


def test_every_figure_is_in_a_chapter():
    assert {name for name, _ in FIGS} == set(plots.FIGURES)    # so none escapes the checks below


def _check_figure(pages, shots, url, name, width, shot):
    page, errors = pages[width]
    errors.clear()
    _goto(page, url)
    figure = page.locator(f"#fig-{name}")
    frame_el = figure.locator("iframe")
    frame_el.scroll_into_view_if_needed()        # the frame loads when it comes near the screen (figures.js)
    frame = frame_el.content_frame
    # the course page gave the frame the height the figure asked for at this width (figures.js)
    try:
        frame.locator("body[data-mm-fit=settled]").wait_for(timeout=15_000)
    except sync_api.TimeoutError:
        asked = frame.locator("body").get_attribute("data-mm-height")
        pytest.fail(f"{name} at {width} px never settled: it asks for {asked} px, the frame is "
                    f"{frame_el.bounding_box()['height']:.0f} px; errors: {errors}")
    box = frame_el.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= width, f"the frame {box} is wider than the {width} px page"
    m = frame_el.element_handle().content_frame().evaluate(MEASURE, ".js-plotly-plot")
    _save(figure, shots, shot)
    problems = layout_problems(m)
    assert problems == [], f"{name} at {width} px:\n" + "\n".join(problems)
    assert errors == [], errors
    return frame_el


def covering_cases(figs, everything=False) -> list[tuple[str, str, str, int]]:
    """(figure, slug, language, width) to check: every figure in both languages and at both widths, and every
    language at every width, in two views per figure instead of four (alternating: English wide + Dutch phone,
    then English phone + Dutch wide). `everything`: all four views of every figure."""
    views = [(lang, w) for lang in ("en", "nl") for w in WIDTHS]
    out = []
    for i, (name, slug) in enumerate(figs):
        picked = views if everything else [views[0], views[3]] if i % 2 == 0 else [views[1], views[2]]
        out += [(name, slug, lang, w) for lang, w in picked]
    return sorted(out, key=lambda c: (c[2], -c[3], c[1]))    # one view at a time: a page loads each chapter once


# MINIMEGA_ALL_FIGURES=1 checks all four views of every figure (after a change to the figures' layout code).
CASES = covering_cases(FIGS, everything=os.environ.get("MINIMEGA_ALL_FIGURES") == "1")


def test_the_sample_covers_every_figure_language_and_width():
    cases = covering_cases(FIGS)
    assert {(n, lang) for n, _, lang, _ in cases} == {(n, lang) for n, _ in FIGS for lang in ("en", "nl")}
    assert {(n, w) for n, _, _, w in cases} == {(n, w) for n, _ in FIGS for w in WIDTHS}
    assert {(lang, w) for _, _, lang, w in cases} == {(lang, w) for lang in ("en", "nl") for w in WIDTHS}
    assert len(covering_cases(FIGS, everything=True)) == 4 * len(FIGS)


@pytest.mark.parametrize("name,slug,lang,width", CASES, ids=[f"{n}-{lang}-{w}px" for n, _, lang, w in CASES])
def test_figure_fits(pages, site_server, shots, name, slug, lang, width):
    if lang == "en":
        _check_figure(pages, shots, f"{site_server}/{slug}/", name, width, f"{name}-{width}.png")
        return
    # The Dutch figures have the English ones' shapes and longer words (titles wrap, legends widen): the same
    # checks, and the Dutch page embeds the Dutch figure.
    frame_el = _check_figure(pages, shots, f"{site_server}/nl/{slug}/", name, width, f"nl-{name}-{width}.png")
    src = frame_el.get_attribute("src")
    assert src.endswith(f"/figures/nl/{name}.html"), f"/nl/{slug}/ embeds {src}, not the Dutch figure"
    assert frame_el.element_handle().content_frame().evaluate("document.documentElement.lang") == "nl"


@pytest.mark.parametrize("width", WIDTHS, ids=lambda w: f"{w}px")
def test_calculator_chart_fits(pages, site_server, shots, width):
    page, errors = pages[width]
    errors.clear()
    _goto(page, f"{site_server}/calculator/")
    page.locator("#mm-calc-plot").scroll_into_view_if_needed()    # plotly loads when the plot nears the screen
    page.wait_for_function("(document.getElementById('mm-calc-plot').data || []).length === 6")
    for preset in ("mt-nlg-530b", "zero-7.5b"):          # the longest legend, then the default again
        page.select_option("select[name=preset]", preset)
        plot = page.locator("#mm-calc-plot")
        plot.scroll_into_view_if_needed()
        plot.evaluate("el => new Promise(r => requestAnimationFrame(() => r()))")
        m = page.evaluate(MEASURE, "#mm-calc-plot")
        _save(plot, shots, f"calculator-{preset}-{width}.png")
        problems = layout_problems(m)
        assert problems == [], f"calculator ({preset}) at {width} px:\n" + "\n".join(problems)
    assert errors == [], errors


@pytest.mark.parametrize("lang,total", [("en", "total on the GPU"), ("nl", "totaal op de GPU")])
def test_calculator_uses_the_python_palette(pages, site_server, lang, total):
    """The calculator's chart and table show each category in minimega.figures.palette's colour and the page's
    language's label, as every figure does."""
    from minimega.figures import palette
    labels = palette.LABELS_BY_LANG[lang]
    page, errors = pages[1280]
    errors.clear()
    _goto(page, f"{site_server}/{'' if lang == 'en' else lang + '/'}calculator/")
    page.wait_for_function("(document.getElementById('mm-calc-plot').data || []).length === 6")
    drawn = page.evaluate("document.getElementById('mm-calc-plot').data.map(t => [t.name, t.marker.color])")
    want = [(labels[k], palette.COLOURS[k])
            for k in ("params", "grads", "optimizer", "gathered", "activations", "recompute")]
    assert [tuple(t) for t in drawn] == want
    rows = page.evaluate("""[...document.querySelectorAll('.mm-calc-table tbody th')].map(th => {
        const s = th.querySelector('.mm-swatch');
        return [th.textContent, s ? getComputedStyle(s).backgroundColor : null]; })""")
    rgb = lambda c: "rgb({}, {}, {})".format(*(int(c[i:i + 2], 16) for i in (1, 3, 5)))
    assert rows == [[lab, rgb(col)] for lab, col in want] + [[total, None], [labels["cpu"], rgb(palette.COLOURS["cpu"])]]
    assert errors == [], errors
