"""Overlap proven by timing against a slowed-down wire (`comm.delay`), not by when collectives were issued.

Each collective occupies a simulated wire for D seconds; the same run goes with overlap on and with every
collective forced synchronous (`TrainConfig.overlap_comm=False`), alternating step by step. Forced
synchronous, a collective costs D; with overlap, the collectives the design issues ahead of compute are
hidden: DDP's buckets but the last, ZeRO-2's reduce-scatters but the last, and ZeRO-3's all-gathers
(prefetched one unit ahead, forward and backward) and reduce-scatters, each but one per pass. The test asks
that at least half of the hideable delay is gone from the wire's exposed time: the part of each collective's
D that compute between its issue and its wait did not cover (``ready_at - wait_start``), summed over the
phases overlap hides (the "other" collectives, the loss's mean and ZeRO-2's gathers after the step, are the
same with it on or off). That is what the design controls. Neither step time nor the whole time blocked in
waits is asserted: on two loaded cores step times swing by more than the delay, and a wait also holds a rank
until its slower peer joins (a CI run under load measured 16 ms "saved" of 50 that way). Load only makes
overlap hide more of the wire; a broken overlap still exposes D per collective on a quiet machine, where
`make mutants` runs. Both other times are reported alongside.
"""
import time

import pytest
import torch

import minimega as mm
from minimega import comm, data
from minimega.run import measure

DELAY = 0.01                        # s per collective: large against timer noise, small against a unit's compute
MODEL = dict(n_layer=4, n_embd=128, n_head=4, block_size=64)
STEPS = 4


def _hideable(name: str, per_step: dict) -> int:
    """Collectives the design can hide behind compute in one step (see the module docstring), from the
    step's own collectives: DDP's bucket all-reduces, ZeRO's per-unit reduce-scatters (one per unit)."""
    return {"ddp": per_step.get("all_reduce", 0) - 1,           # the last bucket is issued when backward ends
            "zero2": per_step.get("reduce_scatter", 0) - 1,     # likewise the last unit's reduce-scatter
            "zero3": 3 * (per_step.get("reduce_scatter", 0) - 1)}[name]   # forward, backward gathers; reductions


PHASES = {"ddp": ("reductions",), "zero2": ("reductions",),
          "zero3": ("forward_gathers", "backward_gathers", "reductions")}


class _PhaseExposed:
    """A `comm` observer: seconds of the wire's delay left exposed per phase (`comm.wire`: the wire sleeps until
    ``ready_at`` when the wait starts before it), and seconds blocked in waits in all. Reductions are the
    gradient buckets' all-reduces and the units' reduce-scatters; an all-gather issued with autograd recording
    is a forward gather, one issued inside the backward (where autograd records nothing) a backward gather; the
    rest (the loss's mean, the gathers after the step) is "other". ZeRO-3's forward and backward gathers are
    told apart only there."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.blocked = 0.0

    def issued(self, call) -> None:
        if call.op == "reduce_scatter" or (call.op == "all_reduce" and call.tag.startswith("bucket")):
            call.extra["phase"] = "reductions"
        elif call.op == "all_gather":
            call.extra["phase"] = "forward_gathers" if torch.is_grad_enabled() else "backward_gathers"
        else:
            call.extra["phase"] = "other"

    def waiting(self, call) -> None:
        pass

    def done(self, call) -> None:
        phase = call.extra["phase"]
        self.seconds[phase] = self.seconds.get(phase, 0.0) + max(0.0, call.ready_at - call.wait_start)
        self.blocked += time.perf_counter() - call.wait_start


def _gather_order(timeline: list[dict]) -> list[list[tuple[str, bool]]]:
    """ZeRO-3's all-gathers of the last step, (unit, prefetched) in issue order: forward, then backward."""
    events = sorted((e for e in timeline if e.get("event") == "all_gather_issued"), key=lambda e: e["time"])
    step = [e for e in timeline if e.get("event") == "forward_start" and e.get("step") == max(
        x.get("step", 0) for x in timeline)]
    start = step[0]["time"]
    back = min(e["time"] for e in timeline if e.get("event") == "backward_start" and e["time"] >= start)
    return [[(e["unit"], e["prefetch"]) for e in events if lo <= e["time"] < hi]
            for lo, hi in ((start, back), (back, float("inf")))]


def _overlap_worker(layouts, delay, steps):
    mesh = mm.init_mesh(mm.ParallelDims(dp=2))
    out = {}
    for name, overrides in layouts:
        engines = {}
        for overlap in (True, False):
            limit = {"reductions_in_flight": IN_FLIGHT} if overlap and overrides["zero_stage"] else {}
            config = mm.TrainConfig(batch_size=32, seed=0, overlap_comm=overlap, **overrides, **limit)
            torch.manual_seed(0)
            engines[overlap] = mm.initialize(mm.GPT(mm.GPTConfig(**MODEL)), config, mesh)
        batches = list(data.batches(mesh, steps + 1, 32, MODEL["block_size"]))
        times = {"free": [], True: [], False: []}
        blocked = {"free": [], True: [], False: []}
        phases = {"free": [], True: [], False: []}
        for i, batch in enumerate(batches):
            for key, engine, d in (("free", engines[True], 0.0), (True, engines[True], delay),
                                   (False, engines[False], delay)):
                comm.barrier(mesh.dp_group)
                with comm.delay(d), comm.observing(_PhaseExposed()) as by_phase:
                    t = time.perf_counter()
                    engine.train_step(batch)
                    if i:                                  # step 0 warms up (Adam's states, allocator)
                        times[key].append(time.perf_counter() - t)
                        blocked[key].append(by_phase.blocked)
                        phases[key].append(by_phase.seconds)
        by_op = engines[False].comm_log.summary()["by_op"]
        per_step = {op: row["calls"] // (steps + 1) for op, row in by_op.items()}
        med = min                  # the least-disturbed step: interference only adds time
        exposed = {key: [sum(p.get(ph, 0.0) for ph in PHASES[name]) for p in steps_] for key, steps_ in phases.items()}
        by_mode = lambda xs: {"free": med(xs["free"]), "overlap": med(xs[True]), "sync": med(xs[False])}  # noqa: E731
        out[name] = {"step": by_mode(times), "blocked": by_mode(blocked), "exposed": by_mode(exposed),
                     "collectives": len(engines[False].comm_log.records) // (steps + 1),
                     "hideable": _hideable(name, per_step),
                     "phases": {ph: {"overlap": med(p.get(ph, 0.0) for p in phases[True]),
                                     "sync": med(p.get(ph, 0.0) for p in phases[False])} for ph in PHASES[name]},
                     "units": per_step.get("reduce_scatter", 0),
                     "reductions": len(engines[False].wrapper.buckets) if name == "ddp" else 0}
        if name == "zero3":
            out[name]["gathers"] = _gather_order(engines[True].report()["timeline"])
    return out


# The hideable counts assume every reduction may be in flight at once (IN_FLIGHT above the 6 units, with overlap):
# with FSDP2's default of one, a unit's reduce-scatter first waits for the one before it, so what hides is bounded
# by one unit's backward compute, not by the design (that limit is checked by the memory tests).
LAYOUTS = (("ddp", dict(zero_stage=0, bucket_mb=1.0)), ("zero2", dict(zero_stage=2)), ("zero3", dict(zero_stage=3)))
IN_FLIGHT = 8


def selected(request, names) -> list:
    """The names some selected test of this module is parametrized with (a -k run launches only those)."""
    wanted = {item.callspec.params.get("name") for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec")}
    return [n for n in names if n in wanted]


@pytest.fixture(scope="module")
def timings(request):
    layouts = [(n, o) for n, o in LAYOUTS if n in selected(request, dict(LAYOUTS))]
    return mm.launch(_overlap_worker, 2, layouts, DELAY, STEPS, timeout=300)


@pytest.mark.parametrize("name", [n for n, _ in LAYOUTS])
def test_overlap_hides_most_of_the_delay(timings, name):
    for rank, result in enumerate(timings):
        r = result[name]
        e, b, t = r["exposed"], r["blocked"], r["step"]
        print(f"{name} rank {rank}: exposed per step {e['overlap']*1e3:.0f} / {e['sync']*1e3:.0f} ms (overlap / sync), "
              f"blocked {b['free']*1e3:.0f} / {b['overlap']*1e3:.0f} / {b['sync']*1e3:.0f} ms (no delay / overlap / "
              f"sync), step {t['free']*1e3:.0f} / {t['overlap']*1e3:.0f} / {t['sync']*1e3:.0f} ms; {r['collectives']} "
              f"collectives, sync - overlap {(e['sync'] - e['overlap'])*1e3:.0f} ms of {r['hideable']} x "
              f"{DELAY*1e3:.0f} ms hideable")
        assert r["hideable"] >= 2 and e["free"] == 0.0
        # Forced synchronous, each collective of these phases costs D (test_delay_and_overlap_switch_semantics
        # shows a forced call pays all of it); with overlap at least half of the hideable ones' D must be gone.
        # The bound is taken from that nominal cost, not from the synchronous run's exposed time: a rank held in
        # a synchronous call until its peer joins spends part of D there (16 of 40 ms measured with four busy
        # loops beside the test), which would make the measured saving read short.
        nominal = (r["hideable"] + len(PHASES[name])) * DELAY
        saved = nominal - e["overlap"]
        assert saved >= 0.5 * r["hideable"] * DELAY, (
            f"{name}: overlap hid {saved*1e3:.0f} ms per step, less than half of the "
            f"{r['hideable']} x {DELAY*1e3:.0f} ms the design can hide")


def _phase_hideable(name: str, phase: str, units: int, reductions: int) -> int:
    """Collectives of one phase the design can hide: all but the first gather of each pass (nothing runs before
    it), all but the last reduction (issued when the backward ends)."""
    return (reductions if name == "ddp" else units) - 1


@pytest.mark.parametrize("name", [n for n, _ in LAYOUTS])
def test_each_phase_is_hidden_on_its_own(timings, name):
    """Per phase, the time exposed with overlap on: at most the phase's unhideable collective plus half of
    its hideable ones. The least-exposed rank counts: a rank that waits for a slower peer is blocked too,
    but on the peer's compute, not on the wire. Forced synchronous, every collective pays D."""
    for phase in PHASES[name]:
        exposed = min(result[name]["phases"][phase]["overlap"] for result in timings)
        sync = min(result[name]["phases"][phase]["sync"] for result in timings)
        r = timings[0][name]
        hideable = _phase_hideable(name, phase, r["units"], r["reductions"])
        bound = (1 + hideable / 2) * DELAY
        print(f"{name} {phase}: exposed {exposed*1e3:.1f} ms with overlap (bound {bound*1e3:.0f} ms), "
              f"{sync*1e3:.1f} ms forced synchronous; {hideable} of {hideable + 1} hideable")
        assert hideable >= 2
        assert exposed <= bound, (f"{name}: {phase} exposed {exposed*1e3:.1f} ms per step with overlap, more than "
                                  f"one unhideable plus half of {hideable} hideable x {DELAY*1e3:.0f} ms")


@pytest.mark.parametrize("name", ["zero3"])
def test_zero3_prefetch_order_in_a_fresh_run(timings, name):
    """The current code's order (not the committed trace's): each pass issues its first unit's gather
    without prefetch, then every next unit's (forward: the following one, backward: the preceding one) as a
    prefetch, each unit exactly once per pass."""
    for result in timings:
        forward, backward = result["zero3"]["gathers"]
        names = [u for u, _ in forward]
        assert names[0] == "embed" and names[-1] == "head" and len(set(names)) == len(names) == result["zero3"]["units"]
        assert forward == [(u, i > 0) for i, u in enumerate(names)]
        assert backward == [(u, i > 0) for i, u in enumerate(reversed(names))]


ISSUE_TRIES = 5   # a synchronous issue pays D on every try; a loaded machine delays some tries, not all


def _wire_worker(delay):
    """Timings of the simulated wire itself, on 2 ranks (see comm's [Note: a wire you can slow down])."""
    mesh = mm.init_mesh(mm.ParallelDims(dp=2))
    g, x, y = mesh.dp_group, torch.ones(16), torch.ones(16)
    out = {}
    with comm.delay(delay):
        issues, ones = [], []
        for _ in range(ISSUE_TRIES):
            comm.barrier(g)
            t = time.perf_counter()
            h = comm.all_reduce(x, g, async_op=True)
            issues.append(time.perf_counter() - t)             # async: returns at once
            h.wait()
            ones.append(time.perf_counter() - t)               # done no earlier than issue + D
        out["issue"], out["one"] = min(issues), min(ones)      # the least-disturbed try: load only adds time
        comm.barrier(g)
        t = time.perf_counter()
        h1, h2 = comm.all_reduce(x, g, async_op=True), comm.all_reduce(y, g, async_op=True)
        h2.wait()
        h1.wait()
        out["two"] = time.perf_counter() - t                   # one wire: one after the other, 2D
        comm.barrier(g)
        with comm.overlap(False), comm.observing(measure.InFlight()) as flight:
            t = time.perf_counter()
            comm.all_reduce(x, g, async_op=True)
            out["forced"] = time.perf_counter() - t            # forced synchronous: the call pays D
            out["in_flight"] = len(flight.tensors())
    # Forced synchronous changes when collectives complete, not what they compute.
    states = []
    for overlap in (True, False):
        config = mm.TrainConfig(batch_size=8, zero_stage=3, overlap_comm=overlap)
        torch.manual_seed(0)
        engine = mm.initialize(mm.GPT(mm.GPTConfig.tiny()), config, mesh)
        for batch in data.batches(mesh, 2, 8, 32):
            engine.train_step(batch)
        states.append(engine.full_state_dict())
    out["same_result"] = all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    return out


def test_delay_and_overlap_switch_semantics():
    d = 0.05
    for r in mm.launch(_wire_worker, 2, d, timeout=120):
        assert r["issue"] < d / 2
        assert r["one"] >= d
        assert r["two"] >= 2 * d
        assert r["forced"] >= d and r["in_flight"] == 0
        assert r["same_result"]
    with pytest.raises(ValueError, match="finite number >= 0"):
        with comm.delay(-1):
            pass
