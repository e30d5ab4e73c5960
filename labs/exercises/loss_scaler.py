"""Exercise (lab 04-mixed-precision): the dynamic loss scaler's update rule.

fp16 has a 5-bit exponent: gradients below ~6e-8 become zero. So the loss is multiplied by a scale S before
backward (the gradients grow by S) and the gradients are divided by S before the step. If S is too large, some
gradient overflows to inf: that step is skipped and S should shrink; if it has been fine for a while, S can grow.
DeepSpeed's rule (which `minimega.train.precision.DynamicLossScaler` follows), called once after every step:

    overflow:  the step is skipped (count it in ``skipped``) and the overflow is remembered (``last_overflow``).
               S is divided by ``factor`` only when the hysteresis is used up: if ``cur_hysteresis`` is 1
               (or ``hysteresis`` is 1), S = max(S / factor, min_scale); otherwise ``cur_hysteresis`` drops by one.
    no overflow: when the number of steps since the last overflow, ``iteration - last_overflow``, is a
               multiple of ``window``, S is multiplied by ``factor`` and ``cur_hysteresis`` refills to ``hysteresis``.
    either way, ``iteration`` grows by one.

Complete ``update``; ``__init__`` is given. The lab's check runs yours next to minimega's on many sequences of
overflows and compares the scale after every step.
"""
from __future__ import annotations


class LossScaler:
    """S, the loss scale, and the state its update rule needs."""

    def __init__(self, init_scale: float = 2.0 ** 16, window: int = 1000, hysteresis: int = 2,
                 min_scale: float = 1.0, factor: float = 2.0):
        self.scale, self.window, self.hysteresis = float(init_scale), window, hysteresis
        self.min_scale, self.factor = float(min_scale), factor
        self.cur_hysteresis = hysteresis
        self.iteration, self.last_overflow = 0, -1
        self.skipped = 0

    def update(self, overflow: bool) -> None:
        """Apply the rule above after one step; ``overflow``: some gradient on some rank was inf or nan."""
        raise NotImplementedError("exercise: complete LossScaler.update in labs/exercises/loss_scaler.py")
