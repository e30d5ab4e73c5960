"""Activation checkpointing: keep less of the forward pass, recompute the rest during backward.

    full       every ``every``-th block keeps only its input (B, T, D); its whole forward is redone in backward
    selective  every block drops what the attention core saves and redoes only the core
               (softmax(QKᵀ/√hs)V: little compute, much memory at long T; Korthikanti et al. 2022, arXiv:2205.05198)

Recomputation must replay the same dropout masks, so `checkpoint` saves the RNG state (CPU, and the
current CUDA device's when the inputs live there) and every tensor-parallel stream (`minimega.parallel.rng`)
before the first forward and restores them, in a fork so the training streams move on untouched,
before the replay.

How many bytes each mode keeps is `minimega.analysis.activations.gpt_activation_bytes_per_layer` (next to
Korthikanti's table there); `saved_activation_bytes` measures it, and the tests compare the two.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..model import GPT
from ..parallel.rng import live_streams

MODES = ("none", "full", "selective")


# --8<-- [start:checkpoint]
class _Checkpoint(torch.autograd.Function):
    """Forward: run ``fn`` without recording the graph; save only the inputs and the RNG state.
    Backward: restore the RNG state, run ``fn`` again with the graph, and backpropagate through it."""

    @staticmethod
    # --8<-- [start:checkpoint_forward]
    def forward(ctx, fn, *inputs):
        ctx.fn = fn
        ctx.cuda = any(t.is_cuda for t in inputs if torch.is_tensor(t))
        ctx.cpu_rng = torch.get_rng_state()
        ctx.cuda_rng = torch.cuda.get_rng_state() if ctx.cuda else None
        ctx.streams = [(s, s.state) for s in live_streams()]     # tensor-parallel dropout streams too
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return fn(*inputs)
    # --8<-- [end:checkpoint_forward]

    @staticmethod
    def backward(ctx, grad):
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        devices = [torch.cuda.current_device()] if ctx.cuda else []
        streams_now = [(s, s.state) for s, _ in ctx.streams]
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(ctx.cpu_rng)
            if ctx.cuda:
                torch.cuda.set_rng_state(ctx.cuda_rng)
            for stream, state in ctx.streams:
                stream.state = state
            with torch.enable_grad():
                out = ctx.fn(*inputs)
        for stream, state in streams_now:                        # the streams move on as if not replayed
            stream.state = state
        torch.autograd.backward(out, grad)
        return (None, *(t.grad if t.requires_grad else None for t in inputs))


def checkpoint(fn, *inputs: torch.Tensor) -> torch.Tensor:
    """``fn(*inputs)`` (one tensor out), keeping only ``inputs`` for backward; dropout replays exactly."""
    if not torch.is_grad_enabled():
        return fn(*inputs)
    return _Checkpoint.apply(fn, *inputs)
# --8<-- [end:checkpoint]


def apply_activation_checkpointing(model: GPT, mode: str, every: int = 1) -> GPT:
    """Wrap ``model``'s blocks in place (parameter names unchanged) and return it.

    Args:
        model: a `model.GPT` (or its tensor-parallel form): anything with ``blocks`` whose ``attn.core`` exists.
        mode: "none", "full" (checkpoint every ``every``-th block) or "selective" (every block's attention core).
        every: with "full", checkpoint blocks 0, every, 2·every, … (1: all of them).
    """
    if mode not in MODES:
        raise ValueError(f"activation_checkpointing={mode!r}: choose one of {MODES}")
    if every < 1:
        raise ValueError(f"checkpoint_every={every} must be >= 1")
    for i, block in enumerate(model.blocks):
        if mode == "full" and i % every == 0:
            block.forward = _bind(checkpoint, type(block).forward.__get__(block))
        elif mode == "selective":
            block.attn.core = _bind(checkpoint, block.attn.core)
    return model


def _bind(wrapper, fn):
    def run(*inputs):
        return wrapper(fn, *inputs)
    return run


def saved_activation_bytes(module: nn.Module, *inputs: torch.Tensor) -> int:
    """Bytes autograd keeps for backward when ``module(*inputs)`` runs: every tensor saved for backward,
    deduplicated by storage (views of one buffer count once), parameters excluded, inputs included."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(*inputs)
    del out
    return sum(seen.values())
