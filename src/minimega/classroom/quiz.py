"""Quiz banks: one YAML schema for the site's practice quizzes, the labs' widgets and the graded exam.

A bank is one file per chapter::

    chapter: 3
    title: ZeRO stages 1, 2 and 3
    items:
      - id: zero-stage-saves-most          # unique within the bank, stable (progress is keyed on it)
        type: single                        # single | multiple | numeric
        covers: [notation, takeaway]        # the page's heading anchors it asks about (`coverage`)
        question: Which ZeRO stage ...?
        choices:
          - {text: Stage 3, correct: true, explain: Parameters are sharded too, so ...}
          - {text: Stage 1, correct: false, explain: Only optimizer states are sharded, so ...}
      - id: zero-fig1-stage2
        type: numeric
        question: With Psi = 7.5B and Nd = 64, how many GB per GPU under stage 2?
        answer: 16.6
        tolerance: 0.01                     # relative
        unit: GB
        explain: 2Psi + (2 + 12)Psi/Nd = ...
        formula: "model_state_bytes(7.5e9, 64, 2) / 1e9"   # optional; tests recompute it with minimega.analysis

Every choice carries an ``explain`` (why that option is right or wrong, in words), so feedback never
reduces to a colour.

Numeric items state their precision: the question shown ends with "Give N significant figures; answers
within X% are accepted." (`Item.prompt`), and a value rounded to ``sig`` significant figures (default 3)
is accepted even where it lies outside ``tolerance`` (the course prints 1.875 GB as 1.9).

A numeric item with ``params`` is a template (the graded exam's parametric items): each parameter lists
the values it may take, either explicitly or as a range, the question names them in ``{braces}`` and
``formula`` computes the answer from them with `minimega.analysis` (``answer`` is then left out)::

      - id: zero-stage-memory
        type: numeric
        params:
          psi: [1.5, 3, 6, 13, 20]              # values
          nd: {from: 8, to: 256, step: 8}        # a range, both ends included
          stage: [1, 2, 3]
        question: Ψ = {psi}B parameters on N_d = {nd} GPUs under ZeRO stage {stage}: GB per GPU?
        formula: model_state_bytes(psi * 1e9, nd, stage) / GB
        tolerance: 0.01
        sig: 3
        unit: GB
        explain: "(2 + 2 + 12)Ψ split by stage: {answer} GB."   # {answer} is the computed value

``given`` (optional) names quantities computed from the parameters for the question to print, e.g.
``given: {n: "t * p * d"}`` to state a GPU count that the parameters make divisible.

`draw_params` picks one value per parameter with the caller's random generator and `instantiate`
turns the template and those values into a plain numeric `Item`.

Translations. Every bank has a twin per language in `LANGUAGES` other than English, at the same
relative path under ``quizzes/<lang>/`` (`twin_path`): ``quizzes/03-zero.yaml`` ->
``quizzes/nl/03-zero.yaml``, ``quizzes/exam/03-zero.yaml`` -> ``quizzes/nl/exam/03-zero.yaml``.
``load_bank(path, lang="nl")`` takes the *structure* from the English file (ids, types, which options
are correct, answers, tolerances, parameters, formulas) and only the *words* from the twin (title,
questions, explanations, option texts, units, and the string literals of ``given``), after checking
that the twin repeats the structure exactly (`merge_twin`). A translation can therefore never change
a key or a number: it can only be refused, with the item and the field named.
"""
from __future__ import annotations

import functools
import math
import random
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from minimega import estimate as est

from .quiz_twins import LANGUAGES, QuizError, bank_text, merge_twin, parse_bank, twin_path  # noqa: F401  (re-exported)

ITEM_TYPES = ("single", "multiple", "numeric")
ANCHOR = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
"""A heading anchor as the pages write it: ``{ #async-save }``."""


@dataclass(frozen=True, kw_only=True)
class Choice:
    text: str
    correct: bool
    explain: str


@dataclass(frozen=True, kw_only=True)
class Item:
    id: str
    type: str
    question: str
    choices: tuple[Choice, ...] = ()
    answer: float | None = None
    tolerance: float = 0.0
    """Relative tolerance for numeric items: |given - answer| <= tolerance * |answer|."""
    unit: str = ""
    explain: str = ""
    formula: str | None = None
    sig: int = 3
    """Significant figures asked for; the value rounded to them is always accepted."""
    params: dict[str, tuple[float, ...]] | None = None
    """A template: parameter -> the values it may take (answer computed by `formula`)."""
    given: dict[str, str] | None = None
    """A template's derived quantities the question prints: name -> formula of the parameters."""
    lang: str = "en"
    """Language of the words (question, explanations, unit, the precision note and grading messages)."""
    hint: str = ""
    """Practice items: a nudge shown after a first wrong answer, before the worked answer (optional)."""
    covers: tuple[str, ...] = ()
    """Heading anchors of the chapter's page (``why``, ``fp8``) whose teaching the item asks about (`coverage`)."""

    @property
    def parametric(self) -> bool:
        return self.params is not None

    @property
    def prompt(self) -> str:
        """The question as shown: numeric items state the precision they are graded at."""
        if self.type != "numeric":
            return self.question
        return f"{self.question.rstrip()} {precision_note(self)}"


def precision_note(item: Item) -> str:
    """The sentence a numeric question ends with: how precise an answer must be to count."""
    unit = f" in {item.unit}" if item.unit else ""
    if item.lang == "nl":
        if item.tolerance == 0:
            return (f"Geef het antwoord{unit} exact (een waarde die niet geheel is, mag je afronden op "
                    f"{item.sig} significante cijfers).")
        return (f"Geef het antwoord{unit}, in {item.sig} significante cijfers; antwoorden die hooguit "
                f"{show(item.tolerance * 100, 'nl')}% van de exacte waarde afwijken, worden goedgerekend.")
    if item.tolerance == 0:
        return (f"Answer{unit} exactly (a value that is not whole may be rounded to {item.sig} significant "
                "figures).")
    return (f"Answer{unit} to {item.sig} significant figures; answers within {item.tolerance * 100:g}% "
            "of the exact value are accepted.")


def round_sig(value: float, sig: int) -> float:
    """`value` rounded to `sig` significant figures (1.875, 2 -> 1.9)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, sig - 1 - math.floor(math.log10(abs(value))))


def show(value: float, lang: str = "en") -> str:
    """A parameter or answer as the question prints it: 64, 7.5, 1.875, 2.5e-05 (Dutch: 7,5, 1,875)."""
    value = float(value)
    text = str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.6g}"
    return text.replace(".", ",") if lang == "nl" else text


@dataclass(frozen=True, kw_only=True)
class Bank:
    chapter: int
    title: str
    items: tuple[Item, ...]
    path: Path | None = None


@dataclass(frozen=True)
class Grade:
    correct: bool
    feedback: tuple[str, ...] = field(default_factory=tuple)
    """Explanations for what was chosen (choice items) or the worked answer (numeric items)."""


def _item(raw: dict, where: str, lang: str = "en") -> Item:
    return replace(_parse_item(raw, where), lang=lang)


def _parse_item(raw: dict, where: str) -> Item:
    if not isinstance(raw, dict):
        raise QuizError(f"{where}: an item must be a mapping, got {type(raw).__name__}")
    for key in ("id", "type", "question"):
        if not raw.get(key):
            raise QuizError(f"{where}: missing '{key}'")
    where = f"{where} (id {raw['id']!r})"
    kind = raw["type"]
    if kind not in ITEM_TYPES:
        raise QuizError(f"{where}: type {kind!r} is not one of {ITEM_TYPES}")
    known = {"id", "type", "question", "choices", "answer", "tolerance", "unit", "explain", "formula",
             "sig", "params", "given", "hint", "covers"}
    if unknown := set(raw) - known:
        raise QuizError(f"{where}: unknown keys {sorted(unknown)}")
    return replace(_parse_kind(raw, where, kind), covers=_covers(raw.get("covers"), where))


def _covers(spec, where: str) -> tuple[str, ...]:
    """``covers: [why, fp8]``: the page's heading anchors the item asks about (optional here; the banks' tests
    and `minimega exam check-bank` require it and check each anchor against the chapter's page)."""
    if spec is None:
        return ()
    if (not isinstance(spec, list) or not 1 <= len(spec) <= 8
            or not all(isinstance(a, str) and ANCHOR.fullmatch(a) for a in spec) or len(set(spec)) != len(spec)):
        raise QuizError(f"{where}: 'covers' lists 1 to 8 distinct heading anchors of the chapter's page, "
                        f"e.g. [why, fp8]; got {spec!r}")
    return tuple(spec)


def _parse_kind(raw: dict, where: str, kind: str) -> Item:
    if kind == "numeric":
        return _numeric(raw, where)
    if any(raw.get(k) is not None for k in ("params", "sig", "given")):
        raise QuizError(f"{where}: 'params', 'given' and 'sig' belong to numeric items")
    choices = raw.get("choices") or []
    if len(choices) < 2:
        raise QuizError(f"{where}: a {kind} item needs at least 2 choices")
    parsed = []
    for j, c in enumerate(choices):
        if not isinstance(c, dict) or set(c) != {"text", "correct", "explain"}:
            raise QuizError(f"{where}, choice {j}: needs exactly 'text', 'correct' and 'explain'")
        if not isinstance(c["correct"], bool) or not str(c["explain"]).strip():
            raise QuizError(f"{where}, choice {j}: 'correct' must be true/false and 'explain' non-empty")
        parsed.append(Choice(text=str(c["text"]), correct=c["correct"], explain=str(c["explain"])))
    n_correct = sum(c.correct for c in parsed)
    if kind == "single" and n_correct != 1:
        raise QuizError(f"{where}: a single-choice item needs exactly 1 correct choice, has {n_correct}")
    if kind == "multiple" and n_correct < 1:
        raise QuizError(f"{where}: a multiple-choice item needs at least 1 correct choice")
    if len({c.text for c in parsed}) != len(parsed):
        raise QuizError(f"{where}: two choices have the same text")
    return Item(id=str(raw["id"]), type=kind, question=raw["question"], choices=tuple(parsed),
                explain=str(raw.get("explain", "")), formula=raw.get("formula"))


def _param_values(spec, where: str) -> tuple[float, ...]:
    if isinstance(spec, dict):
        if set(spec) != {"from", "to", "step"} or not all(isinstance(spec[k], (int, float)) for k in spec):
            raise QuizError(f"{where}: a range is {{from: A, to: B, step: S}} with numbers")
        lo, hi, step = spec["from"], spec["to"], spec["step"]
        if step <= 0 or hi < lo or (hi - lo) / step > 10_000:
            raise QuizError(f"{where}: range needs step > 0, to >= from and at most 10000 values")
        n = int(math.floor((hi - lo) / step + 1e-9)) + 1
        values = [round(lo + i * step, 12) for i in range(n)]
    elif isinstance(spec, list):
        values = spec
    else:
        raise QuizError(f"{where}: a parameter is a list of values or a {{from, to, step}} range")
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                             for v in values):
        raise QuizError(f"{where}: parameter values must be finite numbers")
    if len(set(values)) != len(values):
        raise QuizError(f"{where}: repeated parameter values")
    return tuple(float(v) for v in values)


def _numeric(raw: dict, where: str) -> Item:
    if not raw.get("explain"):
        raise QuizError(f"{where}: a numeric item needs an 'explain'")
    tol = raw.get("tolerance", 0.0)
    if not isinstance(tol, (int, float)) or not 0 <= tol < 1:
        raise QuizError(f"{where}: 'tolerance' is relative and must lie in [0, 1), got {tol!r}")
    sig = raw.get("sig", 3)
    if not isinstance(sig, int) or isinstance(sig, bool) or not 1 <= sig <= 6:
        raise QuizError(f"{where}: 'sig' (significant figures) must be an integer in 1..6, got {sig!r}")
    if raw.get("choices"):
        raise QuizError(f"{where}: a numeric item has no 'choices'")
    common = dict(id=str(raw["id"]), type="numeric", question=raw["question"], tolerance=float(tol),
                  unit=str(raw.get("unit", "")), explain=raw["explain"], formula=raw.get("formula"), sig=sig,
                  hint=str(raw.get("hint", "")))
    if raw.get("params") is None:
        if raw.get("given") is not None:
            raise QuizError(f"{where}: 'given' needs 'params'")
        if not isinstance(raw.get("answer"), (int, float)) or not math.isfinite(raw["answer"]):
            raise QuizError(f"{where}: a numeric item needs a finite 'answer' (or 'params' and a 'formula')")
        return Item(answer=float(raw["answer"]), **common)
    params = raw["params"]
    if not isinstance(params, dict) or not params:
        raise QuizError(f"{where}: 'params' maps each parameter name to its values")
    if "answer" in raw:
        raise QuizError(f"{where}: a parametric item computes its answer from 'formula'; drop 'answer'")
    if not raw.get("formula"):
        raise QuizError(f"{where}: a parametric item needs a 'formula'")
    bad = [k for k in params if not (isinstance(k, str) and k.isidentifier()) or k in formula_namespace()]
    if bad:
        raise QuizError(f"{where}: parameter names {bad} are not identifiers or shadow estimator names")
    given = raw.get("given") or {}
    if not isinstance(given, dict) or not all(isinstance(k, str) and k.isidentifier() and k not in params
                                              and isinstance(v, str) for k, v in given.items()):
        raise QuizError(f"{where}: 'given' maps new names to formulas of the parameters")
    item = Item(params={k: _param_values(v, f"{where}, param {k!r}") for k, v in params.items()},
                given=given or None, **common)
    try:                                        # every placeholder names a parameter; the formula runs
        instantiate(item, {k: v[0] for k, v in item.params.items()})
    except (KeyError, IndexError, ValueError, NameError, TypeError, ZeroDivisionError) as err:
        raise QuizError(f"{where}: template does not instantiate: {type(err).__name__}: {err}") from None
    return item


def first(values):
    """The first of ``values``: a formula's search, ``first(d for d in range(1, 100000) if fits(d))``, stops at the
    answer; ``min(...)`` of the same generator gives the same number after testing every candidate."""
    for value in values:
        return value
    raise ValueError("first(): no candidate satisfies the condition")


def formula_namespace() -> dict:
    """Names a formula may use: minimega.analysis's public API, minimega.analysis.perf's (``perf.__all__``) and
    `plan_rank`, GB, math's functions, `first`. No builtins."""
    from minimega.analysis import perf                      # the time model (chapter 13): step_time, collective_time, ...
    from minimega.analysis.plan import plan_rank
    ns = {k: getattr(est, k) for k in dir(est) if not k.startswith("_")}
    ns.update({k: getattr(perf, k) for k in perf.__all__})
    ns.update(plan_rank=plan_rank)
    ns.update({k: getattr(math, k) for k in ("ceil", "floor", "log2", "log10", "sqrt")})
    ns.update(min=min, max=max, round=round, sum=sum, range=range, first=first)
    return ns


def evaluate(expr: str, values: dict | None = None) -> float:
    """Evaluate a formula (from a bank in this repository, never from a request) in `formula_namespace`.

    Remembered per (formula, values): the service re-instantiates an attempt's templates on every answer, review
    and resume, and a formula that searches (``first(n for n in range(…) if …)``) costs milliseconds each time."""
    return _evaluate(expr, tuple(sorted((values or {}).items())))


@functools.lru_cache(maxsize=65536)
def _evaluate(expr: str, values: tuple) -> float:
    # the namespace is the globals, so generator expressions inside a formula can see it too
    return float(_eval(expr, dict(values)))


def _eval(expr: str, values: dict | None = None):
    return eval(compile(expr, "<formula>", "eval"), {"__builtins__": {}, **formula_namespace(), **(values or {})})


def draw_params(item: Item, rng: random.Random) -> dict[str, float]:
    """One value per parameter of a template, drawn with `rng`."""
    return {name: rng.choice(values) for name, values in (item.params or {}).items()}


def instantiate(item: Item, values: dict[str, float]) -> Item:
    """The plain numeric item a template becomes for these parameter values."""
    if not item.parametric:
        return item
    if set(values) != set(item.params):
        raise KeyError(f"parameters {sorted(values)} do not match the template's {sorted(item.params)}")
    for name, value in values.items():
        if float(value) not in item.params[name]:
            raise ValueError(f"{name}={value} is not one of the template's values")
    typed = {k: int(v) if float(v).is_integer() else float(v) for k, v in values.items()}
    answer = evaluate(item.formula, typed)
    if not math.isfinite(answer) or answer == 0:
        raise ValueError(f"formula gives {answer} for {values}")
    shown = {k: show(v, item.lang) for k, v in typed.items()}
    for name, expr in (item.given or {}).items():
        value = _eval(expr, typed)
        shown[name] = value if isinstance(value, str) else show(value, item.lang)
    return replace(item, params=None, given=None, question=item.question.format(**shown), answer=answer,
                   explain=item.explain.format(**shown, answer=show(round_sig(answer, item.sig), item.lang)))


def load_bank(path: str | Path, lang: str = "en") -> Bank:
    """Load and validate one bank; raises `QuizError` naming the file and item on any schema fault.

    Args:
        path: the English bank.
        lang: one of `LANGUAGES`; any other than "en" reads the words from `twin_path(path, lang)` and
            everything else from `path` (`merge_twin`).

    A bank is parsed once per content: the result is cached on the files' text (banks are frozen), so
    every service start and test after the first pays only for reading the files.
    """
    path = Path(path)
    source = twin_path(path, lang)
    return _load(str(path), str(source), lang, bank_text(path), bank_text(source) if lang != "en" else None)


@functools.lru_cache(maxsize=256)
def _load(path: str, source: str, lang: str, text: str, twin_text: str | None) -> Bank:
    raw = parse_bank(text, path)
    if twin_text is not None:
        raw = merge_twin(raw, parse_bank(twin_text, source), source)
    items = tuple(_item(r, f"{source}, item {i}", lang) for i, r in enumerate(raw["items"]))
    ids = [it.id for it in items]
    if dupes := sorted({i for i in ids if ids.count(i) > 1}):
        raise QuizError(f"{path}: duplicate item ids {dupes}")
    return Bank(chapter=int(raw["chapter"]), title=str(raw.get("title", "")), items=items, path=Path(source))


def load_banks(folder: str | Path, lang: str = "en") -> list[Bank]:
    """All `*.yaml` banks directly in `folder` (the English folder), sorted by chapter, in `lang`."""
    banks = [load_bank(p, lang) for p in sorted(Path(folder).glob("*.yaml"))]
    return sorted(banks, key=lambda b: b.chapter)


def numeric_ok(item: Item, value: float) -> bool:
    """Within the relative tolerance, or the exact answer rounded to the stated significant figures."""
    if not math.isfinite(value):
        return False
    if abs(value - item.answer) <= item.tolerance * abs(item.answer) + 1e-12:
        return True
    return abs(value - round_sig(item.answer, item.sig)) <= 1e-9 * max(1.0, abs(item.answer))


def grade(item: Item, response) -> Grade:
    """Grade one response.

    Args:
        item: the question.
        response: a choice index (single), an iterable of indices (multiple) or a number (numeric).
    """
    if item.type == "numeric":
        try:
            value = float(response)
        except (TypeError, ValueError):
            if item.lang == "nl":
                return Grade(False, (f"Verwacht: een getal in {item.unit or 'de gevraagde eenheid'}.",))
            return Grade(False, (f"Expected a number in {item.unit or 'the asked unit'}.",))
        if item.parametric:
            raise ValueError(f"item {item.id!r} is a template: instantiate it before grading")
        return Grade(numeric_ok(item, value), (item.explain,))
    picked = {response} if item.type == "single" else set(response)
    if not picked or any(not isinstance(i, int) or not 0 <= i < len(item.choices) for i in picked):
        if item.lang == "nl":
            return Grade(False, (f"Kies {'één' if item.type == 'single' else 'een of meer'} van de "
                                 f"{len(item.choices)} opties.",))
        return Grade(False, (f"Pick {'one' if item.type == 'single' else 'one or more'} of the "
                             f"{len(item.choices)} options.",))
    right = {i for i, c in enumerate(item.choices) if c.correct}
    return Grade(picked == right, tuple(item.choices[i].explain for i in sorted(picked)))
