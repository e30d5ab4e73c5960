"""The read plan: which byte ranges of which files this rank needs for its new layout.

Loading asks `layout.pieces` which boxes of which global tensors the rank holds *now* (its ZeRO shard,
its TP slice, its stages, whole for replicas), and intersects each with the chunks the manifest lists
for that tensor. Every non-empty intersection is one read: a box of a stored chunk, copied into a view
of the rank's memory. Nothing else is read, so a rank reads what it owns (plus what its replicas own
too, under DDP), whatever layout wrote the checkpoint: this is torch DCP's load planner, and DeepSpeed's
universal checkpoint, without the consolidation step.

    saved dp 2 (ZeRO-3), loaded tp 2:    rank 0 needs fc.weight rows [0, F/2) → reads the parts of
                                         the two chunks (one per old rank) that fall in those rows
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .files import CheckpointError
from .layout import Box, Piece


@dataclass
class Read:
    """Stored ``key`` of ``file`` holds ``chunk``; this read takes ``part`` (inside it) into ``dest``."""

    name: str
    file: str
    key: str
    chunk: Box
    part: Box
    dest: torch.Tensor

    def relative(self) -> Box:
        """``part`` in the chunk's own coordinates (what the file stores)."""
        return Box(tuple(o - c for o, c in zip(self.part.offsets, self.chunk.offsets)), self.part.lengths)


# --8<-- [start:plan]
def plan_reads(manifest: dict, needs: list[Piece]) -> list[Read]:
    """One `Read` per (needed box ∩ stored chunk); refuses a need the checkpoint does not cover."""
    reads = []
    for piece in needs:
        tensor = manifest["tensors"].get(piece.name)
        if tensor is None:
            raise CheckpointError(f"manifest.json: field 'tensors' lacks {piece.name!r}, which this layout needs")
        covered = 0
        for c in tensor["chunks"]:
            chunk = Box(tuple(c["offsets"]), tuple(c["lengths"]))
            part = piece.box.intersect(chunk)
            if part is None:
                continue
            reads.append(Read(piece.name, c["file"], c["key"], chunk, part, piece.data[part.slices(piece.box)]))
            covered += part.numel
        if covered != piece.box.numel:
            raise CheckpointError(f"manifest.json: field 'tensors.{piece.name}.chunks' covers {covered} of the "
                                  f"{piece.box.numel} elements of box {piece.box} that this rank needs")
    return sorted(reads, key=lambda r: (r.file, r.key))     # file by file, in the order they were written
# --8<-- [end:plan]
