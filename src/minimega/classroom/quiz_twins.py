"""Translations of quiz banks: where a twin lives (`twin_path`) and how its words replace the English ones
without touching what is graded (`merge_twin`). See `quiz` for the schema."""
from __future__ import annotations

import ast
import string
from pathlib import Path

import yaml

LANGUAGES = ("en", "nl")
"""English is the source; every other language is a twin of it (`merge_twin`)."""


class QuizError(ValueError):
    """A bank that does not follow the schema; the message names the file and the item."""


def twin_path(path: str | Path, lang: str) -> Path:
    """Where `lang`'s twin of the English bank `path` lives: the same relative path under
    ``quizzes/<lang>/`` (a bank in ``quizzes/exam/`` keeps its ``exam/`` folder)."""
    if lang not in LANGUAGES:
        raise QuizError(f"language {lang!r} is not one of {LANGUAGES}")
    path = Path(path)
    if lang == "en":
        return path
    folder = path.parent
    if folder.name == "exam":                       # quizzes/exam/X -> quizzes/nl/exam/X
        return folder.parent / lang / "exam" / path.name
    return folder / lang / path.name                # quizzes/X -> quizzes/nl/X


STRUCTURE_KEYS = ("type", "answer", "tolerance", "sig", "params", "formula", "covers")
"""Item keys a twin must repeat exactly: they decide what is graded as right."""
TEXT_KEYS = ("question", "explain", "unit", "hint")
"""Item keys a twin supplies in its own language."""


def bank_text(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QuizError(f"{path}: no such bank") from None
    if len(text) > 1_000_000:
        raise QuizError(f"{path}: over 1 MB; a bank is a few kB")
    return text


def parse_bank(text: str, path: str) -> dict:
    raw = yaml.safe_load(text)
    if not isinstance(raw, dict) or not isinstance(raw.get("items"), list) or "chapter" not in raw:
        raise QuizError(f"{path}: a bank needs 'chapter', 'title' and 'items'")
    return raw


def _placeholders(text) -> set[str]:
    """The ``{name}`` fields of a template string (``{{`` escapes excluded)."""
    return {f for _, f, _, _ in string.Formatter().parse(str(text or "")) if f}


def _code_shape(expr: str) -> str:
    """A `given` expression with every string literal blanked: a twin may translate the words a
    formula prints, never the arithmetic."""
    tree = ast.parse(str(expr), mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.dump(tree)


def merge_twin(en: dict, twin: dict, where: str) -> dict:
    """The English bank `en` with its words replaced by the twin's; `QuizError` naming the item and the
    field where the twin's structure differs (a missing or extra id, a changed key, answer, parameter,
    formula, option count or correct flag, a dropped or added ``{placeholder}``)."""
    if twin.get("chapter") != en.get("chapter"):
        raise QuizError(f"{where}: chapter {twin.get('chapter')!r}, the English bank has {en.get('chapter')!r}")
    if not str(twin.get("title") or "").strip():
        raise QuizError(f"{where}: missing 'title'")
    en_items = {str(r.get("id")): r for r in en["items"] if isinstance(r, dict)}
    tw_items = {}
    for r in twin["items"]:
        if not isinstance(r, dict) or not r.get("id"):
            raise QuizError(f"{where}: every item needs an 'id'")
        if str(r["id"]) in tw_items:
            raise QuizError(f"{where}: duplicate item id {r['id']!r}")
        tw_items[str(r["id"])] = r
    if missing := [i for i in en_items if i not in tw_items]:
        raise QuizError(f"{where}: no translation of items {missing}")
    if extra := [i for i in tw_items if i not in en_items]:
        raise QuizError(f"{where}: items {extra} are not in the English bank")
    items = []
    for item_id, e in en_items.items():
        t, at = tw_items[item_id], f"{where} (id {item_id!r})"
        if set(t) != set(e):
            raise QuizError(f"{at}: keys {sorted(t)} differ from the English {sorted(e)}")
        for key in STRUCTURE_KEYS:
            if t.get(key) != e.get(key):
                raise QuizError(f"{at}: {key!r} is {t.get(key)!r}, the English has {e.get(key)!r}")
        merged = dict(e)
        for key in TEXT_KEYS:
            if key in e:
                if _placeholders(t[key]) != _placeholders(e[key]):
                    raise QuizError(f"{at}: {key!r} has placeholders {sorted(_placeholders(t[key]))}, "
                                    f"the English has {sorted(_placeholders(e[key]))}")
                if str(e[key]).strip() and not str(t[key] or "").strip():
                    raise QuizError(f"{at}: {key!r} is empty")
                merged[key] = t[key]
        if "given" in e:
            eg, tg = e["given"] or {}, t["given"] or {}
            if not isinstance(tg, dict) or set(tg) != set(eg):
                raise QuizError(f"{at}: 'given' names {sorted(tg) if isinstance(tg, dict) else tg!r}, "
                                f"the English has {sorted(eg)}")
            for name, expr in eg.items():
                try:
                    same = _code_shape(tg[name]) == _code_shape(expr)
                except SyntaxError:
                    same = False
                if not same:
                    raise QuizError(f"{at}: given {name!r} differs from the English in more than its words")
            merged["given"] = tg
        if "choices" in e:
            ec, tc = e["choices"] or [], t["choices"] or []
            if not isinstance(tc, list) or len(tc) != len(ec):
                raise QuizError(f"{at}: {len(tc) if isinstance(tc, list) else tc!r} options, the English has {len(ec)}")
            choices = []
            for j, (ce, ct) in enumerate(zip(ec, tc)):
                if not isinstance(ct, dict) or set(ct) != set(ce) or ct.get("correct") != ce.get("correct"):
                    raise QuizError(f"{at}, choice {j}: keys or 'correct' differ from the English option "
                                    f"{ce.get('text')!r}")
                choices.append({**ce, "text": ct["text"], "explain": ct["explain"]})
            merged["choices"] = choices
        items.append(merged)
    return {**en, "title": twin["title"], "items": items}
