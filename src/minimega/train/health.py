"""Health of a run: a monitor on every step, and what to do when a step looks wrong.

Large runs watch every step before applying it. BLOOM, OPT and PaLM all met loss spikes and answered them the
same way: go back to a checkpoint from before the spike and skip the batches around it. The monitor looks at
two numbers every rank already agrees on, the global mean loss and the global gradient norm, so every rank
reaches the same verdict without a further collective:

    non-finite     loss or gradient norm is NaN or inf
    loss spike     z = (loss - mean) / std over the last ``window`` healthy steps exceeds ``z``
    grad outlier   the same z-score for the gradient norm
    throughput     this rank's tokens/s below ``fraction`` of the median of its last steps (`ThroughputWatch`;
                   always the 'warn' policy: a slow step is not a wrong one)

and answers with a policy:

    warn       log it and apply the step
    skip       do not apply the step (the gradients are dropped); the batch is spent
    rollback   do not apply the step; the trainer reloads the last good checkpoint and skips the offending
               batches (``minimega train --on-spike rollback --skip-batches N``)

The engine asks the monitor between the gradient sync and the optimizer step (`Engine.step_guard`).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

POLICIES = ("warn", "skip", "rollback")


@dataclass(frozen=True)
class Verdict:
    """What was wrong with one step, with the evidence."""
    step: int
    kind: str
    """'non-finite loss', 'non-finite gradients', 'loss spike', 'grad-norm outlier' or 'throughput drop'."""
    value: float
    mean: float | None = None
    std: float | None = None
    z: float | None = None
    window: int = 0
    """Healthy steps the mean and std were taken over (a throughput drop: steps the median was taken over)."""
    median: float | None = None
    fraction: float | None = None
    """A throughput drop: the value is below ``fraction`` times the ``median``."""

    def describe(self) -> str:
        if self.median is not None:
            return (f"step {self.step}: {self.kind}: {self.value:.4g} tokens/s is below {self.fraction:g} x the "
                    f"median {self.median:.4g} tokens/s of the last {self.window} steps")
        if self.z is None:
            return f"step {self.step}: {self.kind} ({self.value})"
        return (f"step {self.step}: {self.kind}: {self.value:.4g} is {self.z:.1f} std above the mean "
                f"{self.mean:.4g} (std {self.std:.3g}) of the last {self.window} healthy steps")

    def as_dict(self) -> dict:
        return {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in asdict(self).items()}


# --8<-- [start:monitor]
@dataclass
class HealthMonitor:
    """Flags a step whose loss or gradient norm is non-finite or a z-score outlier over recent healthy steps."""
    window: int = 50
    """Healthy steps the mean and std are taken over."""
    z: float = 6.0
    """Flag at this many standard deviations above the mean."""
    min_history: int = 10
    """No z-score before this many healthy steps (the first steps' loss falls fast)."""
    history: list = field(default_factory=list)
    """(step, loss, grad_norm) of the healthy steps, newest last."""

    def __post_init__(self):
        if self.window < 2 or self.min_history < 2 or self.min_history > self.window or not self.z > 0:
            raise ValueError(f"HealthMonitor(window={self.window}, z={self.z}, min_history={self.min_history}): "
                             "need 2 <= min_history <= window and z > 0")

    def check(self, step: int, loss: float, grad_norm: float | None) -> Verdict | None:
        """The verdict on a step (None: healthy, and remembered as such)."""
        if not math.isfinite(loss):
            return Verdict(step, "non-finite loss", loss)
        if grad_norm is not None and not math.isfinite(grad_norm):
            return Verdict(step, "non-finite gradients", grad_norm)
        recent = self.history[-self.window:]
        if len(recent) >= self.min_history:
            for kind, i, value in (("loss spike", 1, loss), ("grad-norm outlier", 2, grad_norm)):
                if value is None:
                    continue
                xs = [h[i] for h in recent]
                mean, std = statistics.fmean(xs), statistics.pstdev(xs)
                z = (value - mean) / max(std, 1e-12 * max(1.0, abs(mean)))
                if z > self.z:
                    return Verdict(step, kind, value, mean, std, z, len(recent))
        self.history.append((step, loss, grad_norm))
        del self.history[:-self.window]
        return None
    # --8<-- [end:monitor]

    def forget_after(self, step: int) -> None:
        """A rollback to ``step``: the steps after it never happened."""
        self.history[:] = [h for h in self.history if h[0] < step]


# --8<-- [start:throughput]
@dataclass
class ThroughputWatch:
    """Flags a step whose tokens/s fell below ``fraction`` of the median of the last ``window`` steps.

    Every step joins the window, slow ones too: a run that stays slower (a new phase, a smaller batch) stops
    being flagged once the median has followed it."""
    fraction: float = 0.5
    window: int = 20
    min_history: int = 5
    """No verdict before this many steps (the first ones include warm-up)."""
    history: list = field(default_factory=list)

    def __post_init__(self):
        if not 0 < self.fraction < 1 or self.window < 2 or not 1 <= self.min_history <= self.window:
            raise ValueError(f"ThroughputWatch(fraction={self.fraction}, window={self.window}, min_history="
                             f"{self.min_history}): need 0 < fraction < 1 and 1 <= min_history <= window, window >= 2")

    def check(self, step: int, tokens_per_s: float) -> Verdict | None:
        recent = self.history[-self.window:]
        self.history.append(tokens_per_s)
        del self.history[:-self.window]
        if len(recent) < self.min_history:
            return None
        median = statistics.median(recent)
        if tokens_per_s < self.fraction * median:
            return Verdict(step, "throughput drop", tokens_per_s, window=len(recent), median=median,
                           fraction=self.fraction)
        return None
# --8<-- [end:throughput]


class StepGuard:
    """`Engine.step_guard`: ask the monitor, apply the policy; ``verdicts`` keeps every flagged step.

    Returns True to apply the step. ``latest`` is the verdict on the last step asked about (None: healthy); under
    'rollback' the trainer acts on it."""

    def __init__(self, monitor: HealthMonitor, policy: str):
        if policy not in POLICIES:
            raise ValueError(f"on_spike={policy!r}: expected one of {', '.join(POLICIES)}")
        self.monitor, self.policy = monitor, policy
        self.verdicts: list[Verdict] = []
        self.latest: Verdict | None = None
        self.last: tuple = (None, None)
        """(loss, grad_norm) of the last step asked about."""

    def __call__(self, step: int, loss: float, grad_norm: float | None) -> bool:
        self.last = (loss, grad_norm)
        self.latest = verdict = self.monitor.check(step, loss, grad_norm)
        if verdict is None:
            return True
        self.verdicts.append(verdict)
        return self.policy == "warn"
