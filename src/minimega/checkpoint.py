"""Distributed checkpoints: atomic sharded save, verified load onto any layout, consolidation.

Format (one directory per step)::

    ckpt/
      latest                      -> "step-00000010" (replaced atomically)
      step-00000010/
        manifest.json             layout, configs, step, every tensor's shape/dtype/shard, sha256 per file
        shard-00000.safetensors   rank 0's share of the training state
        shard-00001.safetensors   ...
        rng-00000.pt              each rank's RNG states

What is saved is the *layout-free* training state: for every parameter of `model.py` (by its own
key) the fp32 weight and each optimizer state tensor, full-shaped. The engine produces it with
``Engine.training_state()`` (a collective that undoes ZeRO/TP/PP sharding) and takes it back with
``Engine.load_training_state(state)``, which re-shards it for the *current* layout. That is the whole
resharding story (DeepSpeed calls it a universal checkpoint): a checkpoint saved under (dp2, zero3)
loads under (tp2), or on one rank, with no conversion step. The names are split across ranks so every
rank writes its own shard in parallel.

Durability:
- everything is written into a hidden ``.tmp-step-…`` directory, fsynced, and only then renamed to
  ``step-…``; ``latest`` is replaced atomically last. A crash mid-save leaves the previous
  checkpoint as it was, and nothing half-written under a visible name;
- loading checks the manifest against the model and verifies every file's sha256 first;
- ``keep`` bounds how many complete checkpoints stay on disk.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from . import comm

FORMAT_VERSION = 1
FAULT_ENV = "MINIMEGA_FAULT_SAVE"
"""Fault injection for tests: ``"<rank>:<n>"`` makes that rank SIGKILL itself after writing n files."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: missing, corrupted, or made for another model."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _flatten(state: dict) -> dict[str, torch.Tensor]:
    """{'param/<key>': w, '<state>/<key>': t} from {'model': {...}, 'optimizer': {key: {state: t}}}."""
    flat = {f"param/{k}": v.detach().float().cpu().contiguous() for k, v in state["model"].items()}
    for key, states in state["optimizer"].items():
        for name, value in states.items():
            t = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            flat[f"{name}/{key}"] = t.detach().cpu().contiguous()
    return flat


def _unflatten(flat: dict[str, torch.Tensor]) -> dict:
    model, optimizer = {}, {}
    for name, t in flat.items():
        kind, key = name.split("/", 1)
        if kind == "param":
            model[key] = t
        else:
            optimizer.setdefault(key, {})[kind] = t
    return {"model": model, "optimizer": optimizer}


def _partition(flat: dict[str, torch.Tensor], world: int) -> list[list[str]]:
    """Names split over ranks, largest first onto the least-loaded rank (balanced shard sizes)."""
    loads, parts = [0] * world, [[] for _ in range(world)]
    for name in sorted(flat, key=lambda n: (-flat[n].numel(), n)):
        r = loads.index(min(loads))
        parts[r].append(name)
        loads[r] += flat[name].numel() * flat[name].element_size()
    return parts


def _maybe_fault(rank: int, written: int) -> None:
    spec = os.environ.get(FAULT_ENV)
    if spec and spec.split(":")[0] == str(rank) and written >= int(spec.split(":")[1]):
        os.kill(os.getpid(), signal.SIGKILL)


def _step_dir(step: int) -> str:
    return f"step-{step:08d}"


def save(engine, directory: str | os.PathLike, keep: int = 3) -> Path:
    """Save the engine's training state under ``directory/step-<step>``; every rank must call it.

    Returns the path of the new checkpoint. Older complete checkpoints beyond ``keep`` are removed.
    """
    mesh, root = engine.mesh, Path(directory)
    state = engine.training_state()                       # collective: full-shaped, on every rank
    flat = _flatten(state)
    world, rank = mesh.world_size, mesh.rank
    parts = _partition(flat, world)
    final, tmp = root / _step_dir(engine.step), root / f".tmp-{_step_dir(engine.step)}"
    # --8<-- [start:atomic_save]
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)            # a leftover from a crashed save
        tmp.mkdir()
    comm.barrier(mesh.world)
    written = 0
    shard = tmp / f"shard-{rank:05d}.safetensors"
    save_file({n: flat[n] for n in parts[rank]}, str(shard))
    _fsync(shard)
    written += 1
    _maybe_fault(rank, written)
    rng = tmp / f"rng-{rank:05d}.pt"
    torch.save(engine.rng_state(), rng)
    _fsync(rng)
    written += 1
    _maybe_fault(rank, written)
    digests = comm.all_gather_object({shard.name: _sha256(shard), rng.name: _sha256(rng)}, mesh.world)
    if rank == 0:
        manifest = {
            "format": FORMAT_VERSION, "package_version": _version(), "step": engine.step,
            "layout": engine.layout(), "model_config": asdict(engine.model_config),
            "train_config": json.loads(json.dumps(asdict(engine.config), default=list)),
            "extra": state.get("extra", {}),
            "tensors": {n: {"shape": list(flat[n].shape), "dtype": str(flat[n].dtype).removeprefix("torch."),
                            "shard": f"shard-{r:05d}.safetensors"} for r, names in enumerate(parts) for n in names},
            "files": {k: v for d in digests for k, v in d.items()},
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
        _fsync(tmp / "manifest.json")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)                            # the checkpoint becomes visible, complete
        latest_tmp = root / ".latest.tmp"
        latest_tmp.write_text(final.name)
        _fsync(latest_tmp)
        os.replace(latest_tmp, root / "latest")
        _fsync(root)
        for old in sorted(root.glob("step-*"))[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    comm.barrier(mesh.world)
    # --8<-- [end:atomic_save]
    return final


def _version() -> str:
    from . import __version__
    return __version__


def resolve(directory: str | os.PathLike) -> Path:
    """A checkpoint directory: ``directory`` itself if it holds a manifest, else what ``latest`` names."""
    root = Path(directory)
    if (root / "manifest.json").exists():
        return root
    latest = root / "latest"
    if not latest.exists():
        raise CheckpointError(f"no checkpoint in {root}: neither manifest.json nor a 'latest' pointer")
    path = root / latest.read_text().strip()
    if not (path / "manifest.json").exists():
        raise CheckpointError(f"{root}/latest names {path.name}, which has no manifest.json")
    return path


def resolve_or_none(directory: str | os.PathLike) -> Path | None:
    """Like `resolve`, but None when there is no checkpoint yet (a fresh run that may resume later)."""
    try:
        return resolve(directory)
    except CheckpointError:
        return None


def read(directory: str | os.PathLike, verify: bool = True) -> tuple[dict, dict]:
    """(manifest, training state) of a checkpoint, after checking every file's sha256."""
    path = resolve(directory)
    manifest = json.loads((path / "manifest.json").read_text())
    if manifest.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: format {manifest.get('format')} is not {FORMAT_VERSION}")
    if verify:
        for name, digest in manifest["files"].items():
            f = path / name
            if not f.exists():
                raise CheckpointError(f"{f}: missing (the manifest lists it)")
            if _sha256(f) != digest:
                raise CheckpointError(f"{f}: checksum mismatch (sha256 {_sha256(f)[:12]}… != manifest "
                                      f"{digest[:12]}…): the file is corrupted or was modified")
    flat = {}
    for shard in sorted(set(t["shard"] for t in manifest["tensors"].values())):
        flat.update(load_file(str(path / shard)))
    return manifest, _unflatten(flat)


def check_compatible(manifest: dict, model_config, path) -> None:
    saved = manifest["model_config"]
    current = asdict(model_config)
    if diff := sorted(k for k in current if saved.get(k) != current[k]):
        raise CheckpointError(f"{path} was saved for another model: " + ", ".join(
            f"{k}={saved.get(k)!r} there vs {current[k]!r} here" for k in diff))


def load(engine, directory: str | os.PathLike) -> int:
    """Load the latest (or the given) checkpoint into ``engine`` under its current layout; returns the step."""
    path = resolve(directory)
    manifest, state = read(path)
    check_compatible(manifest, engine.model_config, path)
    state["extra"] = manifest.get("extra", {})
    engine.load_training_state(state, step=manifest["step"])
    rng = path / f"rng-{engine.mesh.rank:05d}.pt"
    if rng.exists() and manifest["layout"]["world"] == engine.mesh.world_size:
        engine.set_rng_state(torch.load(rng, weights_only=False))
    return manifest["step"]


def consolidate(directory: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write the full fp32 weights (``model.py``'s keys) to one safetensors file; no process group needed."""
    manifest, state = read(directory)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state["model"].items()}, str(out),
              metadata={"step": str(manifest["step"]), "model_config": json.dumps(manifest["model_config"])})
    return out
