"""`minimega exam check-bank DIR`: is a private graded bank fit to deploy?

Checks, each reported with the file and the item at fault:

- schema: every chapter of `banks.CHAPTERS` loads (`quiz` schema), with at least 2 numeric templates and 4 choice
  items, no fixed numeric item, and a ``bank.json`` with an ``id`` that does not say ``"sample": true``;
- formulas: every template instantiates over `draws` random draws plus each parameter's ends, to a finite
  non-zero answer (computed by `minimega.analysis` / `perf`), and not to one constant;
- Dutch twins: every bank has a twin that repeats its structure (`quiz.merge_twin`) and translates its questions;
- tells: the key is the longest option in at most 1 choice item in 4;
- review: a choice item's ``explain`` (the idea its review shows, `exam.idea`) does not quote its right option;
- overlap: no item shares an id or a question (similar wording, per chapter) with the public practice banks or
  the repository's sample bank, whose keys anyone can read;
- coverage: the bank covers the exam's blueprint as the sample bank does: every item names the sections of its
  chapter's page it asks about (``covers``, heading anchors that exist on the page), and every chapter of
  `banks.CHAPTERS` has at least `coverage.MIN_EXAM_ITEMS` items (`coverage.problems`).
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
from dataclasses import asdict, dataclass, replace
from difflib import SequenceMatcher
from pathlib import Path

from . import banks, coverage, quiz
from .errors import ExamError

SIMILAR = 0.75
"""Questions at least this similar (difflib ratio, normalized text) count as the same question."""
SAMPLE_OVERLAP_MAX = 2
"""`minimega serve` refuses a bank with more items than this that match the public sample (`sample_overlap`)."""
MIN_TEMPLATES, MIN_CHOICE = 2, 4


@dataclass(frozen=True)
class Problem:
    check: str
    where: str
    message: str


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"\{[a-z_0-9]+\}", "#", str(text).lower())).strip()


def _stem(text: str) -> str:
    """A question's words only: lower case, placeholders and numbers as #, no punctuation, one space."""
    text = re.sub(r"\{[a-z_0-9]+\}|\d+(?:[.,]\d+)?", "#", str(text).lower())
    return re.sub(r"\s+", " ", re.sub(r"[^\w#]+", " ", text)).strip()


def _fingerprints(question: str, formula: str | None, params: dict | None, options) -> set[tuple[str, str]]:
    """What a copy keeps whatever its comments, whitespace, id and order: a template's formula with each parameter
    named by the values it takes (renaming a parameter hides nothing; the course's formulas over new ranges are new
    items), the option texts as a set, and the question's words."""
    out = {("stem", _stem(question))}
    if formula:
        formula = re.sub(r"\s+", "", str(formula).split("#")[0])
        for name, values in (params or {}).items():
            formula = re.sub(rf"\b{re.escape(name)}\b", "<" + ",".join(f"{v:g}" for v in values) + ">", formula)
        out.add(("formula", formula))
    if options:
        out.add(("options", "|".join(sorted(_stem(text) for text in options))))
    return out


def _sample_prints(sample: Path) -> tuple[dict, list]:
    """The sample's fingerprints and question words, from its YAML alone: no formula runs (the sample's templates
    search up to 100,000 values, which a service start should not pay for)."""
    theirs, stems = {}, []
    for path in sorted(sample.glob("*.yaml")):
        raw = quiz.parse_bank(quiz.bank_text(path), str(path))
        for it in raw.get("items") or []:
            if not isinstance(it, dict) or not it.get("question"):
                continue
            where = f"{path.name} {it.get('id')}"
            try:
                params = {k: quiz._param_values(v, where) for k, v in (it.get("params") or {}).items()}
            except quiz.QuizError:
                params = {}
            options = [c.get("text", "") for c in it.get("choices") or [] if isinstance(c, dict)]
            for fp in _fingerprints(it["question"], it.get("formula"), params, options):
                theirs.setdefault(fp, where)
            stems.append((SequenceMatcher(None, b=_stem(it["question"]).split()), where))
    return theirs, stems


def sample_overlap(bank_set: banks.BankSet, sample: Path | None = None) -> list[str]:
    """Items of `bank_set` that are the public sample's (`banks.SAMPLE_BANKS`) in disguise: the same formula, the
    same set of options, or a question whose words are at least `SIMILAR` alike, in any chapter, under any id. One line per item,
    naming it and the sample item it copies; empty when the bank is the sample folder itself or there is none."""
    sample = Path(sample or banks.SAMPLE_BANKS)
    if not sample.is_dir() or sample.resolve() == Path(bank_set.folder).resolve():
        return []
    theirs, stems = _sample_prints(sample)
    out = []
    for chapter, bank in sorted(bank_set.banks.items()):
        for it in bank.items:
            prints = _fingerprints(it.question, it.formula, it.params, [c.text for c in it.choices])
            hit = next((theirs[fp] for fp in sorted(prints) if fp in theirs), None)
            if hit is None:
                mine = _stem(it.question).split()
                for matcher, where in stems:             # words, each indexed once; quick bounds before the ratio
                    matcher.set_seq1(mine)
                    if (matcher.real_quick_ratio() >= SIMILAR and matcher.quick_ratio() >= SIMILAR
                            and matcher.ratio() >= SIMILAR):
                        hit = where
                        break
            if hit is not None:
                out.append(f"chapter {chapter} {it.id} (sample {hit})")
    return out


def refuse_disguised_sample(bank_set: banks.BankSet, *, dev: bool, allow_sample: bool) -> banks.BankSet:
    """The bank a service may grade on: a bank with more than `SAMPLE_OVERLAP_MAX` items of the public sample is
    refused (`ExamError` naming them) unless `dev` or `allow_sample`, and is then marked a sample, so that its
    certificates say PUBLIC SAMPLE."""
    if bank_set.sample:
        return bank_set
    copied = sample_overlap(bank_set)
    if len(copied) <= SAMPLE_OVERLAP_MAX:
        return bank_set
    if not (dev or allow_sample):
        more = f" and {len(copied) - 8} more" if len(copied) > 8 else ""
        raise ExamError(f"{bank_set.folder}: {len(copied)} items are the public sample bank's in disguise (same "
                        f"question, formula or options; at most {SAMPLE_OVERLAP_MAX} allowed): "
                        f"{'; '.join(copied[:8])}{more}. Write new items, or pass {banks.ALLOW_FLAG} to grade on "
                        "it as a PUBLIC SAMPLE")
    return replace(bank_set, sample=True)


def _longest_key(item: quiz.Item) -> bool:
    lengths = [len(c.text) for c in item.choices]
    top = max(lengths)
    return lengths.count(top) == 1 and item.choices[lengths.index(top)].correct


def _check_formulas(bank: quiz.Bank, draws: int, rng: random.Random) -> list[Problem]:
    out = []
    for item in bank.items:
        if not item.parametric:
            continue
        where = f"chapter {bank.chapter} {item.id}"
        trials = [{k: v[0] for k, v in item.params.items()}, {k: v[-1] for k, v in item.params.items()}]
        trials += [quiz.draw_params(item, rng) for _ in range(draws)]
        answers = set()
        for values in trials:
            try:
                answers.add(quiz.instantiate(item, values).answer)
            except Exception as err:           # noqa: BLE001  (the bank's formula: report whatever it raises)
                out.append(Problem("formula", where, f"fails for {values}: {type(err).__name__}: {err}"[:300]))
                break
        if len(answers) == 1:
            out.append(Problem("formula", where, f"every draw gives the same answer {answers.pop():g}: "
                                                 "the parameters do not reach the formula"))
    return out


def check_bank(folder: Path, *, draws: int = 200, practice: Path | None = None) -> tuple[list[Problem], dict]:
    """(problems, summary) for the bank in `folder`; no problems means fit to deploy."""
    folder = Path(folder)
    try:
        bank_set = banks.open_bank_set(folder, 3)
    except (ExamError, quiz.QuizError, OSError) as err:
        return [Problem("schema", str(folder), str(err))], {}
    problems: list[Problem] = []
    manifest = banks.read_manifest(folder)
    if not manifest.get("id"):
        problems.append(Problem("schema", str(folder / banks.MANIFEST),
                                'missing: write {"id": "<your-course>-<term>"} so certificates name this bank'))
    if bank_set.sample:
        problems.append(Problem("schema", str(folder), "a public sample bank (bank.json says so, or a chapter file "
                                                       "is a copy of the repository's): its keys are public"))
    rng = random.Random(0)
    n_choice = 0
    tells = []
    for chapter, bank in sorted(bank_set.banks.items()):
        templates, fixed = [it for it in bank.items if it.parametric], [it for it in bank.items if not it.parametric]
        choice = [it for it in fixed if it.type != "numeric"]
        if len(templates) < MIN_TEMPLATES or len(choice) < MIN_CHOICE:
            problems.append(Problem("schema", str(bank.path), f"{len(templates)} templates and {len(choice)} choice "
                                    f"items: a chapter needs at least {MIN_TEMPLATES} and {MIN_CHOICE}"))
        for it in fixed:
            if it.type == "numeric":
                problems.append(Problem("schema", f"chapter {chapter} {it.id}", "a fixed numeric item: its one "
                                        "answer is learnt from a single review; make it a template (params)"))
        problems += _check_formulas(bank, draws, rng)
        n_choice += len(choice)
        for it in choice:                  # the review shows an item's explain: it must not name the key
            keys = [c.text for c in it.choices if c.correct and len(c.text) >= 4]
            if it.explain and any(_stem(k) in _stem(it.explain) for k in keys):
                problems.append(Problem("review", f"chapter {chapter} {it.id}", "its explain (the idea reviews show "
                                        "after an attempt) quotes the right option: reword it so it does not"))
        tells += [f"chapter {chapter} {it.id}" for it in choice if _longest_key(it)]
    if n_choice and 4 * len(tells) > n_choice:
        problems.append(Problem("tells", str(folder), f"the key is the longest option in {len(tells)} of {n_choice} "
                                f"choice items (at most 1 in 4): {', '.join(tells[:12])}"))
    problems += _check_twins(bank_set)
    problems += _check_overlap(bank_set, practice)
    problems += _check_coverage(bank_set)
    reported = {p.where for p in problems if p.check == "overlap"}
    problems += [Problem("overlap", line.split(" (")[0], f"the public sample's item in disguise: {line}")
                 for line in sample_overlap(bank_set) if line.split(" (")[0] not in reported]
    summary = {"bank": bank_set.label, "sha256": bank_set.sha256, "chapters": len(bank_set.banks),
               "templates": sum(it.parametric for b in bank_set.banks.values() for it in b.items),
               "choice_items": n_choice, "draws_per_template": draws + 2, "key_longest": len(tells),
               "languages": ["en", *bank_set.translations],
               "sections_covered": _sections_covered(bank_set)}
    return problems, summary


def _check_coverage(bank_set: banks.BankSet) -> list[Problem]:
    exam = list(bank_set.banks.values())
    if not coverage.chapter_pages():                  # an installed package without the course: anchors unknowable
        return [Problem("coverage", f"chapter {b.chapter} {it.id}", "no 'covers'") for b in exam
                for it in b.items if not it.covers]
    return [Problem("coverage", str(bank_set.folder), p) for p in coverage.problems([], exam, banks.CHAPTERS)]


def _sections_covered(bank_set: banks.BankSet) -> str:
    """'covered/required' over every chapter's ## sections (the map itself: `coverage.coverage_map`)."""
    pages, have, need = coverage.chapter_pages(), 0, 0
    for chapter, bank in bank_set.banks.items():
        if chapter in pages:
            sections = coverage.page_sections(pages[chapter])
            required, covered = coverage.required(sections), coverage.covered(bank, sections)
            need, have = need + len(required), have + sum(a in covered for a in required)
    return f"{have}/{need}"


def _check_twins(bank_set: banks.BankSet) -> list[Problem]:
    if "nl" not in bank_set.translations:
        where = quiz.twin_path(bank_set.folder / "01.yaml", "nl").parent
        return [Problem("twins", str(where), "no Dutch twins: translate every bank (same structure, Dutch words)")]
    out = []
    for chapter, bank in bank_set.banks.items():
        twin = {it.id: it for it in bank_set.translations["nl"][chapter].items}
        same = [it.id for it in bank.items if _norm(twin[it.id].question) == _norm(it.question)]
        if same:
            out.append(Problem("twins", f"chapter {chapter}", f"questions not translated: {same}"))
    return out


def _check_overlap(bank_set: banks.BankSet, practice: Path | None) -> list[Problem]:
    practice = practice or banks.SAMPLE_BANKS.parent
    public: dict[int, list[tuple[str, quiz.Item]]] = {}
    sources = [practice] + ([banks.SAMPLE_BANKS] if banks.SAMPLE_BANKS.is_dir() else [])
    for source in sources:
        if source.resolve() == bank_set.folder.resolve() or not source.is_dir():
            continue
        for b in quiz.load_banks(source):
            public.setdefault(b.chapter, []).extend((str(b.path), it) for it in b.items)
    out = []
    for chapter, bank in bank_set.banks.items():
        for it in bank.items:
            mine = _norm(it.question)
            for path, other in public.get(chapter, []):
                theirs = _norm(other.question)
                matcher = SequenceMatcher(None, mine, theirs)
                if other.id == it.id or (matcher.quick_ratio() >= SIMILAR and matcher.ratio() >= SIMILAR):
                    out.append(Problem("overlap", f"chapter {chapter} {it.id}",
                                       f"same as public item {other.id!r} in {path}: its key is public"))
                    break
    return out


def add_exam_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("exam", help="check a private graded exam bank before deploying it")
    sub = p.add_subparsers(dest="exam_command", required=True)
    c = sub.add_parser("check-bank", help="validate a graded bank: schema, formulas, Dutch twins, tells, overlap, coverage",
                       description=re.sub(r"``(.+?)``", r"`\1`", __doc__.split("\n\n", 1)[1], flags=re.S),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("folder", type=Path, metavar="DIR")
    c.add_argument("--draws", type=int, default=200, help="random draws per template (default 200)")
    c.add_argument("--practice", type=Path, help="the public practice banks (default: the repository's quizzes/)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=run_check_bank)
    return p


def run_check_bank(args) -> int:
    if not 1 <= args.draws <= 100_000:
        raise SystemExit("--draws: 1..100000")
    problems, summary = check_bank(args.folder, draws=args.draws, practice=args.practice)
    if args.json:
        print(json.dumps({"ok": not problems, "summary": summary, "problems": [asdict(p) for p in problems]},
                         indent=1))
        return 1 if problems else 0
    for p in problems:
        print(f"{p.check}: {p.where}: {p.message}")
    if problems:
        print(f"{args.folder}: {len(problems)} problem(s); fix them before deploying", file=sys.stderr)
        return 1
    print(f"{args.folder}: ok. bank {summary['bank']}, {summary['chapters']} chapters, {summary['templates']} "
          f"templates x {summary['draws_per_template']} draws, {summary['choice_items']} choice items (key longest "
          f"in {summary['key_longest']}), languages {', '.join(summary['languages'])}, sections asked "
          f"{summary['sections_covered']}")
    return 0


