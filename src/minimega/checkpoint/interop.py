"""Interop with torch.distributed.checkpoint (DCP): export a checkpoint for torch, import one from it.

- `export_dcp` writes a DCP directory whose keys are `model.py`'s: torch's own ``dcp.load`` fills a
  plain ``GPT.state_dict()`` from it, or an FSDP2 model's sharded one (DCP reshards on load).
- `export_safetensors` is `consolidate`: one file of fp32 weights.
- `import_dcp` turns a DCP directory saved from `model.py`'s state dict (under FSDP2, or not) into a
  minimega checkpoint of weights (no optimizer state), which then loads onto any layout.

A DCP directory is hostile input too, and its ``.metadata`` is a pickle: it is read here with an
unpickler that can build only DCP's metadata records (`_SafeUnpickler`), never run code; every file it
names must be a plain name in the directory, and every tensor must have the model's shape.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import stat
from dataclasses import asdict
from pathlib import Path

import torch

from .files import CheckpointError, Reader, fsync_path, plain_name, read_bounded, write_safetensors
from .manifest import FORMAT_VERSION, dumps, param_shapes, shard_name, step_dir

MAX_METADATA = 64 << 20
_ALLOWED = {
    ("torch.distributed.checkpoint.metadata", n) for n in
    ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
     "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
} | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
     ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath")} | {
    ("torch", n) for n in ("float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8", "bool")}


class _SafeUnpickler(pickle.Unpickler):
    """Builds DCP's metadata dataclasses and nothing else: any other global is refused by name."""

    def find_class(self, module, name):
        if (module, name) not in _ALLOWED:
            raise CheckpointError(f".metadata: refers to {module}.{name}, which is not DCP metadata; refusing to "
                                  "unpickle it")
        return super().find_class(module, name)


def read_dcp_metadata(path: Path):
    """DCP's Metadata of directory ``path``, unpickled safely, its storage checked against the directory."""
    f = path / ".metadata"
    if not os.path.lexists(f):
        raise CheckpointError(f"{f}: missing (not a torch.distributed.checkpoint directory)")
    with io.BytesIO(read_bounded(f, MAX_METADATA, "DCP metadata")) as stream:
        try:
            meta = _SafeUnpickler(stream).load()
        except CheckpointError as exc:
            raise CheckpointError(f"{path}/{exc}") from None
        except Exception as exc:                         # a malformed pickle: one line, no traceback
            raise CheckpointError(f"{f}: not DCP metadata ({type(exc).__name__}: {exc})") from None
    from torch.distributed.checkpoint.metadata import Metadata
    if not isinstance(meta, Metadata):
        raise CheckpointError(f"{f}: holds a {type(meta).__name__}, not DCP Metadata")
    for index, info in (meta.storage_data or {}).items():
        name = plain_name(str(info.relative_path), f"{f}: storage of {index.fqn!r}")
        size = _regular_size(path / name)
        if size < 0 or not (0 <= info.offset and 0 < info.length and info.offset + info.length <= size):
            raise CheckpointError(f"{f}: storage of {index.fqn!r} points at bytes [{info.offset}, "
                                  f"{info.offset + info.length}) of {name}, which has {max(size, 0)}")
    return meta


def _regular_size(f: Path) -> int:
    """Size of ``f`` if it is a regular file (not a link, FIFO or device: torch's reader opens it), else -1."""
    try:
        st = os.lstat(f)
    except FileNotFoundError:
        return -1
    return st.st_size if stat.S_ISREG(st.st_mode) else -1


class _Reader:
    """torch's FileSystemReader, reading its metadata through `read_dcp_metadata` (never plain pickle)."""

    def __new__(cls, path: Path):
        from torch.distributed.checkpoint import FileSystemReader

        class SafeReader(FileSystemReader):
            def read_metadata(self, *args, **kwargs):
                meta = read_dcp_metadata(Path(self.path))
                from torch.distributed.checkpoint.metadata import StorageMeta
                if getattr(meta, "storage_meta", None) is None:
                    meta.storage_meta = StorageMeta()
                meta.storage_meta.load_id = self.load_id
                return meta
        return SafeReader(str(path))


# --8<-- [start:export_dcp]
def export_dcp(directory, out) -> Path:
    """A DCP directory of the checkpoint's fp32 weights under `model.py`'s keys (``dcp.load`` reads it)."""
    import torch.distributed.checkpoint as dcp
    from . import checked
    from .loading import read_tensor
    path, manifest = checked(directory)
    out = Path(out)
    with Reader() as reader:                     # DCP's writer takes the whole state dict at once
        state = {n.removeprefix("param/"): read_tensor(path, manifest, n, reader)
                 for n in sorted(manifest["tensors"]) if n.startswith("param/")}
    dcp.save(state, checkpoint_id=str(out), no_dist=True)
    return out
# --8<-- [end:export_dcp]


# --8<-- [start:import_dcp]
def import_dcp(source, directory, model_config, step: int = 0) -> Path:
    """A minimega checkpoint (weights only) at ``directory/step-<step>`` from a DCP directory holding
    `model.py`'s state dict (keys as ``model.state_dict()``, or under a top-level ``model`` entry);
    read one tensor at a time."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from ..config import TrainConfig
    source, root = Path(source), Path(directory)
    meta = read_dcp_metadata(source)
    shapes = param_shapes(model_config)
    stored = meta.state_dict_metadata
    prefix = "" if all(k in stored for k in shapes) else "model."
    for key, shape in shapes.items():
        m = stored.get(prefix + key)
        if not isinstance(m, TensorStorageMetadata):
            raise CheckpointError(f"{source}/.metadata: lacks tensor {key!r} of the model (keys: "
                                  f"{sorted(stored)[:4]}…)")
        if tuple(m.size) != shape or m.properties.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise CheckpointError(f"{source}/.metadata: {key!r} is {m.properties.dtype}{list(m.size)}, the model's "
                                  f"is float32{list(shape)}")
    reader = _Reader(source)

    def load_one(key):
        m = stored[prefix + key]
        t = torch.empty(tuple(m.size), dtype=m.properties.dtype)
        dcp.load({prefix + key: t}, storage_reader=reader, no_dist=True)
        return t.float()

    final, tmp = root / step_dir(step), root / f".tmp-{step_dir(step)}"
    if final.exists():
        raise CheckpointError(f"{final}: exists; import into an empty directory")
    root.mkdir(parents=True, exist_ok=True)
    tmp.mkdir()
    keys = list(shapes)
    items = [(f"param/{k}@{','.join(['0'] * len(shapes[k]))}", torch.float32, shapes[k], lambda k=k: load_one(k))
             for k in keys]
    info = write_safetensors(tmp / shard_name(0), items, {"format": "minimega", "rank": "0"})
    from ..version import __version__
    tensors = {f"param/{k}": {"dtype": "float32", "shape": list(shapes[k]), "chunks": [{
        "file": shard_name(0), "key": items[i][0], "offsets": [0] * len(shapes[k]), "lengths": list(shapes[k]),
        "sha256": info["items"][i]}]} for i, k in enumerate(keys)}
    manifest = {"format": FORMAT_VERSION, "package_version": __version__, "step": step,
                "layout": {"world": 1, "dp": 1, "tp": 1, "pp": 1, "zero_stage": 0, "imported_from": "dcp"},
                "model_config": asdict(model_config),
                "train_config": json.loads(json.dumps(asdict(TrainConfig()), default=list)), "scaler": None,
                "files": {shard_name(0): {"bytes": info["bytes"], "sha256": info["sha256"]}},
                "ranks": [{"file": shard_name(0), "rng": {}, "rng_sha256": {}}], "tensors": tensors}
    (tmp / "manifest.json").write_text(dumps(manifest))
    fsync_path(tmp / "manifest.json")
    fsync_path(tmp)
    os.rename(tmp, final)
    (root / ".latest.tmp").write_text(final.name)
    os.replace(root / ".latest.tmp", root / "latest")
    fsync_path(root)
    return final
# --8<-- [end:import_dcp]
