"""Schedules, bubbles, stage split, printer and bad input: pure math, no process group (one CLI run at the end)."""
import json

import pytest
import torch

import minimega as mm
from minimega.tools.cli import main
from minimega.pipeline import SCHEDULES, bubble_slots, check, layer_bounds, peak_in_flight, plan, split_model
from minimega.pipeline.printer import grid_from_plan, render
from minimega.pipeline.schedules import ORDERS
from minimega.figures.plots import pipeline_schedule


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("p,m", [(2, 4), (2, 8), (4, 4), (4, 8)], ids=lambda x: str(x))
def test_idle_slots_equal_the_closed_form(schedule, p, m):
    v = 2 if schedule == "interleaved_1f1b" else 1
    grid = plan(schedule, p, m, v).grid
    for row in grid:
        slots = bubble_slots(row)
        passes = 3 if schedule == "zb_h1" else 2
        assert slots["busy"] == passes * m * v                # every F and B (and W) of every chunk, once
        if schedule == "zb_h1":   # (p-1)(t_F + t_B - t_W) idle (Qi et al. 2023 §2.1), m >= p: (p-1)/(3m+p-1)
            assert slots["idle"] == (p - 1 if m >= p else slots["idle"])
            if m >= p:
                assert slots["idle"] * (3 * m + p - 1) == (p - 1) * slots["ticks"]
        elif v == 1:   # GPipe and 1F1B: (p-1)/(m+p-1) of total time (Narayanan et al. 2021 §2.2.1)
            assert slots["idle"] * (m + p - 1) == (p - 1) * slots["ticks"]
        else:        # interleaved: (p-1)/(v·m) relative to the ideal time (§2.2.2)
            assert slots["idle"] * v * m == (p - 1) * slots["busy"]
    if (p, m) == (4, 8) and schedule != "zb_h1":   # the reference's test vector: 3/11 = 0.2727 and 0.1875
        assert bubble_slots(grid[0])["idle_of_" + ("total" if v == 1 else "ideal")] == pytest.approx(
            0.2727 if v == 1 else 0.1875, abs=1e-4)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 8)])
def test_peak_in_flight_gpipe_holds_m_1f1b_at_most_p(p, m):
    assert [peak_in_flight(ORDERS["gpipe"](p, m, 1, r)) for r in range(p)] == [m] * p
    assert [peak_in_flight(ORDERS["1f1b"](p, m, 1, r)) for r in range(p)] == [min(p - r, m) for r in range(p)]


@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 8), (3, 7), (4, 2)])
def test_zb_h1_keeps_1f1b_order_and_memory(p, m):
    """ZB-H1 (Qi et al. 2023 §2.1) is 1F1B with each backward split: F and B keep 1F1B's order (so the same
    micro-batches wait for their B on every stage), and a graph kept for its W never makes a stage hold more
    than 1F1B's first stage does, min(p, m)."""
    for r in range(p):
        zb, ref = ORDERS["zb_h1"](p, m, 1, r), ORDERS["1f1b"](p, m, 1, r)
        assert [a for a in zb if a.kind != "W"] == ref
        assert peak_in_flight(zb) == peak_in_flight(ref) == min(p - r, m)
        assert peak_in_flight(zb, until="W") == min(p, m) == peak_in_flight(ORDERS["1f1b"](p, m, 1, 0))
        assert all(zb.index(a) < zb.index(type(a)("W", a.chunk, a.micro)) for a in zb if a.kind == "B")


def test_every_schedule_runs_each_pass_once_and_backwards_in_micro_order():
    for schedule in SCHEDULES:
        p, m, v = 4, 8, (2 if schedule == "interleaved_1f1b" else 1)
        kinds = "FBW" if schedule == "zb_h1" else "FB"
        for r in range(p):
            order = ORDERS[schedule](p, m, v, r)
            assert sorted((a.kind, a.chunk, a.micro) for a in order) == sorted(
                (k, c, i) for k in kinds for c in range(r, p * v, p) for i in range(m))
            for c in range(r, p * v, p):     # the runtime syncs a chunk's gradients on its micro m-1 backward (W)
                for k in kinds[1:]:
                    assert [a.micro for a in order if a.kind == k and a.chunk == c] == list(range(m))


def test_stage_split_is_balanced_and_keeps_model_keys():
    assert [len(b) for b in layer_bounds(7, 3)] == [3, 2, 2]
    torch.manual_seed(0)
    model = mm.GPT(mm.GPTConfig.tiny(block_size=32))
    chunks = [c for r in range(2) for c in split_model(model, r, 2, 1)]
    assert set().union(*(c.state_dict().keys() for c in chunks)) == set(model.state_dict())
    assert "wte.weight" in chunks[0].state_dict() and "lm_head.weight" in chunks[-1].state_dict()
    x = torch.randint(0, 256, (2, 32))
    assert torch.equal(chunks[1](chunks[0](x)), model(x)[0])


@pytest.mark.parametrize("args,message", [
    (("interleaved_1f1b", 2, 3, 2, 8), "multiple of pp: m=3, p=2"),
    (("interleaved_1f1b", 2, 4, 3, 8), "n_layer must be a multiple of 6"),
    (("1f1b", 5, 4, 1, 4), "pp=5 stages but the model has only n_layer=4"),
    (("zigzag", 2, 4, 1, 4), "schedule='zigzag'"),
    (("zb_h1", 2, 4, 2, 8), "virtual_stages=2 needs schedule='interleaved_1f1b' (zb_h1 runs one chunk"),
])
def test_bad_pipeline_input_is_refused_with_the_fix(args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("*", r"\*")):
        check(*args)


def test_bad_input_is_refused_before_launch(capsys):
    for argv, message in [(["--nproc", "2", "--pp", "2", "--schedule", "interleaved_1f1b", "--virtual-stages", "2",
                            "--micro-batches", "3"], "m % p = 1"),
                          (["--nproc", "4", "--pp", "2", "--dp", "3"], "dp*tp*pp = 3*1*2 = 6 != world size 4"),
                          (["--nproc", "8", "--pp", "8"], "pp=8 stages but the model has only n_layer=4")]:
        assert main(["train", *argv]) == 2
        assert message in capsys.readouterr().err


def test_printer_and_figure():
    text = render(grid_from_plan(plan("1f1b", 2, 4)))
    assert text.splitlines()[0] == "rank 0 | F0 F1 .  B0 F2 B1 F3 B2 .  B3 | idle 2/10 = 0.200"
    assert "F0:1" in render(grid_from_plan(plan("interleaved_1f1b", 2, 2, 2)))
    # ZB-H1, p=2, m=4: rank 0 waits one slot for B0, then W0..W3 fill what 1F1B would leave idle
    assert render(grid_from_plan(plan("zb_h1", 2, 4))).splitlines() == [
        "rank 0 | F0 F1 .  B0 W0 F2 B1 W1 F3 B2 W2 B3 W3 | idle 1/13 = 0.077",
        "rank 1 | .  F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3 | idle 1/13 = 0.077"]
    events = [[{"kind": "forward", "step": 0, "start": 0.0, "end": 1.0, "micro": 0, "chunk": 0, "tick": 0},
               {"kind": "send", "step": 0, "start": 1.0, "end": 1.5, "tick": 0}],
              [{"kind": "backward", "step": 0, "start": 2.0, "end": 3.0, "micro": 0, "chunk": 1, "tick": 2}]]
    fig = pipeline_schedule(events)
    assert [t.name for t in fig.data] == ["forward", "send", "backward"]
    assert fig.data[2].base[0] == 2000.0 and fig.layout.xaxis.title.text.endswith("(ms)")


def test_cli_trains_a_pipeline_and_prints_its_schedule(capsys):
    """``--schedule zb_h1`` end to end: trains, and the printed grid (from the recorded events) has the W passes,
    with each rank's measured wall-clock idle share of the same step under it."""
    argv = ["train", "--nproc", "2", "--pp", "2", "--schedule", "zb_h1", "--micro-batches", "4", "--steps", "3",
            "--json", "--show-schedule"]
    assert main(argv) == 0
    out = capsys.readouterr()
    summary = json.loads(out.out.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["final_loss"] < summary["first_loss"]
    assert "rank 0 | F0 F1 .  B0 W0 F2 B1 W1 F3 B2 W2 B3 W3 | idle 1/13 = 0.077" in out.err
    assert "W<m>  weight gradient of micro-batch m" in out.err
    grid_and_legend = out.err[out.err.index("rank 0 |"):].splitlines()
    assert grid_and_legend[1].startswith("rank 1 |") and grid_and_legend[2].startswith("legend: one row per pipeline rank")
    assert "F<m>  forward of micro-batch m" in out.err and ".     idle" in out.err
    import re
    walls = re.search(r"wall clock: idle share of the same step, measured: rank 0 ([0-9.]+), rank 1 ([0-9.]+)", out.err)
    assert walls and all(0.0 <= float(w) < 1.0 for w in walls.groups()), out.err[-600:]


@pytest.mark.parametrize("field,value,message", [
    ("zero_stage", 3, "zero_stage=3: ZeRO-3 frees"),
    ("activation_checkpointing", "full", "activation_checkpointing='full': a checkpointed block"),
    ("cp", 2, "cp=2: context parallelism's ring backward"),
])
def test_zb_h1_refuses_what_it_does_not_split_by_name(field, value, message):
    with pytest.raises(ValueError, match=message):
        mm.TrainConfig(pp=2, micro_batches=2, schedule="zb_h1", **{field: value})
    mm.TrainConfig(pp=2, micro_batches=2, schedule="1f1b", **{field: value})     # what 1F1B runs


def test_zb_split_runs_each_matmul_once_and_gives_the_backward_gradients():
    """B + W of one chunk (`pipeline.split`) against one plain backward: the same matmuls, counted as dispatched
    (a W that re-runs the chain from the output repeats every dX matmul: 1.5x), and the same gradients."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from minimega.pipeline import split
    from minimega.pipeline.stage import split_model

    class Matmuls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.bmm, torch.ops.aten.addmm)
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    cfg = mm.GPTConfig.tiny(block_size=16)
    chunk = split_model(mm.GPT(cfg), 1, 2)[0]                       # blocks 2-3, ln_f and the head
    params = list(chunk.parameters())
    h, y = torch.randn(2, 16, cfg.n_embd), torch.randint(0, cfg.vocab_size, (2, 16))
    inp = h.clone().requires_grad_()
    out = chunk.loss(chunk(inp), y)
    with Matmuls() as plain:
        torch.autograd.backward(out, inputs=params + [inp])
    want, want_dx = [p.grad.clone() for p in params], inp.grad.clone()
    for p in params:
        p.grad = None
    inp = h.clone().requires_grad_()
    out = chunk.loss(chunk(inp), y)
    with Matmuls() as both:
        dx, owed = split.input_grad(out, None, inp, params)
        held, none_yet = owed.held_bytes, all(p.grad is None for p in params)
        split.weight_grad(owed)
    assert plain.n > 0 and both.n == plain.n, (both.n, plain.n)
    assert held > 0 and none_yet                                  # B kept split-point gradients, made no dW
    assert torch.allclose(dx, want_dx, rtol=1e-5, atol=1e-7)
    assert all(torch.allclose(p.grad, g, rtol=1e-5, atol=1e-7) for p, g in zip(params, want))
