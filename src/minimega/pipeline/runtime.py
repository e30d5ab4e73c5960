"""Running a pipeline schedule on one rank: compute what the slot grid says, exchange what it says.

Every rank derives the same `Plan` (the slot grid of `schedules.plan`) and walks its own row tick by
tick. Per tick:

    Phase 1 (compute): the tick's action, if any.
        F(k, i): chunk k on micro-batch i; its input is the token ids (chunk 0) or the activation
                 received from chunk k-1, marked requires_grad so its gradient can be sent back.
                 The last chunk computes loss_i / m, so the m backwards add up to the gradient of the
                 mean loss over all rows (equal-sized micro-batches).
        B(k, i): backward of that graph, seeded with the gradient received from chunk k+1 (or from
                 loss_i / m on the last chunk). Its input's gradient is what goes back to chunk k-1.
                 Under zb_h1, B computes only that input gradient, keeping the gradient at each weight's
                 split point (`split.input_grad`), and
        W(k, i): the weight gradients from those split points, later, into the same .grad buffers, without
                 running the input path again (`split.weight_grad`); then the graph is freed.
    Phase 2 (p2p): one `comm.batch_p2p` with this tick's sends and receives, in the plan's order,
                 waited to completion. Shapes are known up front, (B/m, T, D), so receivers allocate
                 their buffers without a handshake; since both sides take the tick and the order from
                 the same plan, every send meets its receive and no rank waits on one that comes later.

Gradient synchronisation over dp is a wrapper around each chunk (`DataParallel` or ZeRO 1-3, on the
protocol of `minimega.parallel.grad_sync`): the backward of a chunk's last micro-batch runs synchronised (its
hooks start the reductions, which overlap the backwards still to run on the other chunks), the others
inside ``no_sync()``; after the whole schedule the runtime calls every wrapper's ``finish_grad_sync()``
(Megatron-LM's ``finalize_model_grads``), so each chunk's gradients are reduced once per step.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Callable

import torch
import torch.nn as nn

from .. import clock, comm
from ..config import TrainConfig
from ..parallel.grad_sync import GradSync
from ..mesh import Mesh
from ..model import GPT
from . import split
from .schedules import Action, Plan, bubble_slots, plan
from .stage import split_model

_EVENT = {"F": "forward", "B": "backward", "W": "weight"}      # timeline event kind of each pass


class Pipeline(nn.Module):
    """This rank's chunks of the model and the schedule that trains them.

    Args:
        model: the full reference model (same seed on every rank); its modules are shared, not copied.
        config: ``schedule``, ``micro_batches`` (m) and ``virtual_stages`` (v) are read from it.
        mesh: ``pp_rank``, ``pp_size``, ``pp_group`` place this rank; ``device`` holds the buffers.
        wrap: turns a chunk into its gradient-synchronising wrapper (identity when None).
    """

    def __init__(self, model: GPT, config: TrainConfig, mesh: Mesh, wrap: Callable[[nn.Module], nn.Module] | None = None):
        super().__init__()
        self.mesh, self.m, self.v = mesh, config.micro_batches, config.virtual_stages
        self.p, self.rank = mesh.pp_size, mesh.pp_rank
        self.n_embd = model.config.n_embd
        self.seq_split = mesh.tp_size if config.sequence_parallel else 1     # the stream is (B, T/tp, D) under SP
        self.chunks = nn.ModuleList(split_model(model, self.rank, self.p, self.v))
        self.wrapped = [wrap(c) if wrap else c for c in self.chunks]
        self._local = {c.index: i for i, c in enumerate(self.chunks)}    # model chunk -> local index
        self.plan = plan(config.schedule, self.p, self.m, self.v)
        self.split_backward = config.schedule == "zb_h1"    # B and W as separate passes
        self.eval_plan = plan(config.schedule, self.p, self.m, self.v, forward_only=True)
        self._dtype = next(self.chunks.parameters()).dtype                  # activations travel in it
        self.events: list[dict] = clock.Recent()            # the newest events (a long run stays bounded)
        self.peak_in_flight = 0                             # micro-batches between their F and their B
        self.peak_graphs = 0                                # ... between their F and the end of their backward (W)
        self._owed: dict[tuple[int, int], split.Owed] = {}  # zb_h1: (chunk, micro) -> what its W needs
        self.held_bytes = self.peak_held_bytes = 0          # zb_h1: split-point gradients kept from B to W

    @property
    def timeline(self) -> list[dict]:
        return self.events + [e for w in self.wrapped for e in getattr(w, "timeline", [])]

    def _event(self, kind: str, start: float, step: int, tick: int, **extra) -> None:
        self.events.append({"event": kind, "kind": kind, "start": start, "end": time.perf_counter(),
                            "time": start, "step": step, "tick": tick, "pp_rank": self.rank, **extra})

    # --8<-- [start:pipeline_step]
    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, step: int = 0, train: bool = True) -> torch.Tensor:
        """Run one step's schedule on this dp rank's rows; returns sum_i loss_i / m (0 off the last stage).

        Shapes: x, y (B, T) split into m micro-batches (B/m, T); activations and gradients on the wire
        (B/m, T, D), or (B/m, T/tp, D) with sequence parallelism (each tp rank sends its own slice).
        """
        if x.shape[0] % self.m:
            raise ValueError(f"this rank's {x.shape[0]} rows do not split into micro_batches={self.m}")
        xs, ys = x.chunk(self.m), y.chunk(self.m)
        shape = (x.shape[0] // self.m, x.shape[1] // self.seq_split, self.n_embd)   # (B/m, T, D)
        grid = (self.plan if train else self.eval_plan)
        inbox: dict[Action, torch.Tensor] = {}        # received tensors, keyed by the action that produced them
        stash: dict[tuple[int, int], tuple] = {}      # (chunk, micro) -> (input, output) awaiting backward
        outbox: dict[Action, torch.Tensor] = {}
        total = torch.zeros((), device=self.mesh.device)
        step_start = time.perf_counter()
        with (nullcontext() if train else torch.no_grad()):
            # --8<-- [start:tour_schedule_loop]
            for t, action in enumerate(grid.grid[self.rank]):
                if action is not None:
                    start = time.perf_counter()
                    if action.kind == "F":
                        total += self._forward(action, xs, ys, inbox, stash, outbox)
                    elif action.kind == "B":
                        self._backward(action, inbox, stash, outbox)
                    else:
                        self._weight_grad(action)
                    self.peak_in_flight = max(self.peak_in_flight, len(stash))
                    self.peak_graphs = max(self.peak_graphs, len(stash) + len(self._owed))
                    self._event(_EVENT[action.kind], start, step, t, chunk=action.chunk, micro=action.micro)
                self._exchange(grid, t, shape, self._dtype, inbox, outbox, step)
        if train:
            for wrapper in self.wrapped:              # every chunk's last backward has run: its reductions end here
                if isinstance(wrapper, GradSync):
                    wrapper.finish_grad_sync()
            # --8<-- [end:tour_schedule_loop]
        self._event("step", step_start, step, len(grid.grid[self.rank]))
        if not train:                                 # evaluation leaves no trace in the training timeline
            self.events[:] = [e for e in self.events if e["step"] != step or e["start"] < step_start]
        return total
    # --8<-- [end:pipeline_step]

    def _forward(self, a: Action, xs, ys, inbox, stash, outbox) -> torch.Tensor:
        chunk = self.wrapped[self._local[a.chunk]]
        if a.chunk == 0:
            inp = xs[a.micro]                                                  # (B/m, T) ids
        else:
            inp = inbox.pop(Action("F", a.chunk - 1, a.micro)).requires_grad_(torch.is_grad_enabled())
        out = chunk(inp)                                                       # (B/m, T, D) or (B/m, T, V)
        if a.chunk == self.p * self.v - 1:
            loss = self.chunks[self._local[a.chunk]].loss(out, ys[a.micro]) / self.m
            if torch.is_grad_enabled():
                stash[(a.chunk, a.micro)] = (inp, loss)
            return loss.detach()
        if torch.is_grad_enabled():
            stash[(a.chunk, a.micro)] = (inp, out)
        outbox[a] = out.detach()
        return torch.zeros((), device=out.device)

    def _backward(self, a: Action, inbox, stash, outbox) -> None:
        inp, out = stash.pop((a.chunk, a.micro))
        if self.split_backward:
            return self._input_grad(a, inp, out, inbox, outbox)
        wrapper = self.wrapped[self._local[a.chunk]]
        last = a.micro == self.m - 1                  # every schedule runs a chunk's backwards in micro order
        syncing = isinstance(wrapper, GradSync)
        with (nullcontext() if last or not syncing else wrapper.no_sync()):
            if a.chunk == self.p * self.v - 1:
                torch.autograd.backward(out)
            else:
                torch.autograd.backward(out, inbox.pop(Action("B", a.chunk + 1, a.micro)))
            if syncing and not last:
                wrapper.finish_grad_sync()            # local accumulation: only ends this backward's bookkeeping
        if a.chunk > 0:
            outbox[a] = inp.grad

    # --8<-- [start:zb_split]
    # --8<-- [start:zb_split_c1]
    def _input_grad(self, a: Action, inp, out, inbox, outbox) -> None:
    # --8<-- [end:zb_split_c1]
        """zb_h1's B: only d loss / d input, sent upstream at once; what W needs is kept (`split.input_grad`)."""
        # --8<-- [start:zb_split_c2]
        grad = None if a.chunk == self.p * self.v - 1 else inbox.pop(Action("B", a.chunk + 1, a.micro))
        params = [q for q in self.chunks[self._local[a.chunk]].parameters() if q.requires_grad]
        dx, owed = split.input_grad(out, grad, inp, params)
        if a.chunk > 0:                               # chunk 0's input is token ids: no input gradient
            outbox[a] = dx
        self._owed[(a.chunk, a.micro)] = owed
        self.held_bytes = sum(o.held_bytes for o in self._owed.values())
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)

    def _weight_grad(self, a: Action) -> None:
        # --8<-- [end:zb_split_c2]
        """zb_h1's W: the weight gradient, accumulated into the .grad buffers the other schedules use
        (so the dp wrappers see the same hooks in the same micro order), from the split points B kept."""
        # --8<-- [start:zb_split_c3]
        owed = self._owed.pop((a.chunk, a.micro))
        self.held_bytes -= owed.held_bytes
        wrapper = self.wrapped[self._local[a.chunk]]
        last, syncing = a.micro == self.m - 1, isinstance(wrapper, GradSync)
        with (nullcontext() if last or not syncing else wrapper.no_sync()):
            split.weight_grad(owed)
            if syncing and not last:
                wrapper.finish_grad_sync()
        # --8<-- [end:zb_split_c3]
    # --8<-- [end:zb_split]

    # --8<-- [start:exchange]
    def _exchange(self, grid: Plan, t: int, shape, dtype, inbox, outbox, step: int) -> None:
        sends, recvs = grid.sends[self.rank].get(t, []), grid.recvs[self.rank].get(t, [])
        if not sends and not recvs:
            return
        start = time.perf_counter()
        ranks = self.mesh.pp_group.ranks                                       # pp rank -> global rank
        ops = [comm.P2P("send", outbox.pop(a).contiguous(), ranks[peer], tag=f"{a.kind}{a.micro}.{a.chunk}")
               for a, peer in sends]
        for a, peer in recvs:
            inbox[a] = torch.empty(shape, dtype=dtype, device=self.mesh.device)
            ops.append(comm.P2P("recv", inbox[a], ranks[peer], tag=f"{a.kind}{a.micro}.{a.chunk}"))
        comm.batch_p2p(ops, self.mesh.pp_group).wait()
        kind = "send_recv" if sends and recvs else ("send" if sends else "recv")
        self._event(kind, start, step, t, sends=len(sends), recvs=len(recvs))
    # --8<-- [end:exchange]

    def bubble(self, step: int | None = None) -> dict:
        """Idle fraction of this rank: counted on the slot grid, and measured on the wall clock."""
        slots = bubble_slots(self.plan.grid[self.rank])
        steps = sorted({e["step"] for e in self.events}) if step is None else [step]
        walls = []
        for s in steps:
            ev = [e for e in self.events if e["step"] == s]
            whole = [e for e in ev if e["kind"] == "step"]
            if not whole:
                continue
            span = whole[0]["end"] - whole[0]["start"]
            busy = sum(e["end"] - e["start"] for e in ev if e["kind"] in _EVENT.values())
            walls.append((span - busy) / span)
        return {**slots, "wall_idle_of_total": sum(walls) / len(walls) if walls else None,
                "peak_in_flight": self.peak_in_flight, "peak_graphs": self.peak_graphs,
                "peak_split_bytes": self.peak_held_bytes}
