"""One gradient-sync protocol for DDP and ZeRO 1-3, and one gradient clipping for every layout.

A wrapper that synchronises gradients over dp (`DataParallel`, `Zero1`, `Zero2`, `Zero3`) cuts its
parameters into buckets (DDP: ~bucket_mb each; ZeRO: one per unit) and follows two phases per backward:

    Phase 1 (backward, hooks): a post-accumulate-grad hook marks each parameter ready; when the last
        parameter of a bucket is ready the wrapper *starts* that bucket's reduction, asynchronously, so it
        overlaps with the backward of earlier layers.
    Phase 2 (after backward, an explicit call): ``finish_grad_sync()`` starts the buckets whose hooks never
        fired (parameters that got no gradient reduce zeros), waits for every reduction and writes the
        results where the optimizer reads them. The engine calls it after each backward, the pipeline
        runtime after its schedule (Megatron-LM's ``finalize_model_grads``).

In-flight limit (``max_in_flight``, ZeRO's ``reductions_in_flight``): a collective holds its input and its output
until it is waited for. With a bound, starting one more reduction first *retires* the oldest in flight (waits for
it and writes its result, ``_retire``), so at most ``max_in_flight`` are in flight and each reduction's buffers can
be reused by the next (FSDP2 keeps one reduce-scatter in flight by default). Without a bound (DDP) every bucket
stays in flight until ``finish_grad_sync()``.

Inside ``no_sync()`` the hooks start nothing: gradients accumulate locally and the next synchronised
backward reduces the sum once.

Where gradients accumulate (Megatron-LM's ``main_grad``): with ``main_grad_dtype`` set (bf16 training:
fp32), the hook first adds the backward's ``p.grad`` (bf16) into ``main_grads[p]`` (fp32) and drops it, so
micro-steps (``no_sync``, the pipeline's micro-batches) sum in fp32 and the reduction reads fp32 buffers.

[Note: why not queue_callback] Autograd's ``queue_callback`` attaches the end-of-backward work to
whichever graph task is running when it is queued. A checkpointed block recomputes its forward and runs
``torch.autograd.backward`` on it inside the outer backward: a nested graph task. A callback queued by a
hook firing in there runs when *that block's* backward ends, once per checkpointed block, before the
rest of the gradients exist; ZeRO-1 then reduced partial gradients and summed them again (the BLOOM
layout, dp 2 × pp 2 with full recomputation, ended 6 steps 2.2e-1 off). The explicit call runs once, at
a point the caller knows is the end of the backward.

Clipping: `clip_grad_norm_(parts, mesh, max_norm)` assembles the global norm from whatever each rank holds
(see [Note: how the parallelisms compose] in `mesh.py` for which axes hold different elements) and scales every part's gradients.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import Callable, Sequence

import torch
import torch.nn as nn

from .. import comm
from ..comm import Group
from .tensor import sharded_params


def dp_named_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The parameters a dp wrapper (DDP, ZeRO) owns: all but those of submodules marked ``own_grad_sync``.

    The experts of a mixture-of-experts layer (`minimega.parallel.moe.layer.Experts`) differ between the ranks of an ep
    group and are reduced over their own replica group, so the dp wrappers neither broadcast nor reduce them.
    """
    own = {id(p) for m in module.modules() if getattr(m, "own_grad_sync", False) for p in m.parameters()}
    return [(n, p) for n, p in module.named_parameters() if id(p) not in own]


# --8<-- [start:protocol]
class GradSync(ABC):
    """Mixin for the wrappers that reduce gradients over dp: buckets, hooks, ``no_sync`` and ``finish_grad_sync``.

    A subclass calls ``_watch(buckets)`` once and implements
        ``_start(i)``      start bucket i's reduction (asynchronous) from this rank's gradients
        ``_complete()``    wait for every started reduction and write the results
    and, with ``max_in_flight`` set, ``_retire(i)`` (wait for reduction i and write its result; ``_complete`` then
    retires what is left, oldest first); for clipping, ``grad_sq_norm(weight)`` and ``scale_grads_(coef)``.
    ``_bucket_done(i)`` runs on every
    backward, synchronised or not, when bucket i's last gradient arrived (ZeRO-3 frees the unit there).
    """

    grads_sharded = False
    """Whether after the sync each dp rank holds a disjoint part of the gradients (ZeRO) or all of them (DDP)."""
    reduce_every_micro_step = False
    """Whether gradient accumulation reduces on every micro-step instead of accumulating under ``no_sync``."""
    main_grad_dtype: torch.dtype | None = None
    """When set, gradients accumulate in ``main_grads`` of this dtype, not in ``p.grad`` (see the module)."""
    max_in_flight: int | None = None
    """At most this many reductions in flight; starting one more first retires the oldest (None: no bound)."""

    def _watch(self, buckets: Sequence[Sequence[nn.Parameter]], hooks: bool = True,
               main_grads: dict | None = None) -> None:
        """Register the hooks; ``main_grads``: preallocated accumulation buffers (views of a flat buffer,
        ZeRO-1); a parameter without one gets a fresh buffer at its first backward (ZeRO-2/3, freed on reduce)."""
        self._sync = True
        self.main_grads: dict[nn.Parameter, torch.Tensor] = main_grads if main_grads is not None else {}
        self._buckets = [list(b) for b in buckets] if hooks else []
        self._bucket_of = {p: i for i, b in enumerate(self._buckets) for p in b}
        self._seen: list[set] = [set() for _ in self._buckets]         # parameters ready in this backward
        self._started: set[int] = set()
        self._in_flight: list[int] = []                                # started and not yet retired, oldest first
        for p in self._bucket_of:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    @contextmanager
    def no_sync(self):
        """Accumulate gradients locally; the first synchronised backward after the block reduces the sum."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def _on_grad_ready(self, p: nn.Parameter) -> None:
        i = self._bucket_of[p]
        if i in self._started:
            raise RuntimeError(f"a gradient of bucket {i} arrived after its reduction started: a parameter took part "
                               "in two backward passes before finish_grad_sync(); run the earlier ones under no_sync()")
        if self.main_grad_dtype is not None:
            self._accumulate_main_grad(p)
        seen = self._seen[i]
        seen.add(p)
        if len(seen) == len(self._buckets[i]):
            self._bucket_done(i)
            if self._sync:
                self._begin(i)

    # --8<-- [start:in_flight]
    # --8<-- [start:in_flight_c1]
    def _begin(self, i: int) -> None:
    # --8<-- [end:in_flight_c1]
        """Start bucket i's reduction; with a bound, first retire the oldest until there is room."""
        # --8<-- [start:in_flight_c2]
        self._started.add(i)
        if self.max_in_flight is not None:
            while len(self._in_flight) >= self.max_in_flight:
                self._retire(self._in_flight.pop(0))
        self._start(i)
        self._in_flight.append(i)
        # --8<-- [end:in_flight_c2]
    # --8<-- [end:in_flight]

    # --8<-- [start:main_grad]
    # --8<-- [start:main_grad_c1]
    @torch.no_grad()
    def _accumulate_main_grad(self, p: nn.Parameter) -> None:
    # --8<-- [end:main_grad_c1]
        """``main_grads[p] += p.grad`` in ``main_grad_dtype``; ``p.grad`` (the parameter's dtype) is dropped."""
        # --8<-- [start:main_grad_c2]
        if p.grad is None:
            return
        main = self.main_grads.get(p)
        if main is None:
            self.main_grads[p] = p.grad.to(self.main_grad_dtype)
        else:
            main.add_(p.grad)
        p.grad = None
        # --8<-- [end:main_grad_c2]
    # --8<-- [end:main_grad]

    def finish_grad_sync(self) -> None:
        """End of a backward: under sync, start what the hooks did not, wait and write the results (once)."""
        if self._sync:
            for i in range(len(self._buckets)):
                if i not in self._started:          # a parameter without a gradient: its bucket reduces zeros
                    self._begin(i)
            if self._buckets:
                self._complete()
        self._started.clear()
        self._in_flight.clear()
        for seen in self._seen:
            seen.clear()

    def _bucket_done(self, i: int) -> None:
        pass

    @abstractmethod
    def _start(self, i: int) -> None:
        """Start bucket i's reduction (asynchronous) from this rank's gradients."""

    def _retire(self, i: int) -> None:
        """Wait for reduction i and write its result (needed only with ``max_in_flight``)."""
        raise NotImplementedError(f"{type(self).__name__} sets max_in_flight but does not implement _retire")

    @abstractmethod
    def _complete(self) -> None:
        """Wait for every started reduction not yet retired and write the results where the optimizer reads them."""
# --8<-- [end:protocol]


# --8<-- [start:global_norm]
# --8<-- [start:global_norm_c1]
def tp_norm_weight(module: nn.Module, mesh) -> Callable[[str], float]:
# --8<-- [end:global_norm_c1]
    """name → its weight in the squared gradient norm: 1 / its replicas over tp (`Mesh.replicas`): 1 for tp-sharded
    parameters, 1/tp for those whole on every tp rank (the sum over tp counts them tp times)."""
    # --8<-- [start:global_norm_c2]
    sharded = set(sharded_params(module))
    return lambda name: 1.0 / mesh.replicas(tp_sharded=name in sharded, dp_sharded=True)[1]


def global_norm(local_sq: torch.Tensor, groups: list[Group]) -> float:
    # --8<-- [end:global_norm_c2]
    """sqrt of ``local_sq`` summed over each of ``groups`` (the axes holding other elements of the model)."""
    # --8<-- [start:global_norm_c3]
    for group in groups:
        comm.all_reduce(local_sq, group, tag="grad_norm")
    return float("nan") if local_sq.is_meta else local_sq.sqrt().item()     # meta: a dry run has no values


def clip_coefficient(norm: float, max_norm: float) -> float:
    # --8<-- [end:global_norm_c3]
    """min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_."""
    # --8<-- [start:global_norm_c4]
    return min(1.0, max_norm / (norm + 1e-6))
    # --8<-- [end:global_norm_c4]
# --8<-- [end:global_norm]


# --8<-- [start:clip]
def clip_grad_norm_(parts: Sequence[GradSync], mesh, max_norm: float, own: Sequence[GradSync] = ()) -> float:
    """Clip every gradient this rank holds by the global norm; returns that norm (before clipping).

    Args:
        parts: this rank's gradient-sync wrappers (one per pipeline chunk), all of one kind, after
            ``finish_grad_sync()``; each has ``module`` (parameter names as in `model.py`).
        mesh: the groups; every rank of the job calls this (the norm is a collective).
        max_norm: the clipping threshold.
        own: wrappers of parameters laid out over groups of their own (a mixture of experts' experts,
            `moe.zero.ExpertGradSync`): each gives its local squares and ``norm_groups``, the groups over which
            its ranks hold different elements; its squares are summed over those groups only.

    Each element of the model is in one stage (pp), one tp slice or, replicated over tp, weighted 1/tp,
    and under ZeRO in one dp shard (dp × cp under context parallelism): the weighted squares are summed over
    pp and tp always, and over dp when the gradients are sharded (DDP's replicas are equal after the all-reduce).
    """
    # --8<-- [start:tour_clip]
    sq = sum(part.grad_sq_norm(tp_norm_weight(part.module, mesh)) for part in parts)
    sharded = {part.grads_sharded for part in parts}
    if len(sharded) != 1:
        raise ValueError("clip_grad_norm_: parts mix dp-sharded (ZeRO) and replicated (DDP) gradients")
    groups = ([mesh.grad_group] if sharded.pop() else []) + [mesh.tp_group, mesh.pp_group]
    norm = global_norm(sq, groups)
    # --8<-- [end:tour_clip]
    if own:                   # each counted once: summed over the groups holding its other elements only
        extra = sum(global_norm(part.grad_sq_norm(), part.norm_groups) ** 2 for part in own)
        norm = (norm * norm + extra) ** 0.5
    coef = clip_coefficient(norm, max_norm)
    if coef < 1.0:
        for part in [*parts, *own]:
            part.scale_grads_(coef)
    return norm
# --8<-- [end:clip]
