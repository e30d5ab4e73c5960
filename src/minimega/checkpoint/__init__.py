"""Distributed checkpoints: each rank writes what it owns, and reads only what its new layout needs.

Format (one directory per step)::

    ckpt/
      latest                       "step-00000010": a sibling directory name, replaced atomically
      step-00000010/
        manifest.json              step, layout, configs, loss scaler; per file its size and sha256; per
                                   global tensor its shape, dtype and chunks (file, key, offsets, lengths)
        shard-00000.safetensors    the boxes rank 0 owns (and its RNG states, as uint8 tensors)
        shard-00001.safetensors    ...

The tensors are `model.py`'s layout-free training state: ``param/<key>`` (fp32 weights) and one tensor
per optimizer state (``exp_avg/<key>``, ``exp_avg_sq/<key>``, ``step/<key>``), each with its global
shape. A rank writes the boxes of them it owns: its ZeRO shards, its TP slices, its pipeline stages,
its share of replicated tensors (`layout.py`), streamed from its memory (`files.py`). Loading plans, per
rank, the boxes its current layout needs and reads only those (`plan.py`, `loading.py`), so a checkpoint
saved under (dp 2, ZeRO-3) loads under (tp 2), or on one process, with no conversion and no gather: as
torch's DCP and DeepSpeed's universal checkpoints do. Nothing is unpickled: tensors are safetensors,
everything else JSON; the manifest is checked against the directory, the files and the model before
anything is read (`manifest.py`).

Durability: files are fsynced, then their directory; it is renamed into place (atomically swapped with
an older copy of the same step); the parent is fsynced; ``latest`` is replaced last. Pruning keeps
``keep`` checkpoints and never removes the one just written or the one ``latest`` names (`saving.py`).
An asynchronous save copies the rank's state and commits it the same way from a background thread
(`async_save.py`).
Interop with torch DCP is in `interop.py`.
"""
from __future__ import annotations

import os
from pathlib import Path

from .files import CheckpointError, Reader, write_safetensors
from .loading import load, open_checked, read_tensor, resolve, resolve_or_none, verify, verify_chunks
from .manifest import FORMAT_VERSION, check, check_compatible, check_headers, load_json
from .saving import FAULT_ENV, prune, save
from .async_save import AsyncSaver


def read(directory: str | os.PathLike, verify_files: bool = True) -> tuple[dict, dict]:
    """(manifest, training state) of a checkpoint, whole, in one process (for inspection and tests).

    The state is ``{"model": {key: fp32}, "optimizer": {key: {kind: tensor}}}``; every check of `load` is made.
    """
    path, manifest = checked(directory, verify_files)
    model, optimizer = {}, {}
    with Reader() as reader:
        for name in sorted(manifest["tensors"]):
            kind, key = name.split("/", 1)
            t = read_tensor(path, manifest, name, reader)
            if kind == "param":
                model[key] = t
            else:
                optimizer.setdefault(key, {})[kind] = t
    return manifest, {"model": model, "optimizer": optimizer}


def checked(directory, verify_files: bool = True, model_config=None) -> tuple[Path, dict]:
    """(path, manifest) after every check that needs no process group: the manifest against its directory and
    ``model_config`` (default: the one it names, bounded first), every file's sha256 (``verify_files``), every
    shard's header against the manifest, then every chunk's sha256 (``verify_files``: `loading.verify_chunks`).
    `minimega checkpoint info`, `consolidate`, `export` and a resuming `minimega train` (before any rank starts,
    without the hashes: the ranks' load checks each chunk it reads) call it; every file is opened through
    `files.open_regular`."""
    if verify_files:
        path, manifest = open_checked(directory, model_config)
    else:
        path = resolve(directory)
        manifest = load_json(path)
        check(path, manifest, model_config)
    for file in manifest["files"]:
        check_headers(path, manifest, file)
    if verify_files:
        verify_chunks(path, manifest)
    return path, manifest


# --8<-- [start:consolidate]
def consolidate(directory: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write the fp32 weights (``model.py``'s keys) to one safetensors file, one tensor at a time (peak
    memory: the largest tensor); no process group needed."""
    import json
    path, manifest = checked(directory)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    names = [n for n in manifest["tensors"] if n.startswith("param/")]
    from .manifest import dtype_of
    with Reader() as reader:
        items = [(n.removeprefix("param/"), dtype_of(manifest["tensors"][n]["dtype"]),
                  tuple(manifest["tensors"][n]["shape"]), lambda n=n: read_tensor(path, manifest, n, reader))
                 for n in names]
        tmp = out.with_name(f".{out.name}.tmp")
        write_safetensors(tmp, items, {"step": str(manifest["step"]),
                                       "model_config": json.dumps(manifest["model_config"])})
        os.replace(tmp, out)
    return out
# --8<-- [end:consolidate]


def export_safetensors(directory, out) -> Path:
    """``minimega checkpoint export --format safetensors``: the consolidated fp32 weights."""
    return consolidate(directory, out)


from .interop import export_dcp, import_dcp  # noqa: E402  (needs `checked` above)

__all__ = ["export_dcp", "import_dcp", "export_safetensors", "CheckpointError", "FAULT_ENV", "FORMAT_VERSION",
           "save", "AsyncSaver", "load", "read", "resolve", "resolve_or_none",
           "consolidate", "check", "check_compatible", "checked", "verify", "prune"]
