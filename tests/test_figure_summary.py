"""Each chart's paragraph of words (`minimega.figures.summary`) says the numbers the chart draws: checked against
the estimator the figure is drawn from, in English and with the Dutch decimal comma."""
import pytest

from minimega import estimate as est
from minimega.figures import plots
from minimega.figures.summary import summarize
from minimega.figures.words import num


def test_bars_list_every_value_the_estimator_gives():
    text = summarize(plots.zero_breakdown(7.5e9, 64), "en")
    assert text.startswith("Where the bytes go")
    for stage in est.STAGES:
        parts = est.model_state_breakdown(7.5e9, 64, stage)
        for key in ("params", "grads", "optimizer"):
            assert f"{plots.STAGE_NAMES[stage]}: {num(parts[key] / est.GB, '.3g', 'en')}" in text, (stage, key)


def test_a_long_series_gives_its_ends_and_the_dutch_decimal_comma():
    fig = plots.bubble_vs_microbatches(lang="nl")
    text = summarize(fig, "nl")
    first = fig.data[0]
    assert f"van {num(first.y[0], '.3g', 'nl')} bij 1 tot {num(first.y[-1], '.3g', 'nl')} bij 32" in text
    assert "," in num(first.y[-1], ".3g", "nl") and "tegen" in text


def test_a_timeline_gives_each_bar_its_start_and_end():
    fig = plots.zero_prefetch()
    text = summarize(fig, "en")
    bar = fig.data[0]
    a, b = bar.base[0], bar.base[0] + bar.x[0]
    assert f"{bar.y[0]} {num(a, '.3g', 'en')}–{num(b, '.3g', 'en')}" in text


def test_every_site_figure_has_a_summary_in_both_languages():
    for name, build in plots.FIGURES.items():
        for lang in ("en", "nl"):
            text = summarize(build(lang=lang), lang)
            assert len(text) > 40 and any(ch.isdigit() for ch in text), (name, lang, text)
    with pytest.raises(ValueError, match="expected one of"):
        summarize(plots.zero_breakdown(), "de")
