"""Coverage you can see: every section of every chapter is asked about by a practice item, every chapter of the
exam's blueprint has sample-exam items, the frontier topics are asked in both, and the map is printed."""
import re
from pathlib import Path

import pytest
import yaml

from minimega.classroom import coverage, quiz
from minimega.classroom.banks import CHAPTERS

ROOT = Path(__file__).resolve().parents[1]
PRACTICE, EXAM = ROOT / "quizzes", ROOT / "quizzes" / "exam"

TOPICS = {            # topic: (chapter, a heading anchor the item must cover, words its text must use)
    "FP8 scaling": (4, "fp8", r"fp8|e4m3|e5m2"),
    "Blackwell / NVL72": (13, "nvlink-domain", r"nvl72|gb200|b200|blackwell"),
    "NVMe offload": (5, "disk-tier", r"nvme"),
    "zero-bubble / DualPipe": (8, "zero-bubble", r"zb-h1|dualpipe|zero-bubble"),
    "dropless routing": (16, "dropless", r"dropless"),
    "router z-loss": (16, "dropless", r"z-loss"),
    "auxiliary-loss-free bias balancing": (16, "dropless", r"\bbias"),
    "shared experts": (16, "shared-experts", r"shared expert"),
    "goodput": (10, "async-save", r"goodput|young"),
    "rollback": (10, "health-rollback", r"roll(s|ed|ing)? ?back"),
}


def _banks():
    return quiz.load_banks(PRACTICE), quiz.load_banks(EXAM)


def _text(item):
    return " ".join([item.question, item.explain] + [f"{c.text} {c.explain}" for c in item.choices]).lower()


def test_every_section_is_asked_and_every_chapter_examined():
    practice, exam = _banks()
    print("\n" + coverage.coverage_map(practice, exam))
    problems = coverage.problems(practice, exam, CHAPTERS)
    assert not problems, "\n".join(problems) + "\n\n" + coverage.coverage_map(practice, exam)
    assert sorted(b.chapter for b in exam) == list(CHAPTERS) == list(range(1, 18))   # chapter 17 in the blueprint


def test_the_frontier_topics_are_asked_in_practice_and_in_the_exam():
    practice, exam = _banks()
    found = {}
    for kind, banks in (("practice", practice), ("exam", exam)):
        for topic, (chapter, anchor, words) in TOPICS.items():
            found[topic, kind] = [it.id for b in banks if b.chapter == chapter for it in b.items
                                  if anchor in it.covers and re.search(words, _text(it))]
    for topic in TOPICS:
        print(f"{topic:<36} practice {found[topic, 'practice']}  exam {found[topic, 'exam']}")
    assert all(found.values()), sorted(k for k, v in found.items() if not v)


def test_anchors_are_the_same_in_both_languages():
    """Both pages of a chapter carry the same heading anchors, so one `covers` serves both twins."""
    for chapter, page in coverage.chapter_pages(ROOT / "course").items():
        twin = page.with_name(page.stem + ".nl.md")
        en = [s.anchor for s in coverage.page_sections(page)]
        assert en == [s.anchor for s in coverage.page_sections(twin)], chapter


def test_covers_is_checked_and_carried_by_the_twin(tmp_path):
    bank = {"chapter": 4, "title": "t", "items": [{"id": "a", "type": "single", "covers": ["fp8"], "question": "Q?",
                                                   "choices": [{"text": "x", "correct": True, "explain": "e"},
                                                               {"text": "y", "correct": False, "explain": "f"}]}]}
    (tmp_path / "nl").mkdir()
    path = tmp_path / "04-x.yaml"
    for covers, message in (("fp8", "'covers' lists 1 to 8"), (["FP8 scaling"], "'covers' lists 1 to 8"),
                            (["fp8", "fp8"], "'covers' lists 1 to 8")):
        path.write_text(yaml.safe_dump({**bank, "items": [{**bank["items"][0], "covers": covers}]}))
        with pytest.raises(quiz.QuizError, match=message):
            quiz.load_bank(path)
    path.write_text(yaml.safe_dump(bank))
    assert quiz.load_bank(path).items[0].covers == ("fp8",)
    (tmp_path / "nl" / "04-x.yaml").write_text(yaml.safe_dump({**bank, "items": [{**bank["items"][0], "covers": ["why"]}]}))
    with pytest.raises(quiz.QuizError, match="'covers' is"):
        quiz.load_bank(path, "nl")
    gone = [{**bank["items"][0], "covers": ["no-such-heading"]}]
    practice = [quiz.Bank(chapter=4, title="t", items=tuple(quiz.load_bank(path).items))]
    bad = quiz.Bank(chapter=4, title="t", items=(quiz.replace(practice[0].items[0], covers=tuple(gone[0]["covers"])),))
    assert any("not headings of chapter 4" in p for p in coverage.problems([bad], [], []))
    assert any("no practice item asks about sections" in p for p in coverage.problems(practice, [], []))
    assert any("0 exam items" in p for p in coverage.problems([], [], [4]))
