"""Reference solution to ``labs/exercises/tp_regions.py``."""
from __future__ import annotations

import torch

from minimega import comm


class CopyToTP(torch.autograd.Function):
    """`f`: forward identity, backward all-reduce (sum) over ``group``."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)                       # a new tensor object, no copy; autograd needs an output

    @staticmethod
    def backward(ctx, grad):                      # X̄ = Σ_r Ȳ_r A_r^T: every rank holds one term
        return comm.all_reduce(grad.clone(), ctx.group), None


class ReduceFromTP(torch.autograd.Function):
    """`g`: forward all-reduce (sum) over ``group``, backward identity."""

    @staticmethod
    def forward(ctx, x, group):                   # Y = Σ_r X_r A_r
        return comm.all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, grad):                      # Ȳ is already replicated: each rank passes it on
        return grad, None
