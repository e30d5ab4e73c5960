"""Exercise (lab 06-activation-checkpointing): a checkpoint that keeps only a block's input.

Complete the autograd Function `Checkpoint`, used as ``y = Checkpoint.apply(block, x)``:

    forward:   run ``fn(x)`` without recording a graph (autograd is already off inside a Function's forward);
               save only ``x`` — and the RNG state, so dropout can replay the same masks.
    backward:  restore the RNG state (inside ``torch.random.fork_rng()`` so training's RNG stream moves on
               untouched), recompute ``fn`` on a detached copy of ``x`` *with* autograd enabled, backpropagate
               ``grad`` through it, and return one gradient per forward input: ``(None, x's gradient)``.

Then run the check cell of the lab: it compares your checkpointed GPT block with the plain one (output and every
gradient, with and without dropout) and counts the bytes your version keeps for backward.
"""
from __future__ import annotations

import torch


class Checkpoint(torch.autograd.Function):
    """Forward: ``fn(x)`` keeping only ``x`` (and the RNG state). Backward: recompute ``fn``, then backpropagate."""

    @staticmethod
    def forward(ctx, fn, x: torch.Tensor) -> torch.Tensor:      # x: (B, T, D)
        raise NotImplementedError("exercise: complete Checkpoint.forward in labs/exercises/checkpoint.py")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):                      # grad: (B, T, D)
        raise NotImplementedError("exercise: complete Checkpoint.backward in labs/exercises/checkpoint.py")
