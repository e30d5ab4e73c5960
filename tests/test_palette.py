"""One colour per memory category: every chapter figure draws each category in `minimega.figures.palette`'s colour.

A trace belongs to a category when its legend name starts with the category's label ("gradients (2 B/param)"
is gradients). The calculator's half (the same colours in its chart and table, from the JSON the build
writes into its page) is checked in the browser: tests/test_figures_browser.py.
"""
import json
import re

import pytest

from minimega.figures import palette, plots

# what each figure must draw by category, so that a renamed trace cannot slip past the colour check
EXPECTED = {
    "zero-breakdown": {"params", "grads", "optimizer"},
    "presets-memory": {"params", "grads", "optimizer", "gathered", "activations", "recompute"},
    "memory-measured": {"params", "grads", "optimizer"},
    "zero-memory-measured": {"params", "grads", "optimizer"},
    "offload-split": {"cpu", "nvme"},
    "activations-gpt3": {"activations"},
    "activations-vs-seq": {"activations"},
    "activations-measured": {"activations"},
    "tp-scaling": {"activations"},
}


def category(name: str | None) -> str | None:
    """The memory category a legend name announces, or None."""
    if not name:
        return None
    text = re.sub(r"<br\s*/?>", " ", name).lower()
    found = [key for key, lab, _ in palette.CATEGORIES if text.startswith(lab.lower())]
    return max(found, key=lambda k: len(palette.LABELS[k])) if found else None


def colour(trace) -> str | None:
    """The colour a reader sees for `trace` in its legend: bar fill, line, or marker."""
    if trace.type == "bar":
        return trace.marker.color
    if trace.mode and "lines" in trace.mode and trace.line.color:
        return trace.line.color
    return trace.marker.color


@pytest.fixture(scope="module")
def figures():
    return {name: build() for name, build in plots.FIGURES.items()}


def test_categories_are_distinct_and_named():
    keys = [k for k, _, _ in palette.CATEGORIES]
    colours = [c.lower() for _, _, c in palette.CATEGORIES]
    assert len(set(keys)) == len(keys) and len(set(colours)) == len(colours)
    assert palette.REFERENCE.lower() not in colours
    assert {"params", "grads", "optimizer", "activations"} <= set(keys)
    assert palette.label("grads", "2 B/param") == "gradients (2 B/param)"
    with pytest.raises(KeyError, match="memory category 'gradients'.*params, grads"):
        palette.label("gradients")


def test_palette_json_is_the_python_palette():
    rows = json.loads(palette.palette_json())
    assert [(r["key"], r["label"], r["colour"]) for r in rows] == list(palette.CATEGORIES)


def test_every_figure_draws_each_category_in_its_colour(figures):
    seen: dict[str, set[str]] = {}
    wrong = []
    for name, fig in figures.items():
        cats = {category(t.name) for t in fig.data} - {None}
        seen[name] = cats
        for t in fig.data:
            key = category(t.name)
            if key is not None and str(colour(t)).lower() != palette.COLOURS[key].lower():
                wrong.append(f"{name}: {t.name!r} is {colour(t)}, {key} is {palette.COLOURS[key]}")
            # in a figure that shows categories, no other trace borrows a category's colour
            if key is None and cats and str(colour(t)).lower() in {c.lower() for c in palette.COLOURS.values()}:
                wrong.append(f"{name}: {t.name!r} ({colour(t)}) wears a memory category's colour")
    assert wrong == []
    assert {n: seen[n] for n in EXPECTED} == EXPECTED
    drawn = set().union(*seen.values())
    assert drawn == set(palette.COLOURS), f"categories no figure draws: {set(palette.COLOURS) - drawn}"
