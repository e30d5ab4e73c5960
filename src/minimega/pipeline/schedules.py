"""Pipeline schedules as data: the order of forward and backward passes on each rank, and the slot grid.

A schedule is a pure function ``(p, m, v, rank) -> [Action]``: the order in which one rank runs the
forward (F) and backward (B) passes of its model chunks over the m micro-batches. With v virtual
stages a rank holds chunks ``rank, rank + p, rank + 2p, ...`` of the p·v chunks the model is cut into
(Megatron-LM's interleaved assignment), so activations go round the ring of ranks v times.

`plan()` turns the per-rank orders into a **slot grid**: time advances in ticks, one chunk pass per tick
(t_F = t_B = one slot), and each rank runs its next action at the first tick whose inputs arrived
at the end of an earlier tick. The grid is also the communication program: whatever a rank produces
in tick t is sent at the end of tick t, and its peer receives it at the end of the same tick, so both
sides of every transfer know its tick and every rank posts its transfers in the same order.

Bubble (Narayanan et al. 2021 §2.2, arXiv:2104.04473), counted from the grid by `bubble_slots`:

    gpipe, 1f1b         idle / total  = (p - 1) / (m + p - 1)      (idle / ideal = (p - 1) / m)
    interleaved_1f1b    idle / ideal  = (p - 1) / (v · m)

ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv:2401.10241 §2.1) splits each backward
into B (the input gradient, sent upstream at once) and W (the weight gradient, which nothing downstream
waits for), one slot each (t_F = t_B = t_W). Its bubble is (p - 1)(t_F + t_B - t_W) against 1F1B's
(p - 1)(t_F + t_B + t_W), a third of it; on the grid, for m >= p:

    zb_h1               idle / total  = (p - 1) / (3m + p - 1)     (idle / ideal = (p - 1) / (3m))

These are slot counts: every pass one tick. On the wall clock F, B and W last what they last (chunk 0's B is
empty, its W the whole backward), so the measured idle share differs; `Pipeline.bubble()` returns both, and
``minimega train --show-schedule`` prints both.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from ..config import SCHEDULES          # the names, defined once (TrainConfig.schedule validates against them)


@dataclass(frozen=True)
class Action:
    """One pass of one micro-batch through one model chunk (chunk = global index in [0, p·v))."""

    kind: str       # 'F', 'B' (whole backward; under zb_h1 the input gradient only) or 'W' (weight gradient, zb_h1)
    chunk: int
    micro: int

    def __str__(self) -> str:
        return f"{self.kind}{self.micro}"


def check(schedule: str, p: int, m: int, v: int, n_layer: int) -> None:
    """Raise, with the fix in the message, when the schedule cannot run this layout."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}; choose one of {SCHEDULES}")
    if p > n_layer:
        raise ValueError(f"pp={p} stages but the model has only n_layer={n_layer} layers; use pp <= {n_layer}")
    if schedule != "interleaved_1f1b":
        if v != 1:
            raise ValueError(f"virtual_stages={v} needs schedule='interleaved_1f1b' (zb_h1 runs one chunk per "
                             f"rank: set virtual_stages=1)")
        return
    if m % p:
        raise ValueError(f"interleaved_1f1b needs micro_batches to be a multiple of pp: m={m}, p={p} "
                         f"(m % p = {m % p}); use m = {p * (m // p + 1)}")
    if n_layer % (p * v):
        raise ValueError(f"interleaved_1f1b cuts n_layer={n_layer} layers into pp*virtual_stages = {p}*{v} = "
                         f"{p * v} chunks: n_layer must be a multiple of {p * v}")


# --8<-- [start:schedules]
def gpipe(p: int, m: int, v: int, rank: int) -> list[Action]:
    """All forwards, then all backwards (GPipe, arXiv:1811.06965): every micro-batch is held at once."""
    return [Action("F", rank, i) for i in range(m)] + [Action("B", rank, i) for i in range(m)]


# --8<-- [start:one_f_one_b]
# --8<-- [start:one_f_one_b_c1]
def one_f_one_b(p: int, m: int, v: int, rank: int) -> list[Action]:
# --8<-- [end:one_f_one_b_c1]
    """PipeDream-Flush: p - rank - 1 warm-up forwards, then alternate F and B, then drain the backwards."""
    # --8<-- [start:one_f_one_b_c2]
    warmup = min(p - rank - 1, m)
    order = [Action("F", rank, i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [Action("F", rank, warmup + i), Action("B", rank, i)]
    return order + [Action("B", rank, i) for i in range(m - warmup, m)]
    # --8<-- [end:one_f_one_b_c2]
# --8<-- [end:one_f_one_b]


def interleaved_1f1b(p: int, m: int, v: int, rank: int) -> list[Action]:
    """1F1B over v chunks per rank; micro-batches go through in groups of p, chunk by chunk (Megatron-LM)."""
    total = m * v

    def forward(j: int) -> Action:              # j-th forward on this rank
        local = (j // p) % v
        return Action("F", local * p + rank, (j // (p * v)) * p + j % p)

    def backward(j: int) -> Action:             # j-th backward: chunks in reverse order
        local = v - 1 - (j // p) % v
        return Action("B", local * p + rank, (j // (p * v)) * p + j % p)

    warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
    order = [forward(j) for j in range(warmup)]
    for j in range(total - warmup):
        order += [forward(warmup + j), backward(j)]
    return order + [backward(j) for j in range(total - warmup, total)]
# --8<-- [end:schedules]


def _need(a: Action, chunks: int) -> Action | None:
    """The action whose result ``a`` waits for: the activation, the gradient from downstream, or its own B."""
    if a.kind == "F":
        return Action("F", a.chunk - 1, a.micro) if a.chunk > 0 else None
    if a.kind == "W":                                  # the weight gradient needs this chunk's B (its grad_output)
        return Action("B", a.chunk, a.micro)
    return Action("B", a.chunk + 1, a.micro) if a.chunk < chunks - 1 else Action("F", a.chunk, a.micro)


# --8<-- [start:zb_h1]
def zb_h1(p: int, m: int, v: int, rank: int) -> list[Action]:
    """ZB-H1: 1F1B's order of F and B (B now the input gradient only), each W put where the rank would idle.

    Placed tick by tick over all ranks (`_zb_h1_orders`): a rank runs its next F or B when the input is
    there, else the oldest W it owes, which fills what would be a bubble. A W is forced before an F
    once min(p, m) micro-batches hold their graphs (F run, W not yet): the first stage's 1F1B peak.
    """
    return list(_zb_h1_orders(p, m)[rank])


@lru_cache(maxsize=32)
def _zb_h1_orders(p: int, m: int) -> tuple[tuple[Action, ...], ...]:
    fb = [one_f_one_b(p, m, 1, r) for r in range(p)]
    limit = min(p, m)
    orders: list[list[Action]] = [[] for _ in range(p)]
    owed: list[list[Action]] = [[] for _ in range(p)]      # W passes whose B has run, oldest first
    held, nxt, done, t = [0] * p, [0] * p, {}, 0            # held: graphs alive (F run, W not yet)
    while any(nxt[r] < len(fb[r]) or owed[r] for r in range(p)):
        ran = []
        for r in range(p):
            a = fb[r][nxt[r]] if nxt[r] < len(fb[r]) else None
            need = None if a is None else _need(a, p)
            if a is not None and not (a.kind == "F" and held[r] == limit) and (need is None or done.get(need, t) < t):
                nxt[r] += 1
                held[r] += a.kind == "F"
                if a.kind == "B":
                    owed[r].append(Action("W", r, a.micro))
            elif owed[r]:
                a = owed[r].pop(0)
                held[r] -= 1
            else:
                continue
            orders[r].append(a)
            ran.append(a)
        if not ran:
            raise RuntimeError(f"zb_h1 deadlocks at tick {t} (p={p}, m={m})")
        for a in ran:
            done[a] = t
        t += 1
    return tuple(tuple(o) for o in orders)
# --8<-- [end:zb_h1]


ORDERS = dict(zip(SCHEDULES, (gpipe, one_f_one_b, interleaved_1f1b, zb_h1)))   # name -> order, in SCHEDULES' order


@dataclass
class Plan:
    """The slot grid of one step: ``grid[rank][t]`` is an `Action` or None (idle), plus the transfers.

    ``sends[rank][t]`` / ``recvs[rank][t]``: lists of ``(action, peer_rank)`` for the transfers posted at
    the end of tick t: the activation an F produced (to the next chunk's rank) or the input gradient a
    B produced (to the previous chunk's rank).
    """

    schedule: str
    p: int
    m: int
    v: int
    grid: list[list[Action | None]]
    sends: list[dict] = field(default_factory=list)
    recvs: list[dict] = field(default_factory=list)

    @property
    def ticks(self) -> int:
        return len(self.grid[0])


# --8<-- [start:plan]
def plan(schedule: str, p: int, m: int, v: int = 1, forward_only: bool = False) -> Plan:
    """Place every rank's actions on the slot grid, each at the first tick its input is there.

    ``forward_only`` keeps just the forwards, in the schedule's order (evaluation).
    """
    orders = [[a for a in ORDERS[schedule](p, m, v, r) if a.kind == "F" or not forward_only] for r in range(p)]
    chunks = p * v
    done: dict[Action, int] = {}                       # action -> tick it ran in
    grid: list[list[Action | None]] = [[] for _ in range(p)]
    nxt = [0] * p
    t = 0
    while any(nxt[r] < len(orders[r]) for r in range(p)):
        ran = []
        for r in range(p):
            if nxt[r] == len(orders[r]):
                grid[r].append(None)
                continue
            a = orders[r][nxt[r]]
            need = _need(a, chunks)                    # F: the activation; B: the gradient from the next chunk
            if need is None or done.get(need, t) < t:
                grid[r].append(a)
                ran.append(a)
                nxt[r] += 1
            else:
                grid[r].append(None)
        if not ran:
            raise RuntimeError(f"schedule {schedule!r} deadlocks at tick {t} (p={p}, m={m}, v={v})")
        for a in ran:
            done[a] = t
        t += 1
    out = Plan(schedule, p, m, v, grid, [dict() for _ in range(p)], [dict() for _ in range(p)])
    for r in range(p):
        for t, a in enumerate(grid[r]):
            if a is None or a.kind == "W":             # a weight gradient stays on its rank
                continue
            peer_chunk = a.chunk + 1 if a.kind == "F" else a.chunk - 1
            if not 0 <= peer_chunk < chunks:
                continue
            peer = peer_chunk % p
            out.sends[r].setdefault(t, []).append((a, peer))
            out.recvs[peer].setdefault(t, []).append((a, r))
    return out
# --8<-- [end:plan]


def bubble_slots(grid_row: list[Action | None]) -> dict:
    """Idle and busy slots of one rank's row, from its first tick to the last tick of the step."""
    busy = sum(a is not None for a in grid_row)
    return {"ticks": len(grid_row), "busy": busy, "idle": len(grid_row) - busy,
            "idle_of_total": (len(grid_row) - busy) / len(grid_row), "idle_of_ideal": (len(grid_row) - busy) / busy}


def peak_in_flight(order: list[Action], until: str = "B") -> int:
    """Most micro-batches whose forward ran and backward has not, over one rank's order (per chunk summed).

    ``until="W"``: counted until the weight gradient instead (zb_h1 keeps a micro-batch's graph until its W);
    for a schedule without W passes both counts are the same.
    """
    ends = until if any(a.kind == "W" for a in order) else "B"
    live = peak = 0
    for a in order:
        live += (a.kind == "F") - (a.kind == ends)
        peak = max(peak, live)
    return peak
