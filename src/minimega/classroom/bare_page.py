"""The exam page a service serves when no course site is built: ``/exam/`` in English, ``/nl/exam/`` in Dutch.

The built site holds the exam at the same two paths (mkdocs-static-i18n puts Dutch under ``/nl/``), so a
learner, a bookmark or a mailed sign-in link (`Exam.request_signin`) finds it in the same place either
way. The language comes from the path alone, as on the site: the page sets ``<html lang>``, and
``exam.js`` starts the attempt in that language. Each page is the form of the site's exam page
(``static/exam-body.html`` or its twin ``exam-body.nl.html``) with the rules of this service's
configuration, inside a plain HTML shell (``static/bare-page.html``).
"""
from __future__ import annotations

import html
from importlib import resources

from .exam import rules_text
from .settings import ClassroomConfig

# The shell's words, per language: its heading is the site's exam page's title in that language.
WORDS = {
    "en": {"title": "minimega · graded exam", "heading": "Graded exam",
           "note": "This service has no course site built (run <code>mkdocs build</code>); the course page holds "
                   "the same exam.",
           "switch": "English"},
    "nl": {"title": "minimega · examen met certificaat", "heading": "Examen met certificaat",
           "note": "Deze service heeft geen cursussite gebouwd (draai <code>mkdocs build</code>); de cursuspagina "
                   "bevat hetzelfde examen.",
           "switch": "Nederlands"},
}


def exam_path(lang: str) -> str:
    """Where the exam page in `lang` lives, on the built site as on the bare service."""
    return "/exam/" if lang == "en" else f"/{lang}/exam/"


def bare_exam_pages(config: ClassroomConfig, languages: list[str], n_chapters: int) -> dict[str, str]:
    """{path: page} for each language the exam is offered in; a language with no words here is refused by name."""
    missing = [lang for lang in languages if lang not in WORDS]
    if missing:
        raise ValueError(f"the bare exam page has no words for {missing}; it has {sorted(WORDS)} "
                         "(add them to minimega.classroom.bare_page.WORDS)")
    static = resources.files(__package__).joinpath("static")
    shell = static.joinpath("bare-page.html").read_text(encoding="utf-8")
    pages = {}
    for lang in languages:
        name = "exam-body.html" if lang == "en" else f"exam-body.{lang}.html"
        body = static.joinpath(name).read_text(encoding="utf-8")
        body = body.replace("{{rules}}", html.escape(rules_text(config, n_chapters, lang)))
        switch = " · ".join(f'<a href="{exam_path(other)}" hreflang="{other}" lang="{other}">'
                            f'{WORDS[other]["switch"]}</a>' for other in languages if other != lang)
        w = WORDS[lang]
        page = shell
        for key, value in (("lang", lang), ("title", html.escape(w["title"])), ("heading", html.escape(w["heading"])),
                           ("note", w["note"]), ("switch", switch), ("body", body)):
            page = page.replace("{{" + key + "}}", value)
        pages[exam_path(lang)] = page
    return pages
