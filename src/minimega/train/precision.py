"""Precision policies and the dynamic loss scaler.

A policy names the dtype parameters and gradients are *stored and communicated* in; the optimizer
always works on fp32 master weights (one shard per rank, see `minimega.zero`):

    policy   params / grads   accumulated and reduced in   master + Adam m, v   loss scaling
    fp32     fp32             fp32                         fp32 (the params themselves)   none
    bf16     bf16             fp32 (``main_grad``)         fp32                 none (bf16 has fp32's exponent range)
    fp16     fp16             fp16                         fp32                 dynamic (or a fixed ``loss_scale``)
    fp8      bf16             fp32 (``main_grad``)         fp32                 none; the block linears compute in fp8
                                                                                with per-tensor scales (`minimega.train.fp8`)

bf16 keeps 8 bits of mantissa: summing micro-steps or ranks in bf16 rounds every partial sum to ~0.4%.
As Megatron-LM (``main_grad``) and DeepSpeed do, each backward's bf16 gradient is added into an fp32
buffer and the data-parallel reduction runs on that buffer (`grad_sync.GradSync`); the gradients cost 4
bytes per parameter instead of 2. fp16 keeps DeepSpeed's fp16 default (reduced in fp16, loss-scaled).

fp16's 5-bit exponent underflows small gradients, so the loss is multiplied by a scale S before
backward and gradients are divided by S before the step. `DynamicLossScaler` follows DeepSpeed's
rules (``deepspeed/runtime/fp16/loss_scaler.py``): start at 2^16; an overflow (inf/nan in any
gradient on any rank) skips the step, and shrinks S by 2 once ``hysteresis`` overflows have been
absorbed; after ``window`` clean steps since the last overflow, S doubles (and hysteresis refills);
S never drops below ``min_scale``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


# --8<-- [start:policies]
@dataclass(frozen=True)
class Policy:
    name: str
    param_dtype: torch.dtype
    """Storage dtype of parameters and of each backward's gradients (the masters are always fp32)."""
    loss_scaling: bool = False
    grad_dtype: torch.dtype | None = None
    """The dtype gradients are accumulated (micro-steps) and reduced (dp) in; None: ``param_dtype``."""
    fp8_linears: bool = False
    """The transformer blocks' linears multiply in fp8 (`minimega.train.fp8`); ZeRO-3 gathers their weights in fp8."""

    @property
    def accumulate_dtype(self) -> torch.dtype:
        return self.grad_dtype or self.param_dtype

    @property
    def has_master_copy(self) -> bool:
        """Whether fp32 master weights are a separate copy (not the parameters themselves)."""
        return self.param_dtype != torch.float32


POLICIES = {
    "fp32": Policy("fp32", torch.float32),
    "bf16": Policy("bf16", torch.bfloat16, grad_dtype=torch.float32),
    "fp16": Policy("fp16", torch.float16, loss_scaling=True),
    "fp8": Policy("fp8", torch.bfloat16, grad_dtype=torch.float32, fp8_linears=True),
}
# --8<-- [end:policies]


def policy(name: str) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown precision {name!r}; choose one of {sorted(POLICIES)}")
    return POLICIES[name]


# --8<-- [start:loss_scaler]
class DynamicLossScaler:
    """DeepSpeed's dynamic loss scaler. ``update(overflow)`` after every step; ``scale`` multiplies the loss.

    Args:
        init_scale: the first scale (DeepSpeed: 2 ** initial_scale_power = 2 ** 16).
        window: clean steps (since the last overflow) before the scale doubles (loss_scale_window).
        hysteresis: overflows absorbed before the scale halves (delayed shift).
        min_scale: the floor (min_loss_scale).
        factor: growth and shrink factor.
    """

    def __init__(self, init_scale: float = 2.0 ** 16, window: int = 1000, hysteresis: int = 2,
                 min_scale: float = 1.0, factor: float = 2.0):
        if init_scale <= 0 or window < 1 or hysteresis < 1 or min_scale <= 0 or factor <= 1:
            raise ValueError("DynamicLossScaler: need init_scale > 0, window >= 1, hysteresis >= 1, "
                             "min_scale > 0 and factor > 1")
        self.scale, self.window, self.hysteresis = float(init_scale), window, hysteresis
        self.min_scale, self.factor = float(min_scale), factor
        self.cur_hysteresis = hysteresis
        self.iteration, self.last_overflow = 0, -1
        self.skipped = 0

    # --8<-- [start:scaler_update]
    def update(self, overflow: bool) -> None:
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
    # --8<-- [end:scaler_update]
# --8<-- [end:loss_scaler]

    # --8<-- [start:scaler_state]
    _STATE = ("scale", "cur_hysteresis", "iteration", "last_overflow", "skipped")

    def state_dict(self) -> dict:
        """What a resumed run needs to scale exactly as the straight run: JSON numbers, nothing executable."""
        return {"kind": 1, **{k: getattr(self, k) for k in self._STATE}}

    def load_state_dict(self, state: dict) -> None:
        _check_state(self, state, {"kind": 1, **{k: None for k in self._STATE}})
        self.scale = float(state["scale"])
        self.cur_hysteresis, self.iteration = int(state["cur_hysteresis"]), int(state["iteration"])
        self.last_overflow, self.skipped = int(state["last_overflow"]), int(state["skipped"])
        if not (self.scale > 0 and 1 <= self.cur_hysteresis <= self.hysteresis and self.iteration >= 0):
            raise ValueError(f"loss scaler state {state}: scale must be > 0, cur_hysteresis in "
                             f"[1, {self.hysteresis}], iteration >= 0")
    # --8<-- [end:scaler_state]


class StaticLossScaler:
    """A fixed scale (DeepSpeed's ``fp16.loss_scale > 0``): overflowing steps are still skipped."""

    def __init__(self, scale: float):
        self.scale, self.skipped = float(scale), 0

    def update(self, overflow: bool) -> None:
        self.skipped += int(overflow)

    def state_dict(self) -> dict:
        return {"kind": 0, "scale": self.scale, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        _check_state(self, state, {"kind": 0, "scale": None, "skipped": None})
        if float(state["scale"]) != self.scale:
            raise ValueError(f"loss scaler state: saved with loss_scale={state['scale']}, this run uses {self.scale}")
        self.skipped = int(state["skipped"])


def _check_state(scaler, state: dict, fields: dict) -> None:
    """``state`` has exactly ``fields`` (numbers; ``kind`` equal) or a one-line refusal."""
    kind = {0: "a static", 1: "a dynamic"}
    if set(state) != set(fields) or state.get("kind") != fields["kind"]:
        raise ValueError(f"loss scaler state {sorted(state)} (kind {state.get('kind')!r}) is not "
                         f"{kind[fields['kind']]} scaler's {sorted(fields)}: saved with another fp16 loss_scale setting")


def make_scaler(policy: Policy, config=None):
    """The scaler a policy needs (fp16), or None (fp32, bf16); settings from a `TrainConfig` when given."""
    if not policy.loss_scaling:
        return None
    if config is None:
        return DynamicLossScaler()
    if config.loss_scale > 0:
        return StaticLossScaler(config.loss_scale)
    return DynamicLossScaler(init_scale=2.0 ** config.initial_scale_power, window=config.loss_scale_window,
                             hysteresis=config.hysteresis, min_scale=config.min_loss_scale)


def has_overflow(tensors) -> bool:
    """Whether any tensor holds an inf or a nan (this rank only; callers reduce the flag over ranks)."""
    return any(not torch.isfinite(t).all() for t in tensors)
