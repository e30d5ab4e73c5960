"""A private graded bank written by a test (items the repository does not hold), and the white-box attacker:
a script that knows everything in the repository (the sample bank's keys and formulas) and nothing else."""
from __future__ import annotations

import itertools
import json
import random
import re
import string
from pathlib import Path

import yaml

from minimega.classroom.banks import CHAPTERS
from minimega.classroom.quiz import instantiate, load_banks

SAMPLE = Path(__file__).resolve().parents[1] / "quizzes" / "exam"
WORDS = ["amber", "basalt", "cobalt", "dune", "ember", "fjord", "garnet", "heath", "indigo", "juniper", "kelp",
         "lichen", "marl", "nacre", "onyx", "pumice", "quartz"]


def _chapter(c: int, rng: random.Random, lang: str) -> dict:
    nl = lang == "nl"
    w = WORDS[c - 1]
    items = [
        {"id": f"private-{c}-states", "type": "numeric",
         "params": {"psi": {"from": 1, "to": 50, "step": 1}, "nd": {"from": 8, "to": 128, "step": 8},
                    "stage": [1, 2, 3]},
         "question": (f"Het {w}-cluster deelt {{psi}} miljard gewichten over {{nd}} rangen op shardniveau {{stage}}; "
                      "hoeveel gigabyte modeltoestand per rang?") if nl else
                     (f"The {w} cluster spreads {{psi}} billion weights over {{nd}} ranks at sharding level {{stage}}; "
                      "model-state gigabytes per rank?"),
         "formula": "model_state_bytes(psi * 1e9, nd, stage) / GB", "tolerance": 0.01, "unit": "GB",
         "explain": "ZeRO-accounting: {answer} GB." if nl else "ZeRO accounting: {answer} GB."},
        {"id": f"private-{c}-mix", "type": "numeric",
         "params": {"a": {"from": 2, "to": 90, "step": 1}, "b": {"from": 3, "to": 60, "step": 3}},
         "question": (f"Het {w}-recept mengt {{a}} emmers met {{b}} scheppen; hoeveel eenheden?") if nl else
                     (f"The {w} recipe mixes {{a}} buckets with {{b}} scoops; how many units?"),
         "formula": f"a * {c + 1} + b / 3", "tolerance": 0.01, "unit": "eenheden" if nl else "units",
         "explain": "Samen {answer}." if nl else "Together {answer}."},
    ]
    for i in range(4):
        key = rng.randrange(4)
        items.append({"id": f"private-{c}-pick-{i}", "type": "single",
                      "question": (f"Welke {w}-regel {i} geldt in hoofdstuk {c}?" if nl else
                                   f"Which {w} rule {i} holds in chapter {c}?"),
                      "choices": [{"text": f"{'Regel' if nl else 'Rule'} {w} {i}{'ABCD'[j]}", "correct": j == key,
                                   "explain": ("Zo is het." if nl else "It holds.") if j == key else
                                              ("Zo is het niet." if nl else "It does not.")} for j in range(4)]})
    for item in items:
        item["covers"] = ["why"]                    # every chapter's page has a #why section
    return {"chapter": c, "title": (f"Hoofdstuk {c} ({w})" if nl else f"Chapter {c} ({w})"), "items": items}


def write_private_bank(folder: Path, bank_id: str = "acme-private", seed: int = 7) -> Path:
    """Every chapter of CHAPTERS x (2 templates + 4 choice items), Dutch twins in folder/nl, bank.json with `bank_id`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nl").mkdir(exist_ok=True)
    for c in CHAPTERS:
        for lang, where in (("en", folder), ("nl", folder / "nl")):
            (where / f"{c:02d}-private.yaml").write_text(
                yaml.safe_dump(_chapter(c, random.Random(seed * 100 + c), lang), allow_unicode=True, sort_keys=False))
    (folder / "bank.json").write_text(json.dumps({"id": bank_id}))
    return folder


def _template_regex(question: str) -> re.Pattern:
    parts, seen = [], set()
    for literal, name, _, _ in string.Formatter().parse(question.rstrip()):
        parts.append(re.escape(re.sub(r"\s+", " ", literal)).replace(r"\ ", r"\s+"))
        if name:
            parts.append(f"(?P={name})" if name in seen else f"(?P<{name}>.+?)")
            seen.add(name)
    return re.compile("".join(parts) + r"\s")


class WhiteBox:
    """Answers from the repository alone: choice items by their key in the sample bank, numeric items by matching
    the question to a sample template, reading its parameters back from the text and running its formula."""

    def __init__(self, folder: Path = SAMPLE):
        self.keys, self.templates = {}, []
        for bank in load_banks(folder):
            for item in bank.items:
                if item.parametric:
                    self.templates.append((_template_regex(item.question), item))
                elif item.type != "numeric":
                    self.keys[item.question.strip()] = [c.text for c in item.choices if c.correct]
        self.known = 0

    @staticmethod
    def _solve(item, m, shown: str):
        """The parameters the text shows are read back; the rest (only derived values are printed) are searched
        over their allowed values until the template prints exactly the question shown."""
        fixed, free = {}, []
        for name, values in item.params.items():
            try:
                fixed[name] = float(m.group(name))
            except (IndexError, ValueError):
                free.append(name)
        combos = itertools.product(*(item.params[n] for n in free))
        for combo in itertools.islice(combos, 200_000):
            try:
                inst = instantiate(item, {**fixed, **dict(zip(free, combo))})
            except (ValueError, KeyError, ZeroDivisionError):
                continue
            if inst.prompt == shown:
                return inst.answer
        return None

    def answer(self, q: dict) -> dict:
        if q["type"] == "numeric":
            for pattern, item in self.templates:
                m = pattern.match(q["question"])
                if not m:
                    continue
                value = self._solve(item, m, q["question"])
                if value is not None:
                    self.known += 1
                    return {"value": value}
            return {"value": 1.0}
        right = self.keys.get(q["question"].strip())
        if right is None:
            return {"choice": 0} if q["type"] == "single" else {"choices": [0]}
        self.known += 1
        picked = [i for i, text in enumerate(q["choices"]) if text in right]
        return {"choice": picked[0]} if q["type"] == "single" else {"choices": picked}
