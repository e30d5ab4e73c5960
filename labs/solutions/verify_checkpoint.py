"""Reference solution to ``labs/exercises/verify_checkpoint.py``."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path


def verify_checkpoint(directory: str | Path) -> list[str]:
    """Names of the manifest's files that are missing or whose sha256 differs from the manifest's, sorted."""
    path = Path(directory)
    if not (path / "manifest.json").exists():                       # the top directory: follow `latest`
        path = path / (path / "latest").read_text().strip()
    manifest = json.loads((path / "manifest.json").read_text())
    bad = []
    for name, info in manifest["files"].items():
        f = path / name
        if not f.exists() or hashlib.sha256(f.read_bytes()).hexdigest() != info["sha256"]:
            bad.append(name)
    return sorted(bad)
