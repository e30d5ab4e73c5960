"""FP8 linears with per-tensor delayed scaling (Transformer Engine's ``DelayedScaling`` recipe).

Two 8-bit formats (Micikevicius et al., "FP8 Formats for Deep Learning", arXiv:2209.05433):

    format   bits (sign, exponent, mantissa)   largest   smallest subnormal   used for
    E4M3     1, 4, 3                           448       2^-9                 weights and activations (forward)
    E5M2     1, 5, 2                           57344     2^-16                gradients (backward)

TE calls this mix ``Format.HYBRID``. Eight bits leave too little range for raw values: a gradient of 1e-6
is below E5M2's smallest subnormal and becomes 0. So every tensor is multiplied by a scale before the cast
and divided by it after: ``q = cast(x · s)``, ``x ≈ q / s``. The scale comes from the tensor's history:

    amax_history   the last ``history_len`` values of max|x| (slot 0: the current step)
    scale          (fp8 max / max(amax_history)) / 2^margin      (kept as it was while the history is all 0)

updated once per optimizer step (`update_scales`), after which the history rolls by one and slot 0 is
zeroed: TE's ``DelayedScaling(margin=0, amax_history_len=1024, amax_compute_algo="max")`` defaults and its
``nvte_delayed_scaling_recipe_amax_and_scale_update``. "Delayed": step t casts with a scale computed from
steps before t, so the cast never waits for a reduction over the tensor it casts; a tensor whose amax
jumps past the history's saturates at ±fp8 max for a step (the cast clamps). The histories and scales
live on the tensors' device and are read and written by device ops only (no ``.cpu()``, ``.item()`` or
``if tensor``), so no cast waits for the host either; an evaluation step (no grad) records nothing.

`Fp8Linear` keeps three scaling states (input, weight, output gradient). On the CPU the matmuls are
emulated: cast to fp8 and back (the rounding is real), multiply in fp32. On CUDA, where
``torch._scaled_mm`` exists and the shapes allow it, the forward runs on the fp8 tensor cores (not
tested here: this machine has no GPU). `convert` turns the block linears of a `model.GPT` into
`Fp8Linear`s; the embeddings, LayerNorms and head stay bf16 (TE's usual recipe too).
"""
from __future__ import annotations

import torch
import torch.nn as nn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {E4M3: torch.finfo(E4M3).max, E5M2: torch.finfo(E5M2).max}     # 448, 57344


# --8<-- [start:delayed_scaling]
class DelayedScaling:
    """One tensor's amax history and scale. ``observe(x)`` during the step, ``update()`` after it.

    Args:
        dtype: the fp8 format this tensor is cast to (E4M3 or E5M2).
        history_len: steps of amax kept (TE's ``amax_history_len``, default 1024).
        margin: the scale leaves 2^margin of headroom below fp8 max (TE's ``margin``, default 0).
    """

    def __init__(self, dtype: torch.dtype, history_len: int = 1024, margin: int = 0):
        if dtype not in FP8_MAX or history_len < 1 or margin < 0:
            raise ValueError(f"DelayedScaling: dtype must be E4M3 or E5M2, history_len >= 1, margin >= 0; "
                             f"got {dtype}, {history_len}, {margin}")
        self.dtype, self.margin = dtype, margin
        self.amax_history = torch.zeros(history_len)
        self.scale = torch.ones(())

    def observe(self, x: torch.Tensor) -> None:
        """Fold max|x| into this step's slot (a step may cast a tensor several times: micro-steps).

        On x's device, in place: no value comes back to the host, so the cast never waits for it. The
        history and the scale follow the tensors to their device on the first cast (one copy, once)."""
        if self.amax_history.device != x.device:
            self.amax_history, self.scale = self.amax_history.to(x.device), self.scale.to(x.device)
        slot = self.amax_history[:1]
        torch.maximum(slot, x.detach().abs().max().float().reshape(1), out=slot)

    def update(self) -> None:
        """The recipe: scale from the history's max, then roll the history by one and zero the new slot.
        Device ops only (an empty or non-finite history keeps the scale, chosen by ``where``, not by an ``if``)."""
        amax = self.amax_history.max()
        fresh = FP8_MAX[self.dtype] / amax / 2.0 ** self.margin
        self.scale = torch.where(torch.isfinite(amax) & (amax > 0), fresh, self.scale)
        self.amax_history = self.amax_history.roll(-1)
        self.amax_history[:1].zero_()
# --8<-- [end:delayed_scaling]


# --8<-- [start:quantize]
def quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x · scale`` cast to fp8 (saturating at ±fp8 max: the cast alone would give NaN in E4M3)."""
    limit = FP8_MAX[dtype]
    return (x.float() * scale.to(x.device)).clamp(-limit, limit).to(dtype)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The wide value an fp8 tensor stands for: ``q / scale``."""
    return (q.float() / scale.to(q.device)).to(dtype)
# --8<-- [end:quantize]


def _scaled_mm_ok(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch._scaled_mm runs fp8 x fp8 on CUDA with every dimension a multiple of 16."""
    return (a.is_cuda and hasattr(torch, "_scaled_mm") and a.dtype != E5M2
            and all(d % 16 == 0 for d in (*a.shape, b.shape[0])))


def fp8_matmul(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
               out_dtype: torch.dtype) -> torch.Tensor:
    """``(a / sa) @ (b / sb).T`` for fp8 ``a`` (M, K) and ``b`` (N, K), in ``out_dtype``.

    CUDA: ``torch._scaled_mm`` (its second operand column-major, its scales the inverse ones). Elsewhere:
    dequantize and multiply in fp32, the emulation.
    """
    if _scaled_mm_ok(a, b):       # not exercised on this machine (no GPU)
        one = torch.ones((), device=a.device)
        return torch._scaled_mm(a.contiguous(), b.contiguous().t(), scale_a=one / sa.to(a.device),
                                scale_b=one / sb.to(a.device), out_dtype=out_dtype)
    return (dequantize(a, sa) @ dequantize(b, sb).t()).to(out_dtype)


# --8<-- [start:fp8_linear_fn]
class _Fp8LinearFn(torch.autograd.Function):
    """Forward: Y = X W^T with X, W in E4M3. Backward: dY in E5M2; dX = dY W, dW = dY^T X (the saved fp8 X)."""

    @staticmethod
    def forward(ctx, x, weight, bias, meta, record=True):    # x: (M, K), weight: (N, K)
        if record:                                  # training steps only: evaluation leaves the history alone
            meta.input.observe(x)
            meta.weight.observe(weight)
        sx, sw = meta.input.scale, meta.weight.scale
        xq, wq = quantize(x, sx, E4M3), quantize(weight, sw, E4M3)
        ctx.save_for_backward(xq, wq, sx, sw)
        ctx.meta, ctx.has_bias, ctx.dtypes = meta, bias is not None, (x.dtype, weight.dtype)
        y = fp8_matmul(xq, sx, wq, sw, x.dtype)                             # (M, N)
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, grad):                        # grad: (M, N)
        xq, wq, sx, sw = ctx.saved_tensors
        meta = ctx.meta
        meta.grad_output.observe(grad)
        sg = meta.grad_output.scale
        gq = quantize(grad, sg, E5M2)
        g = dequantize(gq, sg)                                              # (M, N), E5M2's rounding
        grad_x = (g @ dequantize(wq, sw)).to(ctx.dtypes[0])                 # (M, K)
        grad_w = (g.t() @ dequantize(xq, sx)).to(ctx.dtypes[1])             # (N, K)
        grad_b = grad.sum(0) if ctx.has_bias else None                      # from the wide gradient, as TE
        return grad_x, grad_w, grad_b, None, None
# --8<-- [end:fp8_linear_fn]


class Fp8Meta:
    """The three scaling states of one linear: input and weight in E4M3, the output gradient in E5M2."""

    def __init__(self, history_len: int = 1024, margin: int = 0):
        self.input = DelayedScaling(E4M3, history_len, margin)
        self.weight = DelayedScaling(E4M3, history_len, margin)
        self.grad_output = DelayedScaling(E5M2, history_len, margin)

    def states(self) -> tuple[DelayedScaling, ...]:
        return self.input, self.weight, self.grad_output

    def update(self) -> None:
        for state in self.states():
            state.update()


class Fp8Linear(nn.Linear):
    """``nn.Linear`` whose matmuls run in fp8 (`_Fp8LinearFn`); parameters stay in their own dtype."""

    fp8: Fp8Meta

    def forward(self, x: torch.Tensor) -> torch.Tensor:               # x: (..., K)
        y = _Fp8LinearFn.apply(x.reshape(-1, x.shape[-1]), self.weight, self.bias, self.fp8, torch.is_grad_enabled())
        return y.view(*x.shape[:-1], y.shape[-1])                      # (..., N)


def convert(model: nn.Module, history_len: int = 1024, margin: int = 0) -> list[Fp8Linear]:
    """Turn every ``nn.Linear`` inside ``model.blocks`` into an `Fp8Linear` (in place, same parameters).

    Only plain ``nn.Linear`` is converted; anything else named like a linear (tensor-parallel layers) is
    refused, so no block linear is silently left wide.
    """
    out = []
    for name, m in model.blocks.named_modules():
        if type(m) is nn.Linear:
            m.__class__ = Fp8Linear
            m.fp8 = Fp8Meta(history_len, margin)
            out.append(m)
        elif "Linear" in type(m).__name__ and not isinstance(m, Fp8Linear):
            raise ValueError(f"fp8: blocks.{name} is a {type(m).__name__}, not an nn.Linear; fp8 converts "
                             f"the plain linears only (use tp=1)")
    return out


def fp8_linears(module: nn.Module) -> list[Fp8Linear]:
    return [m for m in module.modules() if isinstance(m, Fp8Linear)]


def update_scales(modules) -> None:
    """After each optimizer step: every fp8 linear's scales from its histories (the delayed recipe)."""
    for module in modules:
        for m in fp8_linears(module):
            m.fp8.update()

