"""Collectives as autograd sees them: the all-to-all under Ulysses (over cp) and the experts' dispatch (over ep).

Chunk j of dim 0 goes to rank j, and rank i's output chunk j is rank j's input chunk i: the exchange is a
permutation of equal chunks, its own transpose, so the backward is the same all-to-all of the gradient.
"""
from __future__ import annotations

import torch

from .. import comm
from . import Group


# --8<-- [start:all_to_all]
class _AllToAll(torch.autograd.Function):
    """Forward: all-to-all over `group` (chunk j of dim 0 to rank j). Backward: the same all-to-all of the gradient."""

    @staticmethod
    def forward(ctx, x, group, tag):             # x: (n, ...), chunk j for rank j of the group
        ctx.group, ctx.tag = group, tag
        x = x.contiguous()                       # the wire reads and writes flat memory: no strided views
        return comm.all_to_all(torch.empty_like(x), x, group, tag=tag)

    @staticmethod
    def backward(ctx, grad):                     # grad: often a strided view of the next op's output
        grad = grad.contiguous()
        return comm.all_to_all(torch.empty_like(grad), grad, ctx.group, tag=ctx.tag + "_grad"), None, None
# --8<-- [end:all_to_all]


def exchange(x: torch.Tensor, group: Group, tag: str) -> torch.Tensor:
    """All-to-all of ``x`` over ``group`` (dim 0 has one chunk per rank), differentiable."""
    return _AllToAll.apply(x, group, tag)
