"""mkdocs hook for the learner's path (listed in mkdocs.yml after minimega/classroom/sitebuild.py).

    {{ animation("zero-3") }}    a step-through animation (minimega.figures.animations), its frames
                                 computed at build time in the page's language; animate.js plays it
    {{ chapter_times() }}        the time-per-chapter table of the Start here page (`chapter_times`)
    {{ progress_summary() }}     the home page's quiz progress per chapter (progress.js fills it from the
                                 browser's store, in the page's language)
    {{ capstone_table("predictions") }}, {{ capstone_table("layouts") }}
                                 chapter 17's tables, from course/data/capstone.json (`minimega.figures.capstone`)
    {{ capstone("llama3-405b", "predicted.8k.mfu", ".1%") }}
                                 one number of that file, formatted in the page's language

Once both editions are written (after mkdocs-static-i18n's own post-build, which builds ``nl/`` and
merges the search index):

- search: the combined index is split per language, so the English site's search returns English
  pages and the Dutch site's Dutch pages (`split_search_index`); course/assets/javascripts/search.js
  fetches the index of the page's language;
- labs (`on_files`, every build): each chapter's lab is also served as ``labs/NN-slug.zip``, the notebook with what it imports
  (`lab_zip`), which the chapter's download link offers.
"""
from __future__ import annotations

import html
import io
import json
import re
import zipfile
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[1]
MACRO = re.compile(r'\{\{\s*(animation|chapter_times|progress_summary)\(\s*(?:"([a-z0-9-]+)")?\s*\)\s*\}\}')
CAPSTONE = re.compile(r'\{\{\s*capstone_table\(\s*"([a-z]+)"\s*\)\s*\}\}'
                      r'|\{\{\s*capstone\(\s*"([a-z0-9-]+)"\s*,\s*"([a-z0-9_.]+)"\s*(?:,\s*"([^"]*)"\s*)?\)\s*\}\}')

WORDS_PER_MINUTE = 200        # a careful technical reading pace (the page's prose, code and formulas)
PROBLEM_MINUTES = 5           # per worked problem, done on paper before opening the answer
QUIZ_ITEM_MINUTES = 1         # per quiz question

CONTROLS = {
    "en": {"play": "Play", "pause": "Pause", "back": "Step back", "forward": "Step forward", "first": "First frame",
           "frame": "Frame", "of": "of", "keys": "Keys: ← → step, space plays or pauses, Home goes to the start.",
           "steps": "Every step as text"},
    "nl": {"play": "Afspelen", "pause": "Pauzeren", "back": "Stap terug", "forward": "Stap vooruit",
           "first": "Eerste beeld", "frame": "Beeld", "of": "van",
           "keys": "Toetsen: ← → stap, spatie speelt af of pauzeert, Home gaat naar het begin.",
           "steps": "Elke stap als tekst"},
}


def _lang(page) -> str:
    return getattr(page.file, "locale", None) or "en"


def animation_html(name: str, lang: str) -> str:
    from minimega.figures.animations import animation
    import minimega.tools.export_flow  # noqa: F401  (chapter 14's picture runs the exporters: the tools layer)
    try:
        data = animation(name, lang)
    except KeyError as err:
        raise PluginError(str(err)) from err
    words = json.dumps(CONTROLS[lang], ensure_ascii=False)
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    # The text alternative: every frame's caption (and meter) in order, readable without the script.
    items = "".join(f"<li>{html.escape(f['caption'])}"
                    + (f" ({html.escape(data['meter_label'])}: {html.escape(f['meter']['text'])})" if f.get("meter") else "")
                    + "</li>" for f in data["frames"])
    steps = (f'<details class="mm-anim-text"><summary>{html.escape(CONTROLS[lang]["steps"])}: '
             f'{html.escape(data["title"])}</summary><ol>{items}</ol></details>')
    # The frames travel in an attribute, as data: animate.js reads them, no script in the page runs them.
    return (f'<div class="mm-anim" id="anim-{name}" lang="{lang}" data-anim="{name}" data-words="{html.escape(words)}" '
            f'data-frames="{html.escape(payload)}">{steps}</div>')


# ----------------------------------------------------------------------------------------------
# Time per chapter

INCLUDE = re.compile(r'^--8<-- "([^":]+):([a-z0-9_+]+)"$', re.M)     # at the margin: shown, not folded
JOINED = re.compile(r'^([ \t]*)--8<-- "([^":]+):([a-z0-9_]+(?:\+[a-z0-9_]+)+)"[ \t]*$', re.M)


def section_lines(path: str, names: str, root: Path = ROOT) -> list[int]:
    """0-based numbers of the lines of section ``names`` of ``path``, marker lines left out; ``a+b`` joins sections
    (the code of a function around its docstring: markers that skip the docstring)."""
    lines = (root / path).read_text(encoding="utf-8").splitlines()
    out = []
    for name in names.split("+"):
        try:
            start = next(i for i, line in enumerate(lines) if f"--8<-- [start:{name}]" in line)
            end = next(i for i in range(start + 1, len(lines)) if f"--8<-- [end:{name}]" in lines[i])
        except StopIteration:
            raise PluginError(f'snippet section "{path}:{name}" has no start or end marker') from None
        out += [i for i in range(start + 1, end) if "--8<--" not in lines[i]]
    return out


def _section(path: str, name: str, root: Path = ROOT) -> str:
    lines = (root / path).read_text(encoding="utf-8").splitlines()
    return "\n".join(lines[i] for i in section_lines(path, name, root))


def join_sections(markdown: str, root: Path = ROOT) -> str:
    """``--8<-- "file:a+b"`` as the line ranges of sections a and b (pymdownx.snippets dedents a include as one, so
    a function's signature and its body, split around the docstring, keep their indentation)."""
    def ranges(m: re.Match) -> str:
        spans, idx = [], section_lines(m.group(2), m.group(3), root)
        for i in idx:
            if spans and spans[-1][1] == i:
                spans[-1][1] = i + 1
            else:
                spans.append([i + 1, i + 1])
        return f'{m.group(1)}--8<-- "{m.group(2)}:{",".join(f"{a}:{b}" for a, b in spans)}"'
    return JOINED.sub(ranges, markdown)


def _words(markdown: str, root: Path = ROOT) -> int:
    """Words a reader reads: prose and formulas, and the code embedded at the margin (folded code is not counted)."""
    text = INCLUDE.sub(lambda m: _section(m.group(1), m.group(2), root), markdown)
    text = re.sub(r"\{\{.*?\}\}", " ", text, flags=re.S)                # macros
    text = re.sub(r"^---.*?---", " ", text, flags=re.S)               # front matter
    return len(re.findall(r"[\wΨ]+", text))


RUN_TIMES = ROOT / "labs" / "run-times.json"


def lab_seconds(slug: str, root: Path = ROOT) -> float | None:
    """The lab's measured run time (tools/time_labs.py writes labs/run-times.json), or None."""
    path = root / "labs" / "run-times.json"
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))["seconds"].get(slug)


def chapter_times(root: Path = ROOT) -> list[dict]:
    """Per chapter: words, reading minutes, worked problems, quiz items, lab run seconds, total minutes.

    reading = words / WORDS_PER_MINUTE; practice = PROBLEM_MINUTES per worked problem + QUIZ_ITEM_MINUTES
    per quiz question; lab = its measured run time (labs/run-times.json) plus 10 minutes for its exercise. Rounded up to 5 min."""
    import math

    import yaml
    out = []
    for page in sorted((root / "course").glob("[0-9][0-9]-*.md")):
        if page.name.count(".") > 1:
            continue
        md = page.read_text(encoding="utf-8")
        words = _words(md, root)
        problems = len(re.findall(r"^\*\*Problem \d+\.\*\*", md, flags=re.M))
        bank = root / "quizzes" / f"{page.stem}.yaml"
        items = len(yaml.safe_load(bank.read_text(encoding="utf-8"))["items"]) if bank.exists() else 0
        nb = root / "labs" / f"{page.stem}.ipynb"
        lab = lab_seconds(page.stem, root) if nb.exists() else None
        minutes = words / WORDS_PER_MINUTE + PROBLEM_MINUTES * problems + QUIZ_ITEM_MINUTES * items
        if nb.exists():
            minutes += (lab or 0) / 60 + 10
        out.append({"chapter": int(page.name[:2]), "slug": page.stem, "words": words, "problems": problems,
                    "quiz": items, "lab_seconds": lab, "minutes": 5 * math.ceil(minutes / 5)})
    return out


def chapter_times_table(lang: str) -> str:
    head = {"en": "| chapter | words | worked problems | quiz questions | lab run (measured) | about |\n"
                  "| --- | ---: | ---: | ---: | ---: | ---: |",
            "nl": "| hoofdstuk | woorden | uitgewerkte opgaven | quizvragen | lab (gemeten) | ongeveer |\n"
                  "| --- | ---: | ---: | ---: | ---: | ---: |"}[lang]
    rows = [head]
    for c in chapter_times():
        lab = "—" if c["lab_seconds"] is None else f"{c['lab_seconds']:.0f} s"
        link = f"{c['slug']}.md"
        rows.append(f"| [{c['chapter']}]({link}) | {c['words']:,} | {c['problems']} | {c['quiz']} | {lab} | "
                    f"{c['minutes']} min |".replace(",", "\u2009"))
    total = sum(c["minutes"] for c in chapter_times())
    rows.append(f"| | | | | | **{total // 60} h {total % 60:02d}** |")
    return "\n".join(rows)


PROGRESS_WORDS = {
    "en": {"title": "Your progress", "none": "No quiz answered yet in this browser.",
           "reset": "Reset all progress (both languages)"},
    "nl": {"title": "Je voortgang", "none": "Nog geen quizvraag beantwoord in deze browser.",
           "reset": "Alle voortgang wissen (beide talen)"},
}


def progress_summary(lang: str, root: Path = ROOT) -> str:
    """A list of every chapter's quiz (bank id, question count, title, link) for progress.js to fill."""
    import yaml
    w = PROGRESS_WORDS[lang]
    items = []
    for bank in sorted((root / "quizzes").glob("[0-9][0-9]-*.yaml")):
        twin = root / "quizzes" / lang / bank.name if lang != "en" else bank
        data = yaml.safe_load((twin if twin.exists() else bank).read_text(encoding="utf-8"))
        n = len(yaml.safe_load(bank.read_text(encoding="utf-8"))["items"])
        items.append(f'<li data-bank="{bank.stem}" data-count="{n}"><a href="{bank.stem}/">'
                     f'{html.escape(str(data["title"]))}</a> <span class="mm-progress-text"></span></li>')
    return (f'<div class="mm-progress-summary" lang="{lang}" markdown="0"><p><strong>{w["title"]}</strong> '
            f'<span class="mm-progress-total">{w["none"]}</span></p><ol>{"".join(items)}</ol>'
            f'<button type="button" class="md-button mm-progress-reset">{w["reset"]}</button></div>')


def on_page_markdown(markdown: str, page, config, files) -> str:
    lang = _lang(page)
    markdown = join_sections(markdown)

    def replace(m: re.Match) -> str:
        if m.group(1) == "animation":
            return animation_html(m.group(2), lang)
        if m.group(1) == "progress_summary":
            return progress_summary(lang)
        return chapter_times_table(lang)

    def capstone(m: re.Match) -> str:
        from minimega.figures import capstone as cap
        try:
            if m.group(1):
                return cap.table_markdown(m.group(1), lang)
            return cap.value(m.group(2), m.group(3), m.group(4) or ",.1f", lang)
        except (KeyError, ValueError, StopIteration) as e:
            raise PluginError(f"{page.file.src_path}: {m.group(0)} failed: {e!r}") from e
    return CAPSTONE.sub(capstone, MACRO.sub(replace, markdown))


QUIZ_BANK = re.compile(r'<div class="mm-quiz" lang="[a-z]+" data-bank="(\d\d-[^"]+)" data-count="(\d+)">')
CHAPTER_LINE = {"en": ("Your quiz progress in this chapter: 0 of {n} right (0 tried). ", "Go to the quiz"),
                "nl": ("Je quizvoortgang in dit hoofdstuk: 0 van {n} goed (0 geprobeerd). ", "Naar de quiz")}


def on_page_content(output: str, page, config, files) -> str:
    """A chapter with a quiz gets its progress line under its title here, as it reads before any answer;
    progress.js rewrites its numbers from the browser's store. Written in the page, the line is there before the
    page is first shown, so nothing below the title moves when the script runs."""
    m = QUIZ_BANK.search(output)
    if not m or "</h1>" not in output:
        return output
    text, go = CHAPTER_LINE.get(_lang(page), CHAPTER_LINE["en"])
    line = (f'<p class="mm-chapter-progress mm-progress-summary">{html.escape(text.format(n=m.group(2)))}'
            f'<a href="#quiz">{go}</a></p>')
    return output.replace("</h1>", "</h1>\n" + line, 1)


# ----------------------------------------------------------------------------------------------
# Search per language

def split_search_index(site: Path, langs=("nl",)) -> dict[str, int]:
    """Keep the English pages in ``search/search_index.json``; write each other language's pages
    (locations ``nl/…``, relative to the site root as before) to ``nl/search/search_index.json``."""
    path = site / "search" / "search_index.json"
    index = json.loads(path.read_text(encoding="utf-8"))
    counts = {}
    def whole(docs):
        """Drop sections whose page is not in the list (mkdocs-static-i18n's dedup drops a fallback page
        that repeats the English one, and material would link its sections to "undefined")."""
        pages = {d["location"] for d in docs if "#" not in d["location"]}
        return [d for d in docs if d["location"].split("#")[0] in pages]

    for lang in langs:
        docs = whole([d for d in index["docs"] if d["location"].startswith(f"{lang}/")])
        (site / lang / "search").mkdir(parents=True, exist_ok=True)
        (site / lang / "search" / "search_index.json").write_text(
            json.dumps({**index, "docs": docs}, ensure_ascii=False), encoding="utf-8")
        counts[lang] = len(docs)
    english = whole([d for d in index["docs"] if not any(d["location"].startswith(f"{lang}/") for lang in langs)])
    path.write_text(json.dumps({**index, "docs": english}, ensure_ascii=False), encoding="utf-8")
    counts["en"] = len(english)
    return counts


# ----------------------------------------------------------------------------------------------
# Lab zips

LAB_FILES = ("workers.py", "checks.py", "figures.py")
LAB_FOLDERS = ("exercises", "solutions")

HOW_TO_RUN = """{slug}: the lab of chapter {chapter} of the minimega course.

What is here: {slug}.ipynb (the notebook) and what it imports: workers.py (the functions the ranks run),
checks.py (the check cells' tests), figures.py (its plots), exercises/ (the pieces you complete) and
solutions/ (the reference answers the checks use when MINIMEGA_LAB_SOLUTIONS=1 is set).

How to run it. The notebook needs the minimega package, torch and JupyterLab:

  * from a clone of the minimega repository: `make lab` (it sets up .venv and opens JupyterLab on labs/);
  * or in any Python >= 3.10 environment where minimega is installed
    (`pip install -e "/path/to/minimega[lab]"`): unzip this folder and run
        jupyter lab {slug}.ipynb
    from inside it, so that `import workers` and `import checks` find the files beside the notebook.

Every job runs on CPU processes (gloo) in under a minute on 2 cores; no GPU is needed.
"""


def lab_zip(notebook: Path) -> bytes:
    labs = notebook.parent
    buf = io.BytesIO()
    slug = notebook.stem
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        def add(path: Path, arc: str):
            info = zipfile.ZipInfo(f"{slug}/{arc}", date_time=(2026, 1, 1, 0, 0, 0))   # reproducible
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, path.read_bytes())
        add(notebook, notebook.name)
        for name in LAB_FILES:
            add(labs / name, name)
        for folder in LAB_FOLDERS:
            for f in sorted((labs / folder).glob("*.py")):
                add(f, f"{folder}/{f.name}")
        info = zipfile.ZipInfo(f"{slug}/HOW-TO-RUN.txt", date_time=(2026, 1, 1, 0, 0, 0))
        z.writestr(info, HOW_TO_RUN.format(slug=slug, chapter=int(slug[:2])))
    return buf.getvalue()


@event_priority(-110)              # after mkdocs-static-i18n's (-100), which builds /nl/ and writes the merged index
def on_post_build(config) -> None:
    i18n = config["plugins"].get("i18n")
    if i18n is not None and getattr(i18n, "building", False):
        return                        # inside the Dutch build; the outer build finishes the site
    site = Path(config["site_dir"])
    split_search_index(site)


def on_files(files, config):
    """Each lab as ``labs/NN-slug.zip`` beside its notebook, so a chapter links it and ``--strict`` checks the link."""
    from mkdocs.structure.files import File
    out = ROOT / "build" / "lab-zips"            # written here first: mkdocs-static-i18n needs a source path
    out.mkdir(parents=True, exist_ok=True)
    for notebook in sorted((ROOT / "labs").glob("[0-9][0-9]-*.ipynb")):
        path = out / f"{notebook.stem}.zip"
        data = lab_zip(notebook)
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
        files.append(File.generated(config, f"labs/{notebook.stem}.zip", abs_src_path=str(path)))
    return files
