"""Reference solution to ``labs/exercises/checkpoint.py``."""
from __future__ import annotations

import torch


class Checkpoint(torch.autograd.Function):
    """Forward: ``fn(x)`` keeping only ``x`` (and the RNG state). Backward: recompute ``fn``, then backpropagate."""

    @staticmethod
    def forward(ctx, fn, x):
        ctx.fn, ctx.rng = fn, torch.get_rng_state()
        ctx.save_for_backward(x)
        return fn(x)                                  # autograd is off here: nothing inside fn is kept

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        x = x.detach().requires_grad_()
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(ctx.rng)              # the same dropout masks as the first forward
            with torch.enable_grad():
                out = ctx.fn(x)
        torch.autograd.backward(out, grad)            # fills the parameters' .grad and x.grad
        return None, x.grad
