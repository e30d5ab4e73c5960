"""What gloo really sends (TCP payload per socket, `measure.wire_bytes`) against the ring model `CommLog` uses.

Found, and pinned here: all-reduce sends the ring model's bytes plus a small fixed header per call (gloo's
ring, ``gloo/allreduce.cc``), and so does all-gather, which `comm` builds on gloo from n broadcasts. Reduce-
scatter, built from n reduces (chunk k summed into rank k), sends (1 + 1/n) times the model: each reduce is a
ring reduce-scatter of its chunk and then a gather of the pieces to its root. (Torch's own gloo reduce-scatter,
which `comm` no longer calls, is an all-reduce of the whole input: 2 times the model.) The `CommLog`'s
``wire_bytes`` count what each construction sends, the (1 + 1/n) included: equal to the measurement, headers aside.
"""
import pytest

import minimega as mm
from minimega import estimate
from minimega.run import measure

NUMELS = [2**12, 2**16, 2**18]                 # fp32: 16 KiB to 1 MiB


def factor(op: str, ranks: int) -> float:
    """Measured / ring model, headers aside."""
    return 1 + 1 / ranks if op == "reduce_scatter" else 1


def tolerance(model: float, ranks: int) -> float:
    """Headers: gloo's per-message header, measured at 288 B per peer and phase; 2 KiB per peer and 1% allowed."""
    return 0.01 * model + 2048 * (ranks - 1)


@pytest.mark.parametrize("ranks", [2, 4])
def test_gloo_sends_the_ring_model_except_reduce_scatter(ranks):
    table = mm.launch(measure.wire_table, ranks, NUMELS, timeout=300)
    for rank, rows in enumerate(table):
        for row in rows:
            assert row["model"] == estimate.ring_bytes(row["op"], row["bytes"], ranks)
            expected = factor(row["op"], ranks) * row["model"]
            assert row["logged"] == pytest.approx(expected, rel=1e-12), f"{row['op']}: the CommLog's wire count"
            extra = row["measured"] - expected
            print(f"{ranks} ranks, rank {rank}: {row['op']:>14} S = {row['bytes']:>8} B: measured "
                  f"{row['measured']:>9.0f} B, ring model {row['model']:>9.0f} B, ratio {row['measured'] / row['model']:.4f}")
            assert 0 <= extra <= tolerance(expected, ranks), (
                f"{row['op']} at {ranks} ranks, S = {row['bytes']} B: sent {row['measured']:.0f} B, "
                f"expected {factor(row['op'], ranks)} x ring model = {expected:.0f} B (+ headers)")


def test_wire_bytes_refuses_what_it_cannot_measure():
    group = mm.comm.Group(None, [0, 1], "world")
    with pytest.raises(ValueError, match="op='broadcast'"):
        measure.wire_bytes("broadcast", 8, group)
    with pytest.raises(ValueError, match="numel=7 must be a multiple of the group size 2"):
        measure.wire_bytes("all_gather", 7, group)


def test_recorded_trace_shows_the_same(tmp_path):
    """The course figure's data (`minimega record --only comm-wire`) says what the live test measures."""
    from minimega.figures import record
    trace = record.load("comm-wire")
    assert {(r["op"], r["ranks"]) for r in trace["rows"]} == \
        {(op, n) for op in measure.WIRE_OPS for n in record.WIRE_RANKS}
    for row in trace["rows"]:
        assert row["model"] == estimate.ring_bytes(row["op"], row["bytes"], row["ranks"])
        expected = factor(row["op"], row["ranks"]) * row["model"]
        assert row["logged"] == pytest.approx(expected, rel=1e-12), row
        for measured in row["measured"]:
            assert 0 <= measured - expected <= tolerance(expected, row["ranks"]), row
