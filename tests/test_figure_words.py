"""The Dutch chapter figures (minimega.figures.words): every visible string in Dutch, numbers unchanged.

The oracle is the English figure: both are walked side by side through plotly's JSON, and every text
a reader sees (title, axis titles, tick labels, category labels, trace names, hover and value
templates, annotations) is compared. A word the Dutch text shares with its English counterpart must be
a term the Dutch chapters keep in English (`KEPT`), a unit, or code; everything else must differ.
"""
import json
import re

import pytest

from minimega.figures import plots
from minimega.figures.words import NL, num, words
from minimega.figures.palette import LABELS_BY_LANG

# Keys whose strings a reader sees (plotly JSON): titles, names, templates, categories, tick labels.
TEXT_KEYS = {"text", "title", "name", "hovertemplate", "texttemplate", "hovertext", "ticktext", "x", "y",
             "categoryarray"}

# Words the Dutch edition keeps in English (see course/*.nl.md and quizzes/nl/): terms, names, units.
KEPT = {
    # terms
    "zero", "ddp", "stage", "all-reduce", "all-gather", "reduce-scatter", "pipeline", "bubble", "rank", "ranks",
    "forward", "backward", "optimizer", "states", "model", "parameters", "parameter", "bytes", "mixed-precision",
    "mixed", "precision", "adam", "adamw", "interleaved", "micro-batches", "tensor", "parallelism", "fused",
    "attention", "tokens", "presets", "offload", "bucket", "buckets", "unit", "gather", "slots", "chunk", "buffer",
    "loopback", "gloo", "embedding", "head", "loss", "fwd", "bwd", "tp", "sp", "p2p", "send", "recv", "dropout",
    "momentum", "gpipe", "mlp", "gpt", "gpt-3", "narayanan", "calculator", "embed",
    # units and notation
    "gb", "mb", "kb", "kib", "b", "ms", "gpu", "cpu", "bit", "param", "k", "s", "h", "a", "m", "p", "n", "g",
    "t", "v", "ψ", "tcp", "dp", "x", "bsh", "nvme",
    # words spelt the same in both languages
    "per", "in",
}

WORD = re.compile(r"[^\W\d][\w'’.-]*")


def _texts(en, nl, path=""):
    """(path, English, Dutch) for every visible string of two figures' JSON with the same shape."""
    if isinstance(en, dict):
        assert isinstance(nl, dict) and en.keys() == nl.keys(), f"{path}: keys differ"
        for k in en:
            yield from _texts(en[k], nl[k], f"{path}.{k}")
    elif isinstance(en, list):
        assert isinstance(nl, list) and len(en) == len(nl), f"{path}: lengths differ"
        for i, (a, b) in enumerate(zip(en, nl)):
            yield from _texts(a, b, f"{path}[{i}]")
    elif isinstance(en, str):
        keys = re.findall(r"\.([a-z]+)", path)
        if keys and keys[-1] in TEXT_KEYS:
            yield path, en, nl
    else:
        assert en == nl or (isinstance(en, float) and en == pytest.approx(nl)), f"{path}: {en!r} != {nl!r}"


def _words(text: str) -> set[str]:
    text = re.sub(r"%\{[^}]*\}|<[^>]*>", " ", text)                # plotly fields, <br>, <extra>
    found = {w.strip(".'’-").lower() for w in WORD.findall(text)}
    # code names (saved_tensors_hooks, mlp.fc.weight) and notation with digits (ZeRO-3, 1F1B, dp2, 10³) are not words
    return {w for w in found if w and "_" not in w and "." not in w and not any(c.isdigit() for c in w)}


def english_left(en_json: dict, nl_json: dict) -> list[str]:
    """Every visible Dutch string that shares a word with its English counterpart outside `KEPT`."""
    left = []
    for path, en, nl in _texts(en_json, nl_json):
        shared = (_words(en) & _words(nl)) - KEPT
        if shared:
            left.append(f"{path}: {nl!r} keeps {sorted(shared)}")
    return left


def _json(fig) -> dict:
    data = json.loads(fig.to_json())
    data["layout"].pop("template", None)          # plotly's theme, the same in both
    data["layout"].pop("separators", None)        # the decimal mark is the one layout difference
    return data


@pytest.mark.parametrize("name", sorted(plots.FIGURES))
def test_dutch_figure_has_no_english_text_and_the_same_numbers(name):
    build = plots.FIGURES[name]
    en, nl = build(), build(lang="nl")
    assert nl.layout.separators == ",." and en.layout.separators is None
    left = english_left(_json(en), _json(nl))
    assert not left, f"{name}: English left in the Dutch figure:\n  " + "\n  ".join(left)
    assert nl.layout.title.text != en.layout.title.text and nl.layout.meta["title"] == nl.layout.title.text


def test_the_check_finds_an_english_word():
    en = {"layout": {"title": {"text": "Sent per rank per step"}}, "data": [{"name": "on the GPU", "x": ["stage 2"]}]}
    nl = {"layout": {"title": {"text": "Verstuurd per rank per step"}}, "data": [{"name": "op de GPU", "x": ["stage 2"]}]}
    assert english_left(en, nl) == [".layout.title.text: 'Verstuurd per rank per step' keeps ['step']"]


class _Recording(dict):
    """A words table that remembers which entries were looked up."""
    def __init__(self, table):
        super().__init__(table)
        self.used = set()

    def __getitem__(self, key):
        self.used.add(key)
        return super().__getitem__(key)


def test_every_dutch_entry_is_used_by_some_figure(monkeypatch):
    from minimega.figures import words as figure_words
    table = _Recording(NL)
    monkeypatch.setitem(figure_words.TABLES, "nl", table)
    for build in plots.FIGURES.values():
        build(lang="nl")
    plots.offload_split(dp=8, lang="nl")           # the plural title ("op 8 GPU's"); the chapter shows dp = 1
    assert set(NL) - table.used == set(), f"entries no figure uses: {sorted(set(NL) - table.used)}"


def test_missing_entry_and_unknown_language_are_named():
    with pytest.raises(KeyError, match="add it to minimega.figures.words.NL"):
        words("nl")("a sentence nobody wrote")
    with pytest.raises(ValueError, match="figure language 'de'"):
        plots.FIGURES["tp-scaling"](lang="de")


def test_numbers_take_the_dutch_decimal_comma():
    assert num(7.5, "g", "nl") == "7,5" and num(7.5, "g", "en") == "7.5"
    assert num(1234567, ",", "nl") == "1.234.567" and num(0.333, ".0%", "nl") == "33%"
    title = plots.FIGURES["zero-memory-vs-dp"](lang="nl").layout.title.text
    assert "Ψ = 7,5B" in title


def test_palette_labels_and_the_calculator_agree():
    """The calculator's Dutch chart and table labels come from palette_json("nl"), none of its own."""
    from pathlib import Path
    from minimega.figures.palette import palette_json
    rows = json.loads(palette_json("nl"))
    assert {r["key"]: r["label"] for r in rows} == LABELS_BY_LANG["nl"]
    assert LABELS_BY_LANG["nl"].keys() == LABELS_BY_LANG["en"].keys()
    js = (Path(__file__).resolve().parents[1] / "course" / "assets" / "javascripts" / "calculator.js").read_text()
    assert "cats:" not in js and "return c ? c.label" in js
