"""Chapter 13's "A 72-GPU NVLink domain" (English and Dutch): the commands on the page, run through the CLI,
print the layouts and numbers its table states, and the hardware table repeats the presets."""
import contextlib
import io
import json
import shlex
from pathlib import Path

import pytest

from minimega.analysis.hardware import HARDWARE
from minimega.tools.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"en": ROOT / "course" / "13-predicting-step-time.md", "nl": ROOT / "course" / "13-predicting-step-time.nl.md"}


def _section(lang: str) -> str:
    text = PAGES[lang].read_text(encoding="utf-8")
    start = text.index("{ #nvlink-domain }")
    return text[start:text.index("\n## ", start)]


def _commands(section: str) -> list[list[str]]:
    block = section[section.index("```console"):]
    block = block[:block.index("```", 3)].replace("\\\n", " ")
    return [shlex.split(line[2:])[1:] for line in block.splitlines() if line.startswith("$ minimega ")]


def _table(section: str) -> list[list[str]]:
    rows = [r for r in section.splitlines() if r.startswith("| ") and "`dp" in r]
    return [[c.strip().strip("`") for c in r.strip("|").split("|")] for r in rows]


def _fmt(x: float, digits: int, lang: str) -> str:
    s = f"{x:,.{digits}f}"
    return s if lang == "en" else s.replace(",", " ").replace(".", ",").replace(" ", ".")


@pytest.fixture(scope="module")
def runs():
    """The page's commands (the English ones; the Dutch page must show the same) run through `minimega plan`."""
    out = []
    for argv in _commands(_section("en")):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(argv + ["--json"]) == 0
        out.append(json.loads(buf.getvalue())["top"][0])
    return out


@pytest.mark.parametrize("lang", ["en", "nl"])
def test_the_page_states_what_the_planner_prints(runs, lang):
    section = _section(lang)
    assert _commands(section) == _commands(_section("en")) and len(runs) == 3
    rows = _table(section)
    assert len(rows) == 3
    for row, top in zip(rows, runs):
        _, layout, step, tok, mfu, dp = row
        assert layout == top["layout"]
        assert step == _fmt(top["total"], 2, lang)
        assert tok == _fmt(top["tokens_per_s"], 0, lang)
        assert mfu == _fmt(100 * top["mfu"], 1, lang) + "%"
        assert dp == _fmt(top["dp_comm"], 2, lang)
    # the prose: the rack keeps dp on NVLink, from the 8-GPU domain's dp seconds to the rack's
    assert f"{_fmt(runs[1]['dp_comm'], 2, lang)} s" in section and f"{_fmt(runs[2]['dp_comm'], 2, lang)} s" in section


@pytest.mark.parametrize("lang", ["en", "nl"])
def test_the_wider_tp_claim(runs, lang, capsys):
    section = _section(lang)
    argv = _commands(_section("en"))[2]
    assert main(argv + ["--tp", "16", "32", "64", "--json"]) == 0
    top = json.loads(capsys.readouterr().out)["top"][0]
    assert "`--tp 16 32 64`" in section and f"`{top['layout']}`" in section
    assert _fmt(top["total"], 2, lang) in section
    assert round(top["total"] / runs[2]["total"]) == 6 and ("six times" in section or "zes keer" in section)
    assert HARDWARE["gb200-nvl72"].link(16, 64) is HARDWARE["gb200-nvl72"].intra
    assert HARDWARE["gb200-nvl72"].link(16, 576).bandwidth < HARDWARE["gb200-nvl72"].intra.bandwidth


@pytest.mark.parametrize("lang", ["en", "nl"])
def test_the_hardware_table_repeats_the_presets(lang):
    text = PAGES[lang].read_text(encoding="utf-8")
    for name in ("b200", "gb200-nvl72", "mi300x"):
        hw = HARDWARE[name]
        row = next(r for r in text.splitlines() if r.startswith(f"| `{name}` |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        peak = hw.peak_flops / 1e12
        assert cells[1] == _fmt(peak, 0 if peak.is_integer() else 1, lang) + " TFLOP/s"
        assert cells[2] == _fmt(hw.hbm_bandwidth / 1e9, 0, lang) + " GB/s"
        assert cells[3] == f"{hw.memory_bytes / 1e9:.0f} GB"
        assert cells[4].startswith(f"{hw.intra.bandwidth / 1e9:.0f} GB/s")
        assert cells[5] == f"{hw.link(10 ** 6).bandwidth / 1e9:.0f} GB/s"
