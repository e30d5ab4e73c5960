"""The learner's path in the built site's files (one session build, tests/site_support.py): Start here with its
time per chapter, the glossary and further reading, the animations in both editions, search per language,
the labs' zips and their README, and the practice banks' wording."""
import html
import json
import math
import re
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from minimega.figures import animations as fa

ROOT = Path(__file__).resolve().parents[1]


def _load_hook():
    import importlib.util
    spec = importlib.util.spec_from_file_location("learner_hook", ROOT / "tools" / "learner_hook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = _load_hook()
COURSE = ROOT / "course"
CHAPTERS = sorted(p.stem for p in COURSE.glob("[0-9][0-9]-*.md") if p.name.count(".") == 1)
LABS = [c for c in CHAPTERS if (ROOT / "labs" / f"{c}.ipynb").exists()]     # every chapter but the capstone
ANIMATIONS = fa.CHAPTERS                     # every chapter's picture, in both editions


@pytest.fixture(scope="module")
def site(site_build):
    return site_build.out


class _Ids(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        if dict(attrs).get("id"):
            self.ids.add(dict(attrs)["id"])


def _ids(path: Path) -> set[str]:
    p = _Ids()
    p.feed(path.read_text(encoding="utf-8"))
    return p.ids


def test_time_per_chapter_is_words_problems_quiz_and_lab():
    times = {c["slug"]: c for c in hook.chapter_times()}
    assert sorted(times) == CHAPTERS
    run = json.loads((ROOT / "labs" / "run-times.json").read_text())["seconds"]
    assert sorted(run) == LABS and len(LABS) == len(CHAPTERS) - 1, "tools/time_labs.py has not timed every lab"
    assert times["17-capstone"]["lab_seconds"] is None                 # no notebook: no lab time, no exercise
    c = times["03-zero"]                                             # one chapter recomputed by hand
    md = (COURSE / "03-zero.md").read_text(encoding="utf-8")
    shown = re.findall(r'^--8<-- "([^":]+):([a-z0-9_+]+)"$', md, flags=re.M)    # code at the margin is read too
    assert any(path == "src/minimega/zero/flat.py" and "shard_bounds_c1" in name for path, name in shown)
    code = []
    for path, names in shown:                  # "a+b": sections joined around a docstring
        text = (ROOT / path).read_text(encoding="utf-8")
        for name in names.split("+"):
            body = text.split(f"# --8<-- [start:{name}]")[1].split(f"# --8<-- [end:{name}]")[0]
            code.append("\n".join(line for line in body.splitlines() if "--8<--" not in line))
    prose = re.sub(r'^--8<-- "[^"]+"$', " ", md, flags=re.M)
    words = len(re.findall(r"[\wΨ]+", re.sub(r"^---.*?---", " ", re.sub(r"\{\{.*?\}\}", " ", prose, flags=re.S),
                                              flags=re.S))) + sum(len(re.findall(r"[\wΨ]+", c)) for c in code)
    items = len(yaml.safe_load((ROOT / "quizzes" / "03-zero.yaml").read_text())["items"])
    assert (c["words"], c["problems"], c["quiz"], c["lab_seconds"]) == (words, 4, items, run["03-zero"])
    assert c["minutes"] == 5 * math.ceil((words / 200 + 4 * 5 + items + run["03-zero"] / 60 + 10) / 5)
    assert all(30 <= t["minutes"] <= 180 for t in times.values()), times


@pytest.mark.parametrize("lang", ["en", "nl"])
def test_start_here_page(site, lang):
    page = (site / ("nl/" if lang == "nl" else "") / "start-here" / "index.html").read_text(encoding="utf-8")
    total = sum(c["minutes"] for c in hook.chapter_times())
    assert f"{total // 60} h {total % 60:02d}" in page
    for c in hook.chapter_times():
        assert f'href="../{c["slug"]}/"' in page and f"{c['minutes']} min" in page
    for anchor in ("prerequisites", "time", "paths", "begin"):
        assert f'id="{anchor}"' in page
    text = re.sub(r"<[^>]+>", "", page)
    assert "make serve" in text and "make lab" in text
    home = (site / ("nl/" if lang == "nl" else "") / "index.html").read_text(encoding="utf-8")
    assert 'href="start-here/"' in home and 'class="mm-progress-summary"' in home
    assert home.count("<li data-bank=") == len(CHAPTERS)


@pytest.mark.parametrize("lang", ["en", "nl"])
def test_glossary_terms_link_to_where_their_chapter_uses_them(site, lang):
    src = (COURSE / ("glossary.nl.md" if lang == "nl" else "glossary.md")).read_text(encoding="utf-8")
    entries = re.findall(r"^- \*\*(.+?)\*\*: .*\]\((\d\d-[a-z0-9-]+)\.md#([a-z0-9-]+)\)\)$", src, flags=re.M)
    assert len(entries) >= 45
    base = site / ("nl" if lang == "nl" else "")
    for term, slug, anchor in entries:
        assert anchor in _ids(base / slug / "index.html"), f"{term}: #{anchor} not on {slug}"
        chapter = (COURSE / f"{slug}.md").read_text(encoding="utf-8").lower().replace("`", "")
        core = re.sub(r"\s*\(.*\)$", "", term).lower()                # "Tensor parallelism (tp)" -> "tensor parallelism"
        words = [core] + ([core.rstrip("s")] if core.endswith("s") else [])
        assert any(w in chapter for w in words), f"glossary term {term!r} is not used in {slug}"
    en = re.findall(r"\]\((\d\d-[a-z0-9-]+\.md#[a-z0-9-]+)\)\)$", (COURSE / "glossary.md").read_text(), flags=re.M)
    assert re.findall(r"\]\((\d\d-[a-z0-9-]+\.md#[a-z0-9-]+)\)\)$", src, flags=re.M) == en   # same order, twins


@pytest.mark.parametrize("lang", ["en", "nl"])
def test_further_reading_cites_sources_for_every_chapter(lang):
    src = (COURSE / ("reading.nl.md" if lang == "nl" else "reading.md")).read_text(encoding="utf-8")
    sections = re.split(r"^## ", src, flags=re.M)[1:]
    assert [int(s.split(".")[0]) for s in sections] == list(range(1, len(CHAPTERS) + 1))
    for s in sections:
        refs = re.findall(r"^- (.+)$", s, flags=re.M)
        assert len(refs) >= 2, s[:60]
        for ref in refs:                                # each names a paper with an id, a venue, or a doc page
            assert re.search(r"arXiv:\d{4}\.\d{4,5}|\d{4}|https://", ref), ref
    for slug in CHAPTERS:                               # and each chapter links its section
        page = (COURSE / (f"{slug}.nl.md" if lang == "nl" else f"{slug}.md")).read_text(encoding="utf-8")
        assert f"(reading.md#ch{slug[:2]})" in page, slug


def _notes(ref: str) -> str:
    """A reference line without what stays in the source's language: titles, links, quoted section names."""
    return re.sub(r"\*[^*]+\*|\[[^\]]*\]\([^)]*\)|\"[^\"]*\"|`[^`]*`", " ", ref)


def test_dutch_further_reading_writes_its_notes_in_dutch():
    refs = {lang: re.findall(r"^- (.+)$", (COURSE / name).read_text(encoding="utf-8"), flags=re.M)
            for lang, name in (("en", "reading.md"), ("nl", "reading.nl.md"))}
    assert len(refs["en"]) == len(refs["nl"])
    english = re.compile(r"\b(the|and|where|this|inside|with|documentation|friends|writes|builds|per layer)\b")
    assert english.search(_notes(" ".join(refs["en"])))                  # the check sees the English notes
    for en, nl in zip(refs["en"], refs["nl"]):
        assert not english.search(_notes(nl)), nl
        if english.search(_notes(en)):
            assert _notes(nl) != _notes(en), nl


@pytest.mark.parametrize("lang", ["en", "nl"])
def test_animations_are_on_their_chapters(site, lang):
    for slug, names in ANIMATIONS.items():
        page = (site / ("nl" if lang == "nl" else "") / slug / "index.html").read_text(encoding="utf-8")
        for name in names:
            m = re.search(rf'<div class="mm-anim" id="anim-{name}" lang="{lang}"[^>]*data-frames="([^"]+)">'
                          r'<details class="mm-anim-text"><summary>[^<]+</summary><ol>(.*?)</ol>', page)
            assert m, (slug, name)
            frames = json.loads(html.unescape(m.group(1)))["frames"]      # the text alternative: every caption
            assert m.group(2).count("<li>") == len(frames) and html.escape(frames[-1]["caption"]) in m.group(2)
        assert 'id="picture"' in page


def test_search_index_per_language(site):
    en = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))["docs"]
    nl = json.loads((site / "nl" / "search" / "search_index.json").read_text(encoding="utf-8"))["docs"]
    assert en and nl
    assert not any(d["location"].startswith("nl/") for d in en)
    assert all(d["location"].startswith("nl/") for d in nl)
    for docs in (en, nl):                                          # no section without its page
        pages = {d["location"] for d in docs if "#" not in d["location"]}
        assert all(d["location"].split("#")[0] in pages for d in docs)
    assert any(d["location"] == "nl/03-zero/" for d in nl) and any(d["location"] == "03-zero/" for d in en)


def _imports(notebook: Path) -> tuple[set[str], set[str]]:
    code = "\n".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code")
    local = {m for m in re.findall(r"^\s*import (\w+)", code, flags=re.M) if (ROOT / "labs" / f"{m}.py").exists()}
    return local, set(re.findall(r'checks\.exercise\("(\w+)"\)', code))


@pytest.mark.parametrize("slug", LABS)
def test_lab_zip_runs_on_its_own(site, slug):
    path = site / "labs" / f"{slug}.zip"
    names = set(zipfile.ZipFile(path).namelist())
    local, exercises = _imports(ROOT / "labs" / f"{slug}.ipynb")
    need = {f"{slug}/{slug}.ipynb", f"{slug}/HOW-TO-RUN.txt"} | {f"{slug}/{m}.py" for m in local}
    need |= {f"{slug}/exercises/{e}.py" for e in exercises} | {f"{slug}/solutions/{e}.py" for e in exercises}
    assert need <= names, need - names
    helpers = {f"{slug}/{m}" for m in ("workers.py", "checks.py", "figures.py")}   # what the imports import in turn
    assert helpers <= names
    how = zipfile.ZipFile(path).read(f"{slug}/HOW-TO-RUN.txt").decode()
    assert "make lab" in how and f"jupyter lab {slug}.ipynb" in how
    for lang in ("", "nl/"):
        page = (site / lang / slug / "index.html").read_text(encoding="utf-8")
        assert re.search(rf'<a download="{slug}\.zip" href="(\.\./)+labs/{slug}\.zip">', page), \
            f"{lang}{slug}: link the lab's zip"


def test_labs_readme_lists_every_lab():
    readme = (ROOT / "labs" / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `(\d\d-[a-z0-9-]+)\.ipynb` \|", readme, flags=re.M)
    assert listed == LABS
    assert sorted(p.stem for p in (ROOT / "labs").glob("[0-9][0-9]-*.ipynb")) == LABS


def test_practice_banks_state_one_rounding_and_write_psi():
    for path in sorted((ROOT / "quizzes").glob("[0-9][0-9]-*.yaml")) + sorted((ROOT / "quizzes" / "nl").glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\bPsi\b", text), f"{path}: write Ψ, not Psi"
        for q in re.findall(r'question: "?(.*?)"?$', text, flags=re.M):   # the precision note is the only rounding rule
            assert not re.search(r"\((?:to )?(?:one|two|three|four|\d) decimal|whole number\)|decima(?:al|len)\)|"
                                 r"geheel getal\)", q), (path.name, q)
    from minimega.classroom.quiz import load_bank
    q3 = load_bank(ROOT / "quizzes" / "03-zero.yaml").items[2]
    assert q3.prompt.count("significant figures") == 1 and "Ψ" in q3.prompt and "decimal" not in q3.prompt


def _sig_digits(value: float) -> str:
    """The significant digits of `value` as written to 6 figures: 2868.9 -> '28689', 120 -> '12', 0.2727 -> '2727'."""
    return re.sub(r"\D", "", f"{abs(value):.6g}".split("e")[0]).strip("0")


def _leaks(hint: str, answer: float) -> list[str]:
    """The numbers in `hint` that carry the answer's first three significant digits, truncated or rounded."""
    if len(_sig_digits(answer)) < 3:
        return []
    rounded = f"{abs(answer):.3g}".split("e")[0]
    give_away = {_sig_digits(answer)[:3], re.sub(r"\D", "", rounded).lstrip("0")}
    numbers = re.findall(r"\d(?:[\d.,]*\d)?", hint)
    return [n for n in numbers if any(g in re.sub(r"\D", "", n).lstrip("0") for g in give_away)]


@pytest.mark.parametrize("lang", ["en", "nl"])
def test_every_practice_number_has_a_hint_that_keeps_the_answer(lang):
    """Numeric practice items teach before they tell (quiz.js shows data-hint after a first wrong answer): each has
    its own hint, in Dutch in the Dutch twin, that does not print the answer's leading digits, and the page carries it."""
    import html
    from minimega.classroom.quiz import load_bank
    from minimega.classroom.sitebuild import render_item
    numeric = 0
    for path in sorted((ROOT / "quizzes").glob("[0-9][0-9]-*.yaml")):
        en, bank = load_bank(path), load_bank(path, lang)
        for n, (e, item) in enumerate(zip(en.items, bank.items), 1):
            if item.type != "numeric":
                continue
            numeric += 1
            assert item.hint.strip(), f"{path.name} ({lang}): numeric item {item.id!r} needs a 'hint'"
            assert lang == "en" or item.hint != e.hint, f"{path.name}: {item.id!r} keeps the English hint"
            assert not _leaks(item.hint, item.answer), (path.name, lang, item.id, _leaks(item.hint, item.answer))
            assert f'data-hint="{html.escape(item.hint)}"' in render_item(path.stem, n, item, lang)
    assert numeric >= 40


def test_the_hint_leak_check_can_fail():
    assert _leaks("about 2869 MB", 2868.9) == ["2869"] and _leaks("it is 2,868.9", 2868.9) == ["2,868.9"]
    assert _leaks("0.273 of the step", 0.2727) and _leaks("150 TFLOP/s", 149.8)
    assert not _leaks("(2 + 2 + 12) bytes", 120) and not _leaks("K = 12, divide by 10^9", 3413)
