"""mkdocs hooks for the course site (``hooks:`` in mkdocs.yml).

Pages call these macros (and the exam page ``exam_page()``); a call whose arguments do not parse fails
the build, and other ``{{ … }}`` text (say, in a page someone else owns) is left alone:

    {{ num("model_state_bytes(7.5e9, 64, 2) / GB", ".1f") }}   a number computed by minimega.analysis
    {{ figure("zero-memory-vs-dp", "Caption for screen readers and print") }}   a plotly figure (iframe;
                                                      figures.js sets its height to what the figure asks)
    {{ quiz() }}                                      the practice quiz quizzes/<page stem>.yaml
    {{ presets_json() }}                              the calculator presets, as JSON
    {{ palette_json() }}                              the memory categories' labels and colours, as JSON

Languages: the Dutch edition (``NN-slug.nl.md`` beside ``NN-slug.md``, built by mkdocs-static-i18n
under ``/nl/``) calls the same macros. On a Dutch page `num` writes a decimal comma, `quiz` renders
the Dutch twin of the bank (``quizzes/nl/``) with Dutch controls, `exam_page` the Dutch exam form,
and `figure` takes its caption from the page that calls it and embeds the Dutch figure
(``assets/figures/nl/NAME.html``, its words from `minimega.figures.words`). An English page that stands in for a
missing twin under ``/nl/`` stays English throughout.

`on_files` adds the lab notebooks (``labs/NN-slug.ipynb``, outside ``docs_dir``) to the site as
``labs/NN-slug.ipynb``, so a chapter links its lab as ``[…](labs/NN-slug.ipynb)`` and ``--strict``
checks the link. After the build, `on_post_build` writes every figure of `minimega.figures.plots.FIGURES` as a standalone page
in each language under ``assets/figures/`` (`figure_path`), and pins the verify page's trusted issuers (``$MINIMEGA_TRUSTED_ISSUERS``,
see `minimega.classroom.trust`) in ``verify/trusted-issuers.json``. Figures and the calculator load the vendored plotly.js basic bundle
(``course/assets/vendor/plotly/``, the same plotly.js version plotly.py bundles), so the site makes
no third-party request.
"""
from __future__ import annotations

import functools
import html
import json
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

from minimega import estimate as est
from minimega.classroom.quiz import Bank, Item, evaluate, formula_namespace, grade, load_bank  # noqa: F401

MACRO = re.compile(r"\{\{(\s*(?:num|figure|quiz|presets_json|palette_json|exam_page)\s*\(.*?)\}\}", re.S)
NUM = re.compile(r'^\s*num\(\s*"([^"]+)"\s*(?:,\s*"([^"]*)"\s*)?\)\s*$')
FIGURE = re.compile(r'^\s*figure\(\s*"([a-z0-9-]+)"\s*,\s*"([^"]+)"\s*\)\s*$')
QUIZ = re.compile(r"^\s*quiz\(\s*\)\s*$")
PRESETS = re.compile(r"^\s*presets_json\(\s*\)\s*$")
PALETTE = re.compile(r"^\s*palette_json\(\s*\)\s*$")
EXAM_PAGE = re.compile(r"^\s*exam_page\(\s*\)\s*$")


def format_number(value: float, fmt: str | None, lang: str = "en") -> str:
    """Format with a Python format spec; thousands separators are thin spaces in prose, and a Dutch
    page writes the decimal point as a comma (``16,6 GB``)."""
    if fmt and fmt.endswith("d"):
        if not value.is_integer():
            raise ValueError(f"{value} is not an integer (format {fmt!r})")
        value = int(value)
    text = format(value, fmt or ",.3g").replace(",", "\u2009")
    return text.replace(".", ",") if lang == "nl" else text


# The words the hook writes around a quiz, per language; quiz.js has the same table for its feedback.
QUIZ_WORDS = {
    "en": {"answer": "Your answer", "all": "(choose all that apply)", "question": "Question {n}.",
           "check": "Check", "count": "{n} questions.", "reset": "Reset this quiz"},
    "nl": {"answer": "Jouw antwoord", "all": "(kies alle juiste opties)", "question": "Vraag {n}.",
           "check": "Controleer", "count": "{n} vragen.", "reset": "Deze quiz opnieuw beginnen"},
}


def page_language(page) -> str:
    """The language a page is written in: mkdocs-static-i18n's locale of its source file
    (``03-zero.nl.md`` is Dutch; the English page standing in for a missing twin is English)."""
    lang = getattr(page.file, "locale", None) or "en"
    if lang not in QUIZ_WORDS:
        raise PluginError(f"{page.file.src_path}: language {lang!r} has no quiz words; have {sorted(QUIZ_WORDS)}")
    return lang


def page_stem(src_path: str) -> str:
    """The bank a page's quiz() reads: ``03-zero.nl.md`` and ``03-zero.md`` -> ``03-zero``;
    ``exam/index.md`` -> ``exam``."""
    path = Path(src_path)
    stem = path.stem
    for lang in QUIZ_WORDS:
        stem = stem.removesuffix(f".{lang}")
    return path.parent.name if stem == "index" else stem


# ----------------------------------------------------------------------------------------------
# Quiz rendering: accessible HTML; quiz.js adds the behaviour.

_MATH = re.compile(r"\$([^$]+)\$")
_CODE = re.compile(r"`([^`]+)`")


def inline(text: str) -> str:
    """Escape `text` and render the inline markup quiz banks use: `code` and $math$; ``\\$`` is a dollar sign
    (in a double-quoted YAML string, ``\\\\$``): "costs \\$2.50 = \\$3413", not the formula "2.50 = "."""
    out, pos = [], 0
    for m in re.finditer(r"\\\$|`[^`]+`|\$[^$]+\$", text):
        out.append(html.escape(text[pos:m.start()]))
        tok = m.group(0)
        if tok == "\\$":
            out.append("$")
        elif tok.startswith("`"):
            out.append("<code>" + html.escape(tok[1:-1]) + "</code>")
        else:
            out.append('<span class="arithmatex">\\(' + html.escape(tok[1:-1]) + "\\)</span>")
        pos = m.end()
    out.append(html.escape(text[pos:]))
    return "".join(out)


def render_item(bank_id: str, number: int, item: Item, lang: str = "en") -> str:
    w = QUIZ_WORDS[lang]
    qid = f"q-{bank_id}-{item.id}"
    attrs = f'class="mm-item" id="{qid}" data-item="{html.escape(item.id)}" data-type="{item.type}" novalidate'
    parts = []
    if item.type == "numeric":
        attrs += (f' data-answer="{item.answer!r}" data-tolerance="{item.tolerance!r}" data-sig="{item.sig}"'
                  f' data-explain="{html.escape(inline(item.explain))}" data-unit="{html.escape(item.unit)}"'
                  f' data-hint="{html.escape(item.hint)}"')
        unit = f" ({html.escape(item.unit)})" if item.unit else ""
        parts.append(f'<div class="mm-numeric"><label for="{qid}-in">{w["answer"]}{unit}</label> '
                     f'<input type="text" inputmode="decimal" autocomplete="off" id="{qid}-in" name="{qid}"></div>')
    else:
        key = ",".join(str(i) for i, c in enumerate(item.choices) if c.correct)
        attrs += f' data-key="{key}"'
        kind = "radio" if item.type == "single" else "checkbox"
        for i, c in enumerate(item.choices):
            parts.append(f'<div class="mm-choice"><input type="{kind}" id="{qid}-{i}" name="{qid}" value="{i}" '
                         f'data-explain="{html.escape(inline(c.explain))}"> '
                         f'<label for="{qid}-{i}">{inline(c.text)}</label></div>')
    hint = f" <span class=\"mm-hint\">{w['all']}</span>" if item.type == "multiple" else ""
    return (f"<form {attrs}><fieldset><legend><span class=\"mm-qnum\">{w['question'].format(n=number)}</span> "
            f"{inline(item.prompt)}{hint}</legend>{''.join(parts)}</fieldset>"
            f'<button type="submit" class="md-button mm-check">{w["check"]}</button>'
            f'<div class="mm-feedback" role="status" aria-live="polite"></div></form>')


def render_quiz(bank_id: str, bank: Bank, lang: str = "en") -> str:
    """The quiz in `lang` (the bank's language); ``lang`` on the box tells quiz.js which words to use."""
    w = QUIZ_WORDS[lang]
    items = "".join(render_item(bank_id, i + 1, it, lang) for i, it in enumerate(bank.items))
    return (f'<div class="mm-quiz" lang="{lang}" data-bank="{bank_id}" data-count="{len(bank.items)}">'
            f'<p class="mm-progress" aria-live="polite">{w["count"].format(n=len(bank.items))}</p>{items}'
            f'<button type="button" class="md-button mm-reset">{w["reset"]}</button></div>')


def check_bank(bank: Bank) -> None:
    """Every numeric item with a formula must grade its own recomputed value as correct."""
    for it in bank.items:
        if it.parametric:
            raise PluginError(f"{bank.path}: item {it.id!r} is a template; practice items have fixed numbers")
        if it.type == "numeric" and it.formula:
            value = evaluate(it.formula)
            if not grade(it, value).correct:
                raise PluginError(f"{bank.path}: item {it.id!r}: answer {it.answer} but formula "
                                  f"{it.formula!r} gives {value}")


# ----------------------------------------------------------------------------------------------
# Hooks

def _root(config) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def on_page_markdown(markdown: str, page, config, files) -> str:
    prefix = "../" * page.url.count("/")  # from the page's URL back to the site root (/nl/ pages too)
    lang = page_language(page)

    def replace(m: re.Match) -> str:
        body = m.group(1)
        if mm := NUM.match(body):
            try:
                return format_number(evaluate(mm.group(1)), mm.group(2), lang)
            except Exception as e:  # noqa: BLE001 - report any formula error as a build error
                raise PluginError(f"{page.file.src_path}: num({mm.group(1)!r}) failed: {e}") from e
        if mm := FIGURE.match(body):
            name, caption = mm.groups()
            from minimega.figures.plots import FIGURES
            if name not in FIGURES:
                raise PluginError(f"{page.file.src_path}: unknown figure {name!r}; have {sorted(FIGURES)}")
            from minimega.figures.summary import summarize
            # the chart's numbers in words under it (WCAG 1.1.1), from the same figure object it is drawn from
            summary = summarize(built_figure(name, lang), lang)
            # data-src: figures.js loads the frame when it comes near the screen (a chart's plotly costs ~0.9 s
            # of a phone's CPU in Lighthouse; loading="lazy" started frames far below the screen); a tab stop once it
            # has loaded (the Tab key never lands in a half-loaded page, where no focus ring can show)
            src = f"{prefix}{figure_path(name, lang)}"
            return (f'<figure class="mm-figure" id="fig-{name}"><iframe data-src="{src}" tabindex="-1" '
                    f'title="{html.escape(caption)}" aria-describedby="fig-{name}-summary"></iframe>'
                    f'<noscript><a href="{src}">{html.escape(caption)}</a></noscript>'
                    f'<p class="mm-figure-summary" id="fig-{name}-summary">{html.escape(summary)}</p>'
                    f"<figcaption>{html.escape(caption)}</figcaption></figure>")
        if QUIZ.match(body):
            stem = page_stem(page.file.src_path)
            path = _root(config) / "quizzes" / f"{stem}.yaml"
            if not path.exists():
                raise PluginError(f"{page.file.src_path}: quiz() but no bank {path}")
            try:
                bank = load_bank(path, lang)
            except Exception as e:  # noqa: BLE001 - a missing or broken twin names itself
                raise PluginError(f"{page.file.src_path}: the {lang} quiz bank for {path.name} failed: {e}") from e
            check_bank(bank)
            return render_quiz(stem, bank, lang)
        if EXAM_PAGE.match(body):
            return exam_page(_root(config), config, lang)
        if PRESETS.match(body):
            # goes inside <script type="application/json">, where entities are not decoded
            return json.dumps(est.PRESETS, sort_keys=True).replace("</", "<\\/")
        if PALETTE.match(body):
            from minimega.figures.palette import palette_json
            return palette_json(lang).replace("</", "<\\/")      # as presets_json: inside a JSON <script>
        raise PluginError(f"{page.file.src_path}: cannot parse the macro call {{{{{body}}}}}")

    return MACRO.sub(replace, markdown)


def chapter_titles(root: Path, config, lang: str = "en") -> dict[str, str]:
    """Chapter number -> the title its page's H1 gives ("3. ZeRO stages 1, 2 and 3" -> "ZeRO stages 1, 2 and 3").

    Another `lang` reads the H1 of each chapter's twin (``03-zero.nl.md``); where the twin is
    missing, the title of the chapter's quiz bank in that language (``quizzes/nl/03-zero.yaml``)."""
    import yaml

    out = {}
    for page in sorted((root / config["docs_dir"]).glob("[0-9][0-9]-*.md")):
        if page.name.count(".") > 1:
            continue                                   # a twin; read below in place of its English page
        twin = page.with_suffix(f".{lang}.md")
        bank = root / "quizzes" / lang / f"{page.stem}.yaml"
        if lang != "en" and twin.is_file():
            page = twin
        elif lang != "en" and bank.is_file():
            title = (yaml.safe_load(bank.read_text(encoding="utf-8")) or {}).get("title")
            if isinstance(title, str) and title.strip():
                out[str(int(page.name[:2]))] = title.strip()
                continue
        for line in page.read_text(encoding="utf-8").splitlines():
            if m := re.match(r"#\s+(\d+)\.\s+(.+?)\s*(\{.*\})?\s*$", line):
                out[str(int(m.group(1)))] = m.group(2)
                break
    return out


def exam_page(root: Path, config, lang: str = "en") -> str:
    """The exam page's markup in `lang`: rules from the service's defaults, the site's chapter
    titles, the form (``static/exam-body.html``, or its twin ``exam-body.nl.html``).

    Only counts the exam banks (files in quizzes/exam); nothing of their content reaches the site.
    """
    from minimega.classroom.exam import rules_text
    from minimega.classroom.settings import ClassroomConfig

    n_chapters = len(list((root / "quizzes" / "exam").glob("[0-9][0-9]-*.yaml")))
    rules = rules_text(ClassroomConfig(), n_chapters, lang)
    titles = html.escape(json.dumps(chapter_titles(root, config, lang), ensure_ascii=False), quote=True)
    name = "exam-body.html" if lang == "en" else f"exam-body.{lang}.html"
    if not (STATIC / name).is_file():
        raise PluginError(f"exam_page() on a {lang} page but no {STATIC / name}")
    body = (STATIC / name).read_text(encoding="utf-8").replace("{{rules}}", html.escape(rules))
    return body.replace('<div id="mm-exam" class="mm-exam">',
                        f'<div id="mm-exam" class="mm-exam" data-chapters="{titles}">', 1)


BARE_TABLE = re.compile(r"<table>(.*?)</table>", re.S)


def on_page_content(output: str, page, config, files) -> str:
    """Put each table without a class in material's scrolling box (``md-typeset__scrollwrap``), as material's
    script bundle did in the browser: a wide table scrolls inside the page instead of widening it. Done here,
    once, the page starts without moving its tables (overrides/main.html leaves that bundle out)."""
    return BARE_TABLE.sub(lambda m: '<div class="md-typeset__scrollwrap"><div class="md-typeset__table">'
                                    f'<table>{m.group(1)}</table></div></div>', output)


HEAD_ALTERNATE = re.compile(r'[ \t]*<link rel="alternate" href="[^"]*" hreflang="[a-z-]+">\n?')


def on_post_page(output: str, page, config) -> str:
    """Drop the head's ``<link rel="alternate" hreflang>``: mkdocs-static-i18n points each language's at the page
    itself, which says the wrong thing (and material's bundle, when it was loaded, fetched ``<link>/sitemap.xml``
    from each). sitemap.xml declares the right alternates (``xhtml:link hreflang``) for search engines; the
    header's switcher is untouched."""
    return HEAD_ALTERNATE.sub("", output)


STATIC = Path(__file__).parent / "static"
PLOTLY_JS = "assets/vendor/plotly/plotly-basic.min.js"


def on_files(files, config):
    """Serve the lab notebooks from the site: ``labs/NN-slug.ipynb``, copied as static files."""
    from mkdocs.structure.files import File

    root = Path(config["config_file_path"]).parent
    for notebook in sorted((root / "labs").glob("[0-9][0-9]-*.ipynb")):
        files.append(File(f"labs/{notebook.name}", str(root), config["site_dir"], config["use_directory_urls"]))
    for asset in ("exam.js", "exam.css"):       # one source for the course page and the bare service page
        files.append(File.generated(config, f"assets/exam/{asset}", abs_src_path=str(STATIC / asset)))
    return files


# The languages every figure is written in (the site's languages): English at the root of
# assets/figures/, each other language in a folder of its own, so a page embeds the figure in its language.
FIGURE_LANGUAGES = ("en", "nl")


@functools.lru_cache(maxsize=None)
def built_figure(name: str, lang: str):
    """Figure `name` in `lang`, built once per build: the page's summary and the figure's own page read one object."""
    from minimega.figures import plots
    return plots.FIGURES[name](lang=lang)


def figure_path(name: str, lang: str = "en") -> str:
    """Where figure `name` in `lang` lies in the built site, from the site root."""
    if lang not in FIGURE_LANGUAGES:
        raise PluginError(f"figure {name!r}: no figures in language {lang!r}; have {', '.join(FIGURE_LANGUAGES)}")
    return f"assets/figures/{name}.html" if lang == "en" else f"assets/figures/{lang}/{name}.html"


def building_language(config) -> str:
    """The language mkdocs-static-i18n is building now ("en" without the plugin)."""
    plugin = config["plugins"].get("i18n")
    return getattr(plugin, "current_language", None) or "en"


def on_post_build(config) -> None:
    from minimega.figures import plots
    from minimega.classroom import trust

    if building_language(config) != "en":
        return                     # the /nl/ build shares the root's figures, vendor files and pins
    site = Path(config["site_dir"])
    try:
        trust.write_site_files(site)          # the verify page's pinned issuers and JSON-LD contexts
    except trust.TrustError as err:
        raise PluginError(str(err)) from err
    if not (site / PLOTLY_JS).exists():
        raise PluginError(f"{PLOTLY_JS} is missing from the built site (see course/assets/vendor/README.md)")
    for lang in FIGURE_LANGUAGES:
        for name in plots.FIGURES:
            path = figure_path(name, lang)
            plotly_src = "../" * (path.count("/") - 1) + PLOTLY_JS.removeprefix("assets/")   # from the figure's folder
            fig = built_figure(name, lang)
            title = (fig.layout.meta or {}).get("title") or fig.layout.title.text or name
            (site / path).parent.mkdir(parents=True, exist_ok=True)
            (site / path).write_text(plots.figure_html(fig, f"fig-{name}-plot", plotly_src, title, lang),
                                     encoding="utf-8")
