"""Data: a byte-level tokenizer, the corpus shipped with the package, and deterministic batches.

Every layout must see exactly the data of the single-process run. `global_batches` draws the global
batch for each step from a generator seeded by (seed, step); `batches(mesh, ...)` hands dp rank r the
rows ``[r*B/dp, (r+1)*B/dp)`` of that same batch. Tensor- and pipeline-parallel ranks of one dp
replica get identical rows.
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Iterator

import torch

VOCAB_SIZE = 256


def encode(text: str) -> torch.Tensor:
    """UTF-8 bytes as token ids in [0, 256)."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


def decode(ids) -> str:
    return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")


@lru_cache(maxsize=1)
def corpus_tokens() -> torch.Tensor:
    """The shipped corpus (original prose on training at scale), byte-tokenized."""
    return encode(resources.files("minimega").joinpath("data/corpus.txt").read_text(encoding="utf-8"))


def split_tokens(split: str) -> torch.Tensor:
    """'train' is the first 90% of the corpus, 'val' the rest."""
    tokens = corpus_tokens()
    cut = int(0.9 * len(tokens))
    if split not in ("train", "val"):
        raise ValueError(f"split={split!r}; choose 'train' or 'val'")
    return tokens[:cut] if split == "train" else tokens[cut:]


def global_batch(step: int, batch_size: int, seq_len: int, *, seed: int = 0, vocab_size: int = VOCAB_SIZE,
                 split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of one step: ``(x, y)``, each (B, T) int64, ``y`` shifted by one token.

    A vocabulary smaller than 256 folds ids modulo ``vocab_size`` (tests use odd sizes).
    """
    tokens = split_tokens(split)
    if seq_len + 1 > len(tokens):
        raise ValueError(f"seq_len={seq_len} is longer than the {split} split ({len(tokens)} tokens)")
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=gen)
    rows = torch.stack([tokens[s:s + seq_len + 1] for s in starts.tolist()])   # (B, T+1)
    if vocab_size < VOCAB_SIZE:
        rows = rows % vocab_size
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def global_batches(steps: int, batch_size: int, seq_len: int, *, start: int = 0, **kw) -> Iterator:
    """``steps`` global batches, for the single-process reference run."""
    for step in range(start, start + steps):
        yield global_batch(step, batch_size, seq_len, **kw)


def batch_index(step: int, skip=()) -> int:
    """The index of the batch step ``step`` trains on when the batches in ``skip`` are never seen: the
    ``step``-th index (from 0) not in ``skip``. With nothing skipped, the step itself."""
    index = step
    for s in sorted(set(skip)):
        if s <= index:
            index += 1
    return index


def shard_rows(batch: tuple[torch.Tensor, torch.Tensor], dp_rank: int, dp_size: int):
    """Rows ``[r*B/dp, (r+1)*B/dp)`` of a global batch."""
    x, y = batch
    if x.shape[0] % dp_size:
        raise ValueError(f"global batch size {x.shape[0]} is not divisible by dp={dp_size}")
    n = x.shape[0] // dp_size
    return x[dp_rank * n:(dp_rank + 1) * n], y[dp_rank * n:(dp_rank + 1) * n]


def batches(mesh, steps: int, batch_size: int = 8, seq_len: int = 64, *, start: int = 0, **kw) -> Iterator:
    """This dp rank's slice of the same global batches `global_batches` yields, moved to the mesh's device."""
    for batch in global_batches(steps, batch_size, seq_len, start=start, **kw):
        x, y = shard_rows(batch, mesh.dp_rank, mesh.dp_size)
        yield x.to(mesh.device), y.to(mesh.device)
