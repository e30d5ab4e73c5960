"""Exercise (lab 10-checkpoints): find the files of a checkpoint that cannot be trusted.

A minimega checkpoint directory holds ``manifest.json`` and one file per rank (``shard-0000r.safetensors``: the
boxes of the training state that rank owns, and its RNG states). The manifest's ``"files"`` maps every file name
to ``{"bytes": its size, "sha256": the hex digest of its bytes}``, computed when it was written. The top directory holds several steps and a ``latest`` file naming the newest
one (``step-00000002``). Before loading anything, the loader recomputes every digest.

Use `hashlib.sha256` (read the file in binary) and `json`; then run the lab's check cell: it damages copies of
a real checkpoint in different ways and compares your answer with what `minimega.checkpoint.read` accepts.
"""
from __future__ import annotations

from pathlib import Path


def verify_checkpoint(directory: str | Path) -> list[str]:
    """Names of the manifest's files that are missing or whose sha256 differs from the manifest's, sorted.

    Args:
        directory: a checkpoint (it holds ``manifest.json``) or the top directory (its ``latest`` file names the
            step directory to check).

    Returns:
        e.g. ``["shard-00001.safetensors"]``; ``[]`` when every file is intact.
    """
    raise NotImplementedError("exercise: complete verify_checkpoint in labs/exercises/verify_checkpoint.py")
