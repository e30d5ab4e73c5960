"""Exercise (lab 07-tensor-parallel): Megatron's two communication regions, `f` and `g`.

An MLP split over tp ranks (arXiv:1909.08053 §3):

    x (B, T, D), replicated ─ f ─► fc, column-parallel: W1 rows split → GELU → proj, row-parallel: W2 columns split ─ g ─► y

    f: forward identity,            backward all-reduce (sum) of the gradient over tp
    g: forward all-reduce (sum),    backward identity

Complete both autograd Functions with `minimega.comm.all_reduce(tensor, group)` (an in-place sum: clone first,
autograd's tensors must not be overwritten), then run the check cell of the lab: it runs a 2-rank
tensor-parallel MLP built with your `f` and `g` and compares its output and every gradient with the unsplit MLP.
"""
from __future__ import annotations

import torch

from minimega import comm


class CopyToTP(torch.autograd.Function):
    """`f`: forward identity, backward all-reduce (sum) over ``group``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: comm.Group) -> torch.Tensor:   # x: (B, T, D), same on every rank
        raise NotImplementedError("exercise: complete CopyToTP.forward in labs/exercises/tp_regions.py")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):                                   # grad: (B, T, D), this rank's part
        raise NotImplementedError("exercise: complete CopyToTP.backward in labs/exercises/tp_regions.py")


class ReduceFromTP(torch.autograd.Function):
    """`g`: forward all-reduce (sum) over ``group``, backward identity."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: comm.Group) -> torch.Tensor:   # x: (B, T, D), partial sums
        raise NotImplementedError("exercise: complete ReduceFromTP.forward in labs/exercises/tp_regions.py")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):                                   # grad: (B, T, D), same on every rank
        raise NotImplementedError("exercise: complete ReduceFromTP.backward in labs/exercises/tp_regions.py")
