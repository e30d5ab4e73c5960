"""Code excerpts that carry the idea: in every course page (English and Dutch), each excerpt shown at the margin (not
folded in a `???` box) is 15 lines or fewer and carries no docstring; the whole function, docstring included, sits in
a fold. A function's signature and body are joined around its docstring by snippet markers in the source
(`--8<-- "file:a+b"`, which the site hook turns into line ranges). Each chapter ends Takeaway, Worked problems, Quiz,
Lab (chapter 10's watchdog, health, straggler and async-save sections come before its Takeaway)."""
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "course").glob("*.md"))
INCLUDE = re.compile(r'^(\s*)--8<-- "([^":]+):([A-Za-z0-9_+]+)"\s*$')


def _hook():
    spec = importlib.util.spec_from_file_location("learner_hook", ROOT / "tools" / "learner_hook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = _hook()


def shown_excerpts(page: Path):
    """(line, path, sections) of every include at the margin, i.e. not inside an indented `???` fold."""
    out, fold = [], False
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("???"):
            fold = True
        elif line.strip() and not line.startswith((" ", "\t")):
            fold = False
        m = INCLUDE.match(line)
        if m and not (fold and m.group(1)):
            out.append((n, m.group(2), m.group(3)))
    return out


def test_every_shown_excerpt_is_short_and_without_docstring():
    shown, bad = 0, []
    for page in PAGES:
        for n, path, sections in shown_excerpts(page):
            lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
            code = [lines[i] for i in hook.section_lines(path, sections)]
            while code and not code[-1].strip():
                code.pop()
            shown += 1
            if len(code) > 15 or any('"""' in c or "'''" in c for c in code):
                bad.append(f"{page.name}:{n} {path}:{sections} ({len(code)} lines)")
    assert shown >= 100 and not bad, bad


def test_joined_sections_keep_their_indentation(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('class A:\n    # --8<-- [start:f_c1]\n    def f(self):\n    # --8<-- [end:f_c1]\n'
                   '        """Doc."""\n        # --8<-- [start:f_c2]\n        return 1\n        # --8<-- [end:f_c2]\n')
    md = hook.join_sections('```python\n--8<-- "m.py:f_c1+f_c2"\n```', root=tmp_path)
    assert md == '```python\n--8<-- "m.py:3:3,7:7"\n```'      # one include: snippets dedents the two lines as one
    lines = src.read_text().splitlines()
    assert [lines[2], lines[6]] == ["    def f(self):", "        return 1"]


def test_each_chapter_ends_takeaway_worked_problems_quiz_lab():
    for page in PAGES:
        if not re.match(r"\d\d-", page.name):
            continue
        ids = re.findall(r"^## .*\{ #([a-z0-9-]+) \}$", page.read_text(encoding="utf-8"), flags=re.M)
        assert ids[-4:] == ["takeaway", "worked-problems", "quiz", "lab"], (page.name, ids)
