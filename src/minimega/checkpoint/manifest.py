"""The manifest, checked: nothing in a checkpoint directory is trusted until it agrees with everything else.

A checkpoint comes from outside (another machine, another person, a disk that flipped a bit), so
`check` refuses, in one line naming the file and the field, a manifest whose

- ``step`` differs from its directory's name (``step-00000010`` holds step 10);
- ``files`` are not plain names inside the directory, or the directory holds a file ``files`` does not
  list, or a listed file is missing or has another size;
- ``tensors`` are not exactly `model.py`'s parameters (``param/<key>``) and optimizer states shaped like
  them (or 0-d), with a known dtype, whose chunks lie inside the tensor and cover it exactly once;
- ``model_config`` differs from the model being loaded;

and `check_headers` refuses a shard file whose safetensors header disagrees with the manifest (a key
missing or unlisted, another dtype or shape). The sha256 of every file is checked by `verify`.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict
from pathlib import Path

import torch

from .files import DTYPES, CheckpointError, plain_name, read_bounded, read_header

FORMAT_VERSION = 2
MAX_MANIFEST = 64 << 20
MAX_CHUNKS = 1 << 12
STEP_DIR = re.compile(r"step-(\d{8})")
SHARD = re.compile(r"shard-(\d{5})\.safetensors")
KIND = re.compile(r"[a-z][a-z0-9_]{0,63}")
DTYPE_NAMES = {"float32", "float16", "bfloat16", "float64", "int64", "int32"}


def dumps(manifest: dict) -> str:
    """manifest.json's text: sorted keys, one line per top-level field and per tensor, file and rank. Readable
    with `less`, and written by json's C encoder (``indent=`` takes the pure-Python one: 25 ms a save for the
    small model's ~12,000 values, on rank 0 while every other rank waits)."""
    def line(value) -> str:
        return json.dumps(value, sort_keys=True, separators=(", ", ": "))

    def field(key, value) -> str:
        if isinstance(value, dict) and key in ("tensors", "files"):
            inner = ",\n".join(f"  {line(k)}: {line(v)}" for k, v in sorted(value.items()))
            return f"{line(key)}: {{\n{inner}\n }}"
        if isinstance(value, list) and key == "ranks":
            return f"{line(key)}: [\n" + ",\n".join(f"  {line(v)}" for v in value) + "\n ]"
        return f"{line(key)}: {line(value)}"
    return "{\n" + ",\n".join(f" {field(k, v)}" for k, v in sorted(manifest.items())) + "\n}\n"


def step_dir(step: int) -> str:
    return f"step-{step:08d}"


def shard_name(rank: int) -> str:
    return f"shard-{rank:05d}.safetensors"


def dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name)


def _fail(path: Path, field: str, msg: str):
    raise CheckpointError(f"{path / 'manifest.json'}: field {field!r} {msg}")


def load_json(path: Path) -> dict:
    """``manifest.json`` of checkpoint directory ``path``: a regular file of at most MAX_MANIFEST bytes, JSON,
    an object (read through `files.read_bounded`; nesting too deep for the parser is refused like bad JSON)."""
    f = path / "manifest.json"
    if not os.path.lexists(f):
        raise CheckpointError(f"{f}: missing (not a checkpoint directory)")
    blob = read_bounded(f, MAX_MANIFEST, "manifest")
    try:
        manifest = json.loads(blob)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{f}: not JSON ({type(exc).__name__}: {str(exc)[:80]})") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{f}: not a JSON object (got {type(manifest).__name__})")
    return manifest


def param_shapes(model_config) -> dict[str, tuple[int, ...]]:
    """`model.py`'s parameters and their shapes, computed on the meta device (no memory).

    One block is built and its keys repeated ``n_layer`` times (every block has the same shapes), so the
    cost does not grow with the depth a manifest claims; ``torch.nn.init`` is skipped (`_NoInit`).
    """
    from dataclasses import replace

    from ..model import GPT
    with torch.device("meta"), _NoInit():
        one = replace(model_config, n_layer=1)
        model = one.build() if hasattr(one, "build") else GPT(one)   # MoE: moe.MoEGPTConfig
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    block = {k.removeprefix("blocks.0."): v for k, v in shapes.items() if k.startswith("blocks.0.")}
    out = {}
    for k, v in shapes.items():                 # model.py's order: embeddings, blocks 0 … L-1, head
        if not k.startswith("blocks.0."):
            out[k] = v
        elif not any(o.startswith("blocks.") for o in out):
            out.update({f"blocks.{i}.{b}": s for i in range(model_config.n_layer) for b, s in block.items()})
    return out


class _NoInit(torch.overrides.TorchFunctionMode):
    """Skips ``torch.nn.init`` while shapes are built: on the meta device they do nothing but import
    torch's compiler stack the first time (seconds, before a checkpoint can even be refused)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


MAX_DIM = 1 << 24
"""Any size in a saved model_config (vocabulary, width, context, heads, experts) above this is refused
unread: GPT-scale models use at most ~2^18; larger values only make the meta shapes overflow."""


def _bounded_config(path: Path, saved, tensors) -> None:
    """Refuse, before any model is built from it, a saved model_config whose sizes are absurd or whose
    depth needs more parameter tensors (at least one per block) than the manifest lists."""
    if not isinstance(saved, dict):
        _fail(path, "model_config", "is not an object")
    for k, v in saved.items():
        if _int(v) and not 0 <= v <= MAX_DIM:
            _fail(path, f"model_config.{k}", f"= {v} is outside [0, {MAX_DIM}]")
    listed = sum(1 for n in tensors if isinstance(n, str) and n.startswith("param/")) if isinstance(tensors, dict) else 0
    if _int(depth := saved.get("n_layer")) and depth > listed:
        _fail(path, "model_config.n_layer", f"= {depth} needs more parameter tensors than the {listed} the "
                                            "manifest lists")


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


ADDED_FIELDS = {"n_kv_head": None, "mlp": "gelu", "ffn_hidden": None, "position": "learned", "rope_theta": 10000.0}
"""GPTConfig fields newer than format 2's first manifests (Llama's blocks): absent in a saved model_config means
this default, the model those manifests were written for."""


def check_compatible(manifest: dict, model_config, path) -> None:
    saved, current = manifest.get("model_config"), asdict(model_config)
    if not isinstance(saved, dict):
        _fail(Path(path), "model_config", "is not an object")
    saved = {**ADDED_FIELDS, **saved}
    if diff := sorted(k for k in current if saved.get(k) != current[k]):
        raise CheckpointError(f"{path} was saved for another model: " + ", ".join(
            f"{k}={saved.get(k)!r} there vs {current[k]!r} here" for k in diff))


# --8<-- [start:check_manifest]
def check(path: Path, manifest: dict, model_config=None) -> None:
    """Refuse a manifest that disagrees with its directory, its files or the model (see the module docstring)."""
    from ..config import GPTConfig
    if manifest.get("format") != FORMAT_VERSION:
        _fail(path, "format", f"= {manifest.get('format')!r}, this version reads {FORMAT_VERSION}")
    step = manifest.get("step")
    if not _int(step) or step < 0 or path.name != step_dir(step):
        _fail(path, "step", f"= {step!r} does not match the directory name {path.name!r}")
    if model_config is None:
        _bounded_config(path, manifest.get("model_config"), manifest.get("tensors"))
        try:
            saved = manifest.get("model_config", {})
            if isinstance(saved, dict) and "n_experts" in saved:      # a mixture of experts (minimega.parallel.moe.layer)
                from ..parallel.moe.layer import MoEGPTConfig as GPTConfig          # noqa: N814
            model_config = GPTConfig(**saved)
        except (TypeError, ValueError) as exc:
            _fail(path, "model_config", f"is not a valid GPTConfig ({exc})")
    check_compatible(manifest, model_config, path)
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        _fail(path, "files", "is not a non-empty object")
    for name, info in files.items():
        plain_name(name, f"{path / 'manifest.json'}: field 'files'")
        if not SHARD.fullmatch(name):
            _fail(path, "files", f"lists {name!r}, which is not a shard-NNNNN.safetensors name")
        if not (isinstance(info, dict) and _int(info.get("bytes")) and isinstance(info.get("sha256"), str)
                and re.fullmatch(r"[0-9a-f]{64}", info["sha256"])):
            _fail(path, f"files.{name}", "needs 'bytes' (an int) and 'sha256' (64 hex digits)")
    on_disk = {p.name for p in path.iterdir()} - {"manifest.json"}
    if unknown := sorted(on_disk - set(files)):
        raise CheckpointError(f"{path / unknown[0]}: unknown file (not listed in manifest.json field 'files')")
    for name, info in files.items():
        if name not in on_disk:
            raise CheckpointError(f"{path / name}: missing (manifest.json field 'files' lists it)")
        size = os.lstat(path / name).st_size           # of the name itself (links: files.open_regular refuses)
        if size != info["bytes"]:
            raise CheckpointError(f"{path / name}: {size} bytes, manifest.json field 'files' says {info['bytes']}")
    _check_tensors(path, manifest.get("tensors"), param_shapes(model_config), files)
    ranks = manifest.get("ranks")
    if not isinstance(ranks, list) or not all(
            isinstance(r, dict) and r.get("file") in files and isinstance(r.get("rng"), dict)
            and isinstance(r.get("rng_sha256"), dict) and set(r["rng"]) == set(r["rng_sha256"])
            and all(isinstance(k, str) for k in r["rng"].values()) for r in ranks):
        _fail(path, "ranks", "must list, per rank, its 'file' (one of 'files'), its 'rng' keys and their sha256")
    scaler = manifest.get("scaler")
    if scaler is not None and not (isinstance(scaler, dict) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in scaler.values())):
        _fail(path, "scaler", "must be null or an object of finite numbers")


def _check_tensors(path: Path, tensors, shapes: dict, files: dict) -> None:
    if not isinstance(tensors, dict):
        _fail(path, "tensors", "is not an object")
    if missing := sorted(k for k in shapes if f"param/{k}" not in tensors):
        _fail(path, "tensors", f"lacks param/{missing[0]} (the model has it)")
    for name, t in tensors.items():
        kind, _, key = name.partition("/")
        field = f"tensors.{name}"
        if not KIND.fullmatch(kind) or key not in shapes:
            _fail(path, "tensors", f"holds {name!r}, which is not a parameter of this model or a state of one")
        if not isinstance(t, dict) or t.get("dtype") not in DTYPE_NAMES:
            _fail(path, f"{field}.dtype", f"= {t.get('dtype') if isinstance(t, dict) else t!r} is not one of "
                                          f"{sorted(DTYPE_NAMES)}")
        shape = t.get("shape")
        if shape != list(shapes[key]) and not (kind != "param" and shape == []):
            _fail(path, f"{field}.shape", f"= {shape!r}, but the model's {key} is {list(shapes[key])}")
        chunks = t.get("chunks")
        if not isinstance(chunks, list) or not 0 < len(chunks) <= MAX_CHUNKS:
            _fail(path, f"{field}.chunks", "must be a non-empty list")
        boxes = []
        for c in chunks:
            ok = (isinstance(c, dict) and c.get("file") in files and isinstance(c.get("key"), str)
                  and isinstance(c.get("sha256"), str) and re.fullmatch(r"[0-9a-f]{64}", c["sha256"])
                  and isinstance(c.get("offsets"), list) and isinstance(c.get("lengths"), list)
                  and len(c["offsets"]) == len(c["lengths"]) == len(shape)
                  and all(_int(o) and _int(n) and o >= 0 and n > 0 and o + n <= d
                          for o, n, d in zip(c["offsets"], c["lengths"], shape)))
            if not ok:
                _fail(path, f"{field}.chunks", f"entry {c!r} is not a box of {shape} in one of 'files'")
            boxes.append((c["offsets"], c["lengths"]))
        if sum(math.prod(n) for _, n in boxes) != math.prod(shape) or _overlap(boxes):
            _fail(path, f"{field}.chunks", f"do not cover the {shape} tensor exactly once")
# --8<-- [end:check_manifest]


def _overlap(boxes) -> bool:
    boxes = sorted(boxes)
    for i, (o1, n1) in enumerate(boxes):
        for o2, n2 in boxes[i + 1:]:
            if o2[:1] and o2[0] >= o1[0] + n1[0]:
                break                                   # sorted by the first offset: no later box can touch
            if all(b < a + n and a < b + m for a, n, b, m in zip(o1, n1, o2, n2)):
                return True
    return False


def digests(path: Path, manifest: dict) -> dict[tuple[Path, str], str]:
    """``{(file path, key): sha256}`` of every stored tensor the manifest lists (chunks and RNG states)."""
    out = {(path / c["file"], c["key"]): c["sha256"] for t in manifest["tensors"].values() for c in t["chunks"]}
    for r in manifest["ranks"]:
        out.update({(path / r["file"], r["rng"][n]): d for n, d in r["rng_sha256"].items()})
    return out


def check_headers(path: Path, manifest: dict, file: str, header: dict | None = None) -> dict:
    """The shard's safetensors header, refused unless it holds exactly the keys, dtypes and shapes listed."""
    f = path / file
    header = header if header is not None else read_header(f)[0]
    want = {}
    for name, t in manifest["tensors"].items():
        for c in t["chunks"]:
            if c["file"] == file:
                want[c["key"]] = (name, t["dtype"], c["lengths"])
    for r in manifest["ranks"]:
        if r["file"] == file:
            want.update({k: (f"rng {n}", None, None) for n, k in r["rng"].items()})
    stored = {k: v for k, v in header.items() if k != "__metadata__"}
    if extra := sorted(set(stored) - set(want)):
        raise CheckpointError(f"{f}: holds {extra[0]!r}, which manifest.json does not list")
    for key, (name, dtype, lengths) in want.items():
        if key not in stored:
            raise CheckpointError(f"{f}: lacks {key!r} (manifest.json field 'tensors.{name}' lists it)")
        if dtype is None:
            if stored[key]["dtype"] != "U8":
                raise CheckpointError(f"{f}: {key!r} has dtype {stored[key]['dtype']}, an RNG state is U8")
            continue
        code = {v: k for k, v in DTYPES.items()}[dtype_of(dtype)]
        if stored[key]["dtype"] != code or stored[key]["shape"] != lengths:
            raise CheckpointError(f"{f}: {key!r} is {stored[key]['dtype']}{stored[key]['shape']}, manifest.json field "
                                  f"'tensors.{name}' says {dtype} {lengths}")
    return header
