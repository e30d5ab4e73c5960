"""Reference solution to ``labs/exercises/loss_scaler.py``."""
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
        """Shrink after the hysteresis is used up; grow after ``window`` clean steps since the last overflow."""
        if overflow:
            if self.cur_hysteresis == 1 or self.hysteresis == 1:
                self.scale = max(self.scale / self.factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow = self.iteration
            self.skipped += 1
        elif (self.iteration - self.last_overflow) % self.window == 0:
            self.scale *= self.factor
            self.cur_hysteresis = self.hysteresis
        self.iteration += 1
