"""Cutting the reference GPT into pipeline chunks: contiguous runs of blocks, embedding first, head last.

The model's n_layer blocks are cut into p·v chunks balanced by layer count (the first n_layer % (p·v)
chunks take one extra block). Chunk k lives on pipeline rank k % p (with v = 1: chunk k is stage k).
Chunk 0 also holds the embeddings, chunk p·v - 1 the final LayerNorm and the head, so with the untied
head every parameter lives in exactly one chunk.

A `StageChunk` keeps the reference model's parameter names (``blocks.5.attn.qkv.weight`` stays that,
whichever chunk holds block 5), so gathering every chunk's ``state_dict`` rebuilds `GPT.state_dict`.
The blocks are whatever modules the model holds (tensor parallelism may have replaced their layers).
Cut from a `ParallelGPT`, a chunk runs the tensor-parallel embedding (vocab-parallel, sequence-split under
sequence parallelism) and the vocab-parallel cross-entropy on the last chunk; it keeps only the tp
group, not a reference to the whole model, so the other stages' blocks are freed.

Shapes: chunk 0 maps token ids (B, T) to the residual stream (B, T, D); every other chunk maps
(B, T, D) to (B, T, D), except the last, which returns logits (B, T, V). Under tensor parallelism the
logits are vocab-sharded (B, T, V_pad/tp), and with sequence parallelism the stream is (B, T/tp, D).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..model import GPT
from ..parallel.tensor import ParallelGPT, vocab_parallel_cross_entropy


def layer_bounds(n_layer: int, chunks: int) -> list[range]:
    """The blocks of each chunk: contiguous, sizes differing by at most one (earlier chunks larger)."""
    if chunks > n_layer:
        raise ValueError(f"cannot cut n_layer={n_layer} layers into {chunks} pipeline chunks; "
                         f"use pp * virtual_stages <= {n_layer}")
    base, extra = divmod(n_layer, chunks)
    bounds, start = [], 0
    for k in range(chunks):
        size = base + (k < extra)
        bounds.append(range(start, start + size))
        start += size
    return bounds


class StageChunk(nn.Module):
    """Blocks ``layers`` of ``model`` (sharing the model's modules, not copies), plus the ends it owns."""

    def __init__(self, model: GPT, index: int, chunks: int, layers: range):
        super().__init__()
        self.index, self.is_first, self.is_last = index, index == 0, index == chunks - 1
        self.config = model.config
        # Under tp the ends are ParallelGPT's (its embed reads group and sequence_parallel from self).
        self.group = model.group if isinstance(model, ParallelGPT) else None
        self.sequence_parallel = getattr(model, "sequence_parallel", False)
        self._ends = ParallelGPT if self.group is not None else GPT
        if self.is_first:
            self.wte, self.wpe, self.drop = model.wte, model.wpe, model.drop
        # A ModuleDict keyed by the block's index in the full model keeps model.py's parameter names.
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in layers})
        if self.is_last:
            self.ln_f, self.lm_head = model.ln_f, model.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T) ids on the first chunk, else (B, T, D) → (B, T, D), or (B, T, V) logits on the last."""
        if self.is_first:
            x = self.embed(x)                                                  # (B, T, D) or (B, T/tp, D)
        for block in self.blocks.values():
            x = block(x)
        return self.head(x) if self.is_last else x

    def units(self) -> list[tuple]:
        """This chunk's part of the model's unit chain (`model.GPT.units`): its ends where it holds them, its blocks
        keyed by their index in the full model."""
        blocks = [(f"blocks.{i}", b, [b]) for i, b in self.blocks.items()]
        return ([("embed", self.embed, [self.wte, self.wpe])] if self.is_first else []) + blocks + \
            ([("head", self.head, [self.ln_f, self.lm_head])] if self.is_last else [])

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """What ``forward`` returns from the last unit's output: the output itself (the runtime computes the loss)."""
        return x

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """The model's embedding (first chunk only): (B, T) ids → (B, T, D)."""
        return self._ends.embed(self, idx)

    def positions(self, idx: torch.Tensor) -> torch.Tensor:
        return self._ends.positions(self, idx)

    def position_embedding(self, pos: torch.Tensor) -> torch.Tensor:
        return self._ends.position_embedding(self, pos)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The model's final LayerNorm and head (last chunk only): (B, T, D) → (B, T, V) logits."""
        return self._ends.head(self, x)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the last chunk's logits; vocab-parallel when they are sharded over tp."""
        if self.group is None:
            return GPT.loss(logits, targets)
        return vocab_parallel_cross_entropy(logits, targets, self.group, self.config.vocab_size)


def split_model(model: GPT, pp_rank: int, pp_size: int, virtual_stages: int = 1) -> list[StageChunk]:
    """This rank's chunks, in local order: model chunks pp_rank, pp_rank + p, ..., pp_rank + (v-1)·p."""
    chunks = pp_size * virtual_stages
    bounds = layer_bounds(model.config.n_layer, chunks)
    return [StageChunk(model, k, chunks, bounds[k]) for k in range(pp_rank, chunks, pp_size)]
