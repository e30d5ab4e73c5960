"""Chapter 17's predictions: the committed course/data/capstone.json is what the tools predict today, every published
number names its source, and every error is inside the stated band or explained on the page.

The oracle for the published side is the papers (arXiv:2407.21783 Table 4, arXiv:2412.19437 §1 and §3.2,
arXiv:2205.01068 §2.4), copied into `minimega.figures.capstone` with their sources; for the predicted side, a fresh
run of the planner, the time model and the estimators. The Llama 3 405B dry run (about 140 s) is not rerun: its
record must still equal `layout`'s estimate of the same rank, which is recomputed.
"""
import json
import re
from pathlib import Path

import pytest

from minimega.figures import capstone

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"en": ROOT / "course" / "17-capstone.md", "nl": ROOT / "course" / "17-capstone.nl.md"}


@pytest.fixture(scope="module")
def fresh():
    return capstone.predictions()


@pytest.fixture(scope="module")
def committed():
    return json.loads(capstone.DATA.read_text(encoding="utf-8"))


def _rows(data):
    return [(run["id"], row) for run in data["runs"] for row in run["rows"]]


def test_committed_json_equals_a_fresh_prediction(fresh, committed):
    """Regenerate with `python -m minimega.figures.capstone` after changing a model, a preset or a published number."""
    for new, old in zip(fresh["runs"], committed["runs"]):
        assert new == old, f"{new['id']}: course/data/capstone.json is stale; run python -m minimega.figures.capstone"
    assert fresh == committed


def test_every_published_number_carries_a_source(committed):
    for run in committed["runs"]:
        layout = run["published_layout"]
        assert layout["value"] and "arXiv:" in layout["source"], run["id"]
    for run_id, row in _rows(committed):
        assert "arXiv:" in row["source"], (run_id, row["quantity"])
        if isinstance(row["published"], (int, float)):
            assert re.search(r"Table \d|§\d", row["source"]) or row["unverified"], \
                f"{run_id} {row['quantity']}: name the table or section that prints {row['published']}"
        else:                                                  # nothing printed: the source must say so
            assert "no " in row["source"], (run_id, row)


def test_errors_are_within_the_band_or_explained_on_both_pages(committed):
    assert committed["band"] == capstone.BAND == 0.25
    pages = {lang: path.read_text(encoding="utf-8") for lang, path in PAGES.items()}
    for run_id, row in _rows(committed):
        if row["error"] is None:
            continue
        assert row["error"] == pytest.approx(row["predicted"] / row["published"] - 1, rel=1e-4, abs=1e-5), (run_id, row)
        if row["within_band"]:
            assert row["at_most"] and row["predicted"] <= row["published"] or abs(row["error"]) <= capstone.BAND
            continue
        assert row["explained"], f"{run_id} {row['quantity']}: error {row['error']:+.1%} outside ±25% and unexplained"
        for lang, text in pages.items():
            assert f"{{ #{row['explained']} }}" in text, f"{lang}: no section #{row['explained']} explains {run_id}"


def test_published_numbers_are_the_papers(committed):
    """The numbers as the papers print them (read in the papers' text, not from memory)."""
    got = {(run_id, row["quantity"]): row["published"] for run_id, row in _rows(committed)}
    assert got[("llama3-405b", "mfu")] == 43 and got[("llama3-405b", "mfu_16k")] == 41     # Table 4, BF16 MFU
    assert got[("deepseek-v3", "gpu_hours")] == 180                                    # 180K GPU hours per 1T tokens
    assert got[("opt-175b", "tflops_hw")] == got[("opt-175b", "tflops_model")] == 147   # §2.4
    assert capstone.DEEPSEEK_ROUTED == 58 * 256 * 3 * 7168 * 2048                       # §4.2: 61 layers, 3 dense


def test_the_recorded_dry_run_still_equals_the_estimate(committed):
    record = json.loads(capstone.DRY_RUN.read_text(encoding="utf-8"))
    assert (record["model"], record["dims"], record["ranks"][0]["rank"]) == \
        ("llama3-405b", {"dp": 64, "tp": 8, "pp": 16}, 0)
    assert record["ranks"][0]["differs"] == []
    dry = next(r for r in committed["runs"] if r["id"] == "llama3-405b")["predicted"]["dry_run"]
    assert dry["equal"] and dry["model_states_gb"] == dry["estimate_gb"] > 20


def test_tables_render_every_row_in_both_languages(committed):
    for lang in ("en", "nl"):
        table = capstone.table_markdown("predictions", lang, committed)
        assert table.count("\n") == 1 + len(_rows(committed))
        assert all("arXiv:" in line for line in table.splitlines()[2:])
        layouts = capstone.table_markdown("layouts", lang, committed)
        assert all(run["planner"]["top"] in layouts for run in committed["runs"])
    assert "36,2" in capstone.table_markdown("predictions", "nl", committed)            # decimal comma
    assert capstone.value("llama3-405b", "predicted.8k.mfu", ".1%", "nl", committed) == "36,2%"
    with pytest.raises(ValueError, match="expected 'predictions' or 'layouts'"):
        capstone.table_markdown("other", "en", committed)
