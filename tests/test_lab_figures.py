"""labs/figures.py: every memory category a lab plots wears minimega.figures.palette's colour and label, as on the site."""
import math
import sys
from pathlib import Path

import pytest

from minimega import estimate
from minimega.figures import palette

LABS = Path(__file__).resolve().parents[1] / "labs"
sys.path.insert(0, str(LABS))
import figures  # noqa: E402  (labs/figures.py)

DDP = {"rank": 0, "n_params": 100, "memory": {"params": 400, "grads": 400, "optimizer_states": 800,
                                              "optimizer_step_counters": 24}}
ZERO = {"rank": 1, "n_params": 100, "memory": {"params": 200, "grads": 200, "master": 0, "optimizer_states": 400,
                                               "optimizer_step_counters": 8, "optimizer_location": "device"}}


def _bars(fig):
    return {t.name: t for t in fig.data}


def test_memory_bars_colour_each_category_as_the_palette_does():
    fig = figures.memory_bars([DDP, ZERO], "t")
    bars = _bars(fig)
    assert list(bars) == ["parameters", "gradients", "optimizer states (moments)", "optimizer states (step counters)"]
    for trace, cat in zip(fig.data, ("params", "grads", "optimizer", "optimizer")):
        assert trace.marker.color == palette.COLOURS[cat] and list(trace.x) == ["rank 0", "rank 1"]
    assert bars["optimizer states (step counters)"].marker.pattern.shape == "."    # a part, told apart by its pattern
    assert list(bars["parameters"].text) == ["4.00 B/param", "2.00 B/param"]
    zero = figures.memory_bars([ZERO], "t", labels=["ZeRO"])                  # where the optimizer lives: no bar
    assert [t.name for t in zero.data] == ["parameters", "gradients", "optimizer states (fp32 master weights)",
                                           "optimizer states (moments)", "optimizer states (step counters)"]


def test_an_unknown_category_is_refused_by_name():
    with pytest.raises(KeyError, match="memory category 'kv_cache': labs/figures.py knows the palette's params"):
        figures.memory_bars([{"rank": 0, "n_params": 1, "memory": {"kv_cache": 8}}], "t")


def test_measured_vs_estimate_pairs_each_category_in_its_colour():
    fig = figures.measured_vs_estimate([("stage 1", {"params": 4, "grads": 4, "optimizer_states": 8},
                                         {"params": 4, "grads": 4, "optimizer_states": 8})], "t")
    colours = [(t.name, t.marker.color) for t in fig.data]
    assert colours == [("parameters (measured)", palette.COLOURS["params"]),
                       ("parameters (formula)", palette.COLOURS["params"]),
                       ("gradients (measured)", palette.COLOURS["grads"]), ("gradients (formula)", palette.COLOURS["grads"]),
                       ("optimizer states (moments) (measured)", palette.COLOURS["optimizer"]),
                       ("optimizer states (moments) (formula)", palette.COLOURS["optimizer"])]
    assert {t.marker.pattern.shape for t in fig.data[1::2]} == {"/"}


def test_offloaded_states_move_to_the_cpu_colour():
    at_step = lambda where: {"rank": 0, "memory_at_step": {"params": 10, "grads": 20, "master": 30, "optimizer_states": 60,
                                                           "optimizer_location": where}}
    fig = figures.model_states_by_location([at_step("device"), at_step("cpu")], ["on the device", "offloaded"], "t")
    bars = {t.name: ([y * 1024 for y in t.y], t.marker.color) for t in fig.data}
    assert bars == {"parameters": ([10, 10], palette.COLOURS["params"]), "gradients": ([20, 20], palette.COLOURS["grads"]),
                    "optimizer states": ([90, 0], palette.COLOURS["optimizer"]),
                    "in CPU memory (offload)": ([0, 90], palette.COLOURS["cpu"])}


def test_estimate_stack_and_activation_plots_use_the_palette():
    rows = {"zero-7.5b": estimate.memory_per_gpu(estimate.MemoryConfig(**estimate.PRESETS["zero-7.5b"]))}
    fig = figures.estimate_stack(rows, "t", limit_gb=80, log=True)
    keys = ("params", "grads", "optimizer", "gathered", "activations", "recompute")
    assert [(t.name, t.marker.color) for t in fig.data] == [(palette.LABELS[k], palette.COLOURS[k]) for k in keys]
    assert sum(t.y[0] for t in fig.data) == pytest.approx(rows["zero-7.5b"]["total"] / 1e9)
    (line,), (note,) = fig.layout.shapes, fig.layout.annotations          # on a log axis a note's y is log10(GB)
    assert line.y0 == line.y1 == 80 and note.y == pytest.approx(math.log10(80)) and note.text == "80 GB per GPU"
    assert figures.estimate_stack(rows, "t", limit_gb=80).layout.annotations[0].y == 80
    lines = figures.activation_lines([1, 2], {"none": [1, 2], "full": [1, 1]}, "t", "x", "y")
    assert {t.line.color for t in lines.data} == {palette.COLOURS["activations"]}
    assert len({t.line.dash for t in lines.data}) == 2
    assert figures.activation_bars({"none": 1.0}, "t", "MiB").data[0].marker.color == palette.COLOURS["activations"]


def test_formula_lines_put_each_measurement_on_its_formula_in_a_series_colour():
    fig = figures.formula_lines({"ring": ([2, 4], [10, 12]), "Ulysses": ([2, 4], [5, 3])}, {"Ulysses": (2, 5)},
                                "t", "cp", "kB")
    traces = [(t.name, list(t.x), list(t.y), t.line.color if t.mode != "markers" else t.marker.color)
              for t in fig.data]
    assert traces == [("ring (formula)", [2, 4], [10, 12], palette.SERIES[0]),
                      ("Ulysses (formula)", [2, 4], [5, 3], palette.SERIES[1]),
                      ("Ulysses (measured)", [2], [5], palette.SERIES[1])]
