"""Step observers: what watches a training step without being the step.

`Engine.train_step` reads as the step itself: shard the batch; per micro-step forward, backward, finish the
gradient sync; clip; step; zero the gradients. What only watches it hangs here, as the collectives' watchers
hang on `comm.observers`, and is called at the step's named points:

    StepEvents      the engine's timeline: step_start, forward_start / backward_start / backward_end per
                    micro-step, optimizer_start, optimizer_step_end, step_end
    CommPerStep     the communication log around the step, and the bytes each step sent (`Engine.comm_per_step`)
    MemoryWatch     the bytes held at the step (steps 0 and 1, the first of a resumed run, and when asked with
                    `Engine.track_peak`) and the peak bytes (`TrainConfig.memory_peak_steps`)
    BeforeStep      the caller's callables once the gradients are final (`Engine.before_step`), and the
                    `Engine.step_guard` (`health.StepGuard`), which may veto the optimizer step

Each observer may implement any of ``context(engine)`` (entered around the step), ``notify(engine, point,
**info)`` and ``allow_step(engine, loss, norm) -> bool``.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext

from .. import comm


class StepEvents:
    """The timeline: every named point of the step, stamped by the engine's clock (CUDA events on a GPU)."""

    def notify(self, engine, point: str, **info) -> None:
        engine.timeline.append({"event": point, "time": engine.clock.stamp(), "step": engine.step, **info})


class CommPerStep:
    """The step runs inside the communication log (with `TrainConfig.overlap_comm`); the bytes it sent are kept."""

    def context(self, engine):
        return _comm_context(engine)

    def notify(self, engine, point: str, **info) -> None:
        if point == "step_start":
            self._sent = engine.comm_log.total_sent()
        elif point == "optimizer_step_end":
            engine.comm_per_step.append(engine.comm_log.total_sent() - self._sent)


@contextmanager
def _comm_context(engine):
    with engine.comm_log, comm.overlap(engine.config.overlap_comm):
        yield


class MemoryWatch:
    """Bytes at the step in steps 0 and 1 (the second is steady) and whenever asked; peaks (costly: sampled after
    every op) in the first `memory_peak_steps` steps and whenever asked."""

    def __init__(self):
        self.asked = 0                                   # steps left to watch (`Engine.track_peak`)

    def context(self, engine):
        peaks = engine.step < engine.config.memory_peak_steps or self.asked > 0
        self._watch = engine.step < 2 or self.asked > 0 or not engine.memory_at_step
        self.asked = max(0, self.asked - 1)
        return engine.peak_tracker.track() if peaks else nullcontext()

    def notify(self, engine, point: str, **info) -> None:
        if point == "optimizer_step_end" and self._watch:     # params, grads and optimizer states all live
            engine.memory_at_step = engine.memory()


class BeforeStep:
    """`Engine.before_step` callables, then `Engine.step_guard`: False skips the optimizer step."""

    def allow_step(self, engine, loss, norm) -> bool:
        for observe in engine.before_step:
            observe(engine)
        return engine.step_guard is None or engine.step_guard(engine.step, loss(), engine.grad_norm() if norm is None else norm)


class StepObservers:
    """The observers of one engine, called in order at each point of the step."""

    def __init__(self, observers: list):
        self.observers = list(observers)

    @contextmanager
    def step(self, engine):
        """Around one step: every observer's context, and the step_start / step_end points."""
        with ExitStack() as stack:
            for o in self.observers:
                if hasattr(o, "context"):
                    stack.enter_context(o.context(engine))
            self.notify(engine, "step_start")
            yield self
        self.notify(engine, "step_end")

    def notify(self, engine, point: str, **info) -> None:
        for o in self.observers:
            if hasattr(o, "notify"):
                o.notify(engine, point, **info)

    def allow_step(self, engine, loss, norm) -> bool:
        """Whether every observer lets the optimizer step (``loss``: a callable, the global loss is a collective)."""
        return all([o.allow_step(engine, loss, norm) for o in self.observers if hasattr(o, "allow_step")])
