"""mkdocs hook: the course's formulas typeset when the site is built, not in the reader's browser.

pymdownx.arithmatex (generic mode) writes ``<span class="arithmatex">\\( … \\)</span>`` and
``<div class="arithmatex">\\[ … \\]</div>``. After both editions are written, every such formula in every page is
rendered by the course's copy of KaTeX under Node.js (tools/katex_render.js, one process for the whole site) and
the page keeps KaTeX's HTML and MathML (screen readers read the MathML). A page then opens with its formulas in
place: nothing is typeset while the reader looks at it, so no line moves (a phone's layout shift, Lighthouse's
CLS) and no script runs for it. Formulas that a script writes later (the practice quiz's questions) are typeset
in the browser by katex-init.js, as before.

Needs ``node`` on PATH (Debian: ``apt-get install -y nodejs``); without it the build stops and says so.
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[1]
RENDER = ROOT / "tools" / "katex_render.js"
FONTS = ("KaTeX_Main-Regular", "KaTeX_Math-Italic")      # what nearly every formula is set in
FORMULA = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
DELIMITERS = re.compile(r"^\\[(\[](.*)\\[)\]]$", re.S)


def render(formulas: list[tuple[str, bool]]) -> list[str]:
    """KaTeX's HTML for each (tex, display), in order, from one Node.js process."""
    node = shutil.which("node")
    if node is None:
        raise PluginError("the course's formulas are typeset at build time with KaTeX under Node.js, and `node` is "
                          "not on PATH: install it (Debian: apt-get install -y nodejs) and build again")
    done = subprocess.run([node, str(RENDER)], input=json.dumps(formulas), capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        raise PluginError(f"{RENDER.name} failed: {done.stderr.strip()[-2000:]}")
    out = json.loads(done.stdout)
    if len(out) != len(formulas):
        raise PluginError(f"{RENDER.name} returned {len(out)} formulas for {len(formulas)}")
    return out


def typeset_site(site: Path) -> int:
    """Typeset every arithmatex formula in the site's pages in place; returns how many."""
    pages = sorted(site.rglob("*.html"))
    found: list[tuple[str, bool]] = []
    texts = {}
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for m in FORMULA.finditer(text):
            source = html.unescape(m.group(2)).strip()
            inner = DELIMITERS.match(source)
            found.append((inner.group(1) if inner else source, m.group(1) == "div"))
        texts[page] = text
    if not found:
        return 0
    rendered = iter(render(found))

    def typeset(m: re.Match) -> str:
        return f'<{m.group(1)} class="arithmatex" data-typeset="1">{next(rendered)}</{m.group(1)}>'
    for page in pages:
        new = FORMULA.sub(typeset, texts[page])
        if new != texts[page]:
            page.write_text(preload_fonts(new, page, site), encoding="utf-8")
    return len(found)


def preload_fonts(text: str, page: Path, site: Path) -> str:
    """Ask for KaTeX's two main fonts with the page, before its stylesheets: a formula set in a fallback font and
    then in KaTeX's once it arrives changes width and moves the lines after it (on a slow phone, a layout shift of
    0.14 on the Dutch chapter 8)."""
    fonts = os.path.relpath(site / "assets" / "vendor" / "katex" / "fonts", page.parent).replace(os.sep, "/")
    links = "".join(f'<link rel="preload" href="{fonts}/{name}.woff2" as="font" type="font/woff2" crossorigin>'
                    for name in FONTS)
    return text.replace('<link rel="stylesheet"', links + '\n<link rel="stylesheet"', 1)


@event_priority(-120)              # after mkdocs-static-i18n (-100) has written /nl/, and after learner_hook
def on_post_build(config) -> None:
    i18n = config["plugins"].get("i18n")
    if i18n is not None and getattr(i18n, "building", False):
        return                        # inside the Dutch build; the outer build finishes the site
    typeset_site(Path(config["site_dir"]))
