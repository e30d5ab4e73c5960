"""Every chapter's step-through picture in chromium: stepped to its last frame with the keyboard at 1280 px
(English) and at 390 px (reduced motion), its meter read against the frames the page carries; one Dutch page too.

At 390 px a grid wider than the phone scrolls in its own box, and each step must bring the active cells into
view (the ZeRO-3 and pipeline grids among them); with `prefers-reduced-motion` nothing moves by itself and
the meter's bar has no transition. Text on the cells and the meter keeps 4.5:1 contrast. One browser, the
session's site build, one page load per chapter for both widths; the wall time is printed.
"""
import re
import time

import pytest

from minimega.figures import animations as fa

pytestmark = pytest.mark.browser

# Per visible picture: step to the end, read the meter, check the active cells are in the scroller's view and
# the text on every cell and on the meter has 4.5:1 contrast against what is behind it.
CHECK = """async (box, walk) => {
  const data = JSON.parse(box.dataset.frames), last = data.frames.length - 1;
  const meter = box.querySelector(".mm-anim-meter-value");
  const scroller = box.querySelector(".mm-anim-scroll"), view = scroller.getBoundingClientRect();
  const head = box.querySelector("tbody th").getBoundingClientRect().width;
  const key = k => box.dispatchEvent(new KeyboardEvent("keydown", {key: k, bubbles: true}));
  const shown = () => { const active = Array.from(box.querySelectorAll("td.mm-active")).map(td => td.getBoundingClientRect());
    return active.length === 0 || active.some(r => r.left >= view.left + head - 1 &&
      (r.right <= view.right + 1 || r.width > view.width - head)); };
  box.focus();
  const lost = [];                     // frames whose active cells were scrolled out of view (walk: every frame)
  if (walk && scroller.scrollWidth > scroller.clientWidth) { key("Home"); for (let i = 1; i <= last; i++) { key("ArrowRight"); if (!shown()) lost.push(i); } }
  key("End");
  if (scroller.scrollWidth > scroller.clientWidth && !walk) await new Promise(r => setTimeout(r, 800));  // smooth
  const inView = shown() && lost.length === 0;
  const rgb = s => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = c => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
                     return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const over = (c, bg) => { const a = c.length > 3 ? c[3] : 1; return [0, 1, 2].map(i => c[i] * a + bg[i] * (1 - a)); };
  const page = rgb(getComputedStyle(document.body).backgroundColor);
  const ratio = el => { const s = getComputedStyle(el); let bg = rgb(s.backgroundColor);
                        bg = bg.length > 3 && bg[3] === 0 ? page : over(bg, page);
                        const fg = over(rgb(s.color), bg), a = lum(fg) + 0.05, b = lum(bg) + 0.05;
                        return Math.max(a, b) / Math.min(a, b); };
  const texts = Array.from(box.querySelectorAll("td, th, .mm-anim-meter, .mm-anim-caption, .mm-anim-count"))
    .filter(el => el.textContent.trim());
  const worst = walk ? Infinity : Math.min(...texts.map(ratio));      // colours do not change with the width
  return {frame: box.dataset.frame, last: String(last), meter: meter.textContent, want: data.frames[last].meter.text,
          value: box.dataset.meter, wantValue: String(data.frames[last].meter.value), inView, worst,
          wide: scroller.scrollWidth > scroller.clientWidth, scrolled: scroller.scrollLeft,
          lost, transition: getComputedStyle(box.querySelector(".mm-anim-bar-fill")).transitionDuration,
          steps: box.querySelectorAll(".mm-anim-text li").length, frames: data.frames.length,
          textLast: box.lastElementChild.classList.contains("mm-anim-text")};
}"""

# Resolves once the point at the link's centre is the link itself: after a scroll, material sizes its sticky
# sidebars on the next animation frame, and for that frame their scroll boxes lie over the footer.
SETTLED = """a => new Promise(done => { const hit = () => { const r = a.getBoundingClientRect();
  const e = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
  if (a.contains(e)) done(true); else requestAnimationFrame(hit); }; hit(); })"""
SKIP = re.compile(r"/assets/(figures/|vendor/katex/|javascripts/(quiz|calculator|perf|goodput|figures|katex-init)\.js)")
WIDTHS = ((1280, "no-preference"), (390, "reduce"))


def _check(page, name, width, reduced, followed):
    box = page.locator(f"#anim-{name}")
    got = box.evaluate(CHECK, reduced == "reduce")              # at 390 px: every frame walked, in view
    where = (name, width)
    assert got["frame"] == got["last"], (where, got)
    assert got["meter"] == got["want"] and got["value"] == got["wantValue"], (where, got)
    assert got["steps"] == got["frames"] and got["textLast"], where                     # the captions as a list
    assert got["worst"] >= 4.5, (where, got["worst"])
    assert got["inView"], (where, got["lost"])
    if reduced == "reduce":
        assert got["transition"] == "0s", (where, got["transition"])
    if got["wide"] and width == 390:
        followed[name] = got["scrolled"]
    return got


def test_every_picture_steps_to_its_last_frame_and_reads_its_meter(site_server, chromium):
    started = time.perf_counter()
    ctx = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    page.route(SKIP, lambda route: route.abort())                        # what is not under test here
    errors, followed, seen = [], {}, []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{site_server}/01-memory/", wait_until="domcontentloaded")
    for k, (slug, names) in enumerate(fa.CHAPTERS.items()):
        if k:                                  # the footer's next link, as a reader goes on
            page.set_viewport_size({"width": 1280, "height": 900})
            link = page.locator("a.md-footer__link--next")
            link.scroll_into_view_if_needed()      # the sticky sidebars shrink to the new scroll on their next frame;
            link.evaluate(SETTLED)                 # until then they cover the footer (a busy machine: every retry)
            link.click()
            page.wait_for_url(lambda url, slug=slug: f"/{slug}/" in url, wait_until="commit")
        page.wait_for_selector(f"#anim-{names[0]}[data-ready='1']", state="attached")
        visible = [n for n in names if page.locator(f"#anim-{n}").is_visible()]    # chapters 3 and 8: the open tab
        for width, reduced in WIDTHS:
            page.set_viewport_size({"width": width, "height": 900})
            page.emulate_media(reduced_motion=reduced)
            for name in visible:
                _check(page, name, width, reduced, followed)
        seen += visible
    assert {names[0] for names in fa.CHAPTERS.values()} <= set(seen)         # every chapter's first picture
    assert {"zero-3", "pipeline-gpipe", "step-split"} <= set(followed), followed   # wide at 390 px, and followed
    assert followed["pipeline-gpipe"] > 0                                     # its last tick is at the far right
    page.goto(f"{site_server}/nl/01-memory/", wait_until="domcontentloaded")  # the Dutch edition: its own words
    page.wait_for_selector("#anim-memory-stack[data-ready='1']", state="attached")
    got = _check(page, "memory-stack", 390, "reduce", {})
    assert "," in got["meter"] and "Bytes op rank 0" in page.locator("#anim-memory-stack .mm-anim-meter").inner_text()
    assert errors == [], errors
    ctx.close()
    print(f"\n{len(seen)} pictures stepped at 1280 and 390 px in {time.perf_counter() - started:.1f} s")
