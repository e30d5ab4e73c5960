"""One colour per memory category, for every chapter figure and the site's calculator.

A reader who learns "orange is optimizer states" in chapter 3 keeps that meaning in chapters 5, 6 and
12 and in the calculator. The keys are `minimega.analysis.memory_per_gpu`'s; the site build hands this
table to the calculator's JavaScript as JSON (`palette_json`), so there is no second copy to drift.
Colours that mean no category (formula markers, the stage curves of chapter 3) use `REFERENCE` or
`SERIES`, never a category's colour, inside a figure that shows categories.
"""
from __future__ import annotations

import json

# key, legend label, colour. Labels are what legends, the calculator's table and its chart show.
CATEGORIES: tuple[tuple[str, str, str], ...] = (
    ("params", "parameters", "#4c6ef5"),
    ("grads", "gradients", "#12b886"),
    ("optimizer", "optimizer states", "#f59f00"),
    ("gathered", "gathered block (ZeRO-3)", "#7950f2"),
    ("activations", "activations", "#e64980"),
    ("recompute", "recomputed layer (backward)", "#82c91e"),
    ("cpu", "in CPU memory (offload)", "#a5673f"),
    ("nvme", "on NVMe (offload)", "#0b7285"),
)
COLOURS = {key: colour for key, _, colour in CATEGORIES}
LABELS = {key: label for key, label, _ in CATEGORIES}
# The labels per language: the Dutch edition's figures and calculator take theirs from here.
LABELS_BY_LANG = {
    "en": LABELS,
    "nl": {"params": "parameters", "grads": "gradiënten", "optimizer": "optimizer states",
           "gathered": "opgehaald blok (ZeRO-3)", "activations": "activaties",
           "recompute": "herberekende laag (backward)", "cpu": "in CPU-geheugen (offload)",
           "nvme": "op NVMe (offload)"},
}

# Formula and estimate markers drawn next to measured categories: a grey that reads on light and dark.
REFERENCE = "#868e96"
# Series that are not memory categories (ZeRO stages, collectives, ranks, pipeline phases).
SERIES = ("#4c6ef5", "#12b886", "#f59f00", "#e64980", "#7950f2", "#868e96")


def label(key: str, detail: str = "", lang: str = "en") -> str:
    """The legend label of category `key` in `lang`, with an optional detail: ``label("grads", "2 B/param")``."""
    if key not in COLOURS:
        raise KeyError(f"memory category {key!r}: expected one of {', '.join(COLOURS)}")
    if lang not in LABELS_BY_LANG:
        raise KeyError(f"language {lang!r}: the palette has labels for {', '.join(LABELS_BY_LANG)}")
    text = LABELS_BY_LANG[lang][key]
    return f"{text} ({detail})" if detail else text


def palette_json(lang: str = "en") -> str:
    """The categories as a JSON list of ``{"key", "label", "colour"}`` in stacking order, labels in `lang`."""
    return json.dumps([{"key": k, "label": label(k, lang=lang), "colour": c} for k, _, c in CATEGORIES],
                      ensure_ascii=False)
