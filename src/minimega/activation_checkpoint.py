"""Activation checkpointing: keep less of the forward pass, recompute the rest during backward.

    full       every ``every``-th block keeps only its input (B, T, D); its whole forward is redone in backward
    selective  every block drops what the attention core saves and redoes only the core
               (softmax(QKᵀ/√hs)V: little compute, much memory at long T; Korthikanti et al. 2022, arXiv:2205.05198)

Recomputation must replay the same dropout masks, so `checkpoint` saves the RNG state (CPU, and the
current CUDA device's when the inputs live there) before the first forward and restores it, in a
fork so the training RNG stream moves on untouched, before the replay.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .model import GPT

MODES = ("none", "full", "selective")


# --8<-- [start:checkpoint]
class _Checkpoint(torch.autograd.Function):
    """Forward: run ``fn`` without recording the graph; save only the inputs and the RNG state.
    Backward: restore the RNG state, run ``fn`` again with the graph, and backpropagate through it."""

    @staticmethod
    def forward(ctx, fn, *inputs):
        ctx.fn = fn
        ctx.cuda = any(t.is_cuda for t in inputs if torch.is_tensor(t))
        ctx.cpu_rng = torch.get_rng_state()
        ctx.cuda_rng = torch.cuda.get_rng_state() if ctx.cuda else None
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return fn(*inputs)

    @staticmethod
    def backward(ctx, grad):
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        devices = [torch.cuda.current_device()] if ctx.cuda else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(ctx.cpu_rng)
            if ctx.cuda:
                torch.cuda.set_rng_state(ctx.cuda_rng)
            with torch.enable_grad():
                out = ctx.fn(*inputs)
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


# --8<-- [start:activation_bytes]
def activation_bytes_per_layer(b: int, s: int, h: int, a: int, *, tp: int = 1, sp: bool = False,
                               mode: str = "none", dtype_bytes: int = 4, dropout: bool = False,
                               attention: str = "math", mask_bytes: int | None = None) -> float:
    """Bytes one block of *this* GPT keeps for backward, per tp rank (Korthikanti et al. 2022, Table 2, adapted).

    Korthikanti counts sbh(34 + 5as/h) with 2-byte activations and 1-byte dropout masks. Written per element
    (e = ``dtype_bytes``, m = ``mask_bytes``: e for PyTorch's CPU dropout, 1 for its CUDA kernel), a block keeps:

        replicated region   LN inputs 2·sbh·e, their mean and rstd 4·sb·4 B (fp32), and with dropout two residual
                            masks 2·sbh·m: all /t under sequence parallelism.
                            The inputs of qkv and fc, 2·sbh·e, stay whole: the column-parallel matmul keeps the
                            gathered input (Megatron re-gathers instead; we trade that all-gather for memory).
        split over tp       qkv output 3·sbh·e (q, k, v are views of it), proj input sbh·e, fc output 4·sbh·e,
                            GELU output 4·sbh·e: 12·sbh·e / t.
        attention core      "math": softmax as²b·e, with dropout also its mask as²b·m and output as²b·e;
                            "flash" (fused, no dropout): only the log-sum-exp, asb·4 B; all /t (heads split).

    With e = 2, m = 1, dropout and "math" this is Table 2's tensor-parallel row sbh(10 + 24/t + 5as/(ht)) exactly
    (t = 1: sbh(34 + 5as/h)), plus 16sb for the LayerNorm statistics the paper neglects. With sequence
    parallelism it is sbh(4 + 30/t + 5as/(ht)) rather than sbh(34/t + 5as/(ht)): the 4 is the kept gathered input.
    ``mode="selective"`` drops the attention-core term; ``mode="full"`` keeps only the block input sbh·e (/t with SP).
    """
    m = dtype_bytes if mask_bytes is None else mask_bytes
    rep = tp if sp else 1
    if mode == "full":
        return s * b * h * dtype_bytes / rep
    replicated = (2 * s * b * h * dtype_bytes + 16 * s * b + (2 * s * b * h * m if dropout else 0)) / rep
    replicated += 2 * s * b * h * dtype_bytes
    split = 12 * s * b * h * dtype_bytes / tp
    if attention == "flash":
        core = a * s * b * 4 / tp
    else:
        core = a * s * s * b * (dtype_bytes + (m + dtype_bytes if dropout else 0)) / tp
    return replicated + split + (0 if mode == "selective" else core)
# --8<-- [end:activation_bytes]
