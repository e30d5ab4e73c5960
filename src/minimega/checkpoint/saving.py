"""Save: every rank streams the boxes it owns into its own file; rank 0 writes the manifest and publishes.

    Phase 1 (every rank): describe its state as boxes of global tensors (`layout.pieces`), write them and
             its RNG state into ``.tmp-step-N/shard-<rank>.safetensors`` straight from its memory, fsync.
    Phase 2 (rank 0): gather every rank's chunk list (metadata only), write and fsync manifest.json,
             fsync the directory, rename it to ``step-N`` (swapping atomically with an older ``step-N``),
             fsync the parent, point ``latest`` at it (write, fsync, rename, fsync), prune.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import comm
from .files import CheckpointError, fsync_path, read_bounded, write_safetensors
from .layout import engine_locals, pieces
from .manifest import FORMAT_VERSION, STEP_DIR, dumps, shard_name, step_dir

FAULT_ENV = "MINIMEGA_FAULT_SAVE"
"""Fault injection for tests: ``"<rank>:<n>"`` makes that rank SIGKILL itself after writing n files."""


def _maybe_fault(rank: int, written: int) -> None:
    spec = os.environ.get(FAULT_ENV)
    if spec and spec.split(":")[0] == str(rank) and written >= int(spec.split(":")[1]):
        os.kill(os.getpid(), signal.SIGKILL)


def _key(name: str, offsets) -> str:
    return f"{name}@{','.join(map(str, offsets))}"


@dataclass
class SaveJob:
    """One rank's part of one save, fixed when the save starts: where, what, and the manifest's fields.

    ``items`` are ``(key, dtype, shape, tensor)`` in file order: the owned boxes (``chunks`` describes them),
    then the RNG states (``rng`` names them). A blocking save writes views of the rank's memory; an
    asynchronous one (`async_save.py`) swaps them for a snapshot first."""
    root: Path
    step: int
    rank: int
    items: list
    chunks: list
    rng: list
    meta: dict


def prepare(engine, directory: str | os.PathLike) -> SaveJob:
    """What this rank saves, as views of its memory (no copies), and the manifest fields of this moment."""
    if getattr(engine.model_config, "bias_update_rate", 0):      # the biases are buffers, not parameters
        raise ValueError("checkpoint.save: MoEConfig.bias_update_rate > 0 keeps per-expert routing biases, "
                         "which checkpoints do not store yet; use bias_update_rate=0 to save checkpoints")
    if engine.config.precision == "fp8":   # every rank refuses alike: the config is the same on all
        raise ValueError("checkpoint: precision='fp8' keeps per-tensor amax histories and scales that checkpoints "
                         "do not hold yet (a resumed run would restart them at 1); checkpoint a bf16 run")
    owned = pieces(engine_locals(engine), for_save=True)
    rng = engine.rng_state()
    items = [(_key(p.name, p.box.offsets), p.data.dtype, p.box.lengths, p.data) for p in owned]
    items += [(f"rng/{n}", t.dtype, tuple(t.shape), t) for n, t in rng.items()]
    chunks = [(p.name, str(p.data.dtype).removeprefix("torch."), list(p.box.offsets), list(p.box.lengths))
              for p in owned]
    from ..version import __version__
    meta = {"package_version": __version__, "step": engine.step, "layout": engine.layout(),
            "model_config": asdict(engine.model_config),
            "train_config": json.loads(json.dumps(asdict(engine.config), default=list)),
            "scaler": engine.scaler_state(), "shapes": {k: list(v) for k, v in _shapes(engine).items()}}
    return SaveJob(Path(directory), engine.step, engine.mesh.rank, items, chunks, list(rng), meta)


def save(engine, directory: str | os.PathLike, keep: int = 3, stats: dict | None = None) -> Path:
    """Save the engine's training state under ``directory/step-<step>``; every rank must call it.

    Returns the new checkpoint's path. ``keep`` > 0 bounds how many ``step-*`` directories stay; the
    one just written and the one ``latest`` names are never removed. ``stats``, when given, receives
    this rank's ``bytes_written``.
    """
    return commit(prepare(engine, directory), engine.mesh.world, keep, stats)


def commit(job: SaveJob, group, keep: int = 3, stats: dict | None = None, observed: bool = True) -> Path:
    """Write this rank's file, then (rank 0) the manifest, and publish; every rank of ``group`` calls it.

    ``observed=False``: the collectives are not announced to `comm`'s observers (a background thread's, on a
    group of its own: `async_save.py`)."""
    root, rank = job.root, job.rank
    final, tmp = root / step_dir(job.step), root / f".tmp-{step_dir(job.step)}"
    # --8<-- [start:atomic_save]
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)            # a leftover from a crashed save
        tmp.mkdir()
    comm.barrier(group, observed=observed)
    file = shard_name(rank)
    info = write_safetensors(tmp / file, job.items, {"format": "minimega", "rank": str(rank)})
    _maybe_fault(rank, 1)
    digests = info.pop("items")
    chunks = [(*chunk, digest) for chunk, digest in zip(job.chunks, digests)]
    rng_digests = dict(zip(job.rng, digests[len(job.chunks):]))
    gathered = comm.all_gather_object((file, info, chunks, rng_digests), group, observed=observed)
    if rank == 0:
        manifest = _manifest(job.meta, gathered)
        (tmp / "manifest.json").write_text(dumps(manifest))
        fsync_path(tmp / "manifest.json")
        fsync_path(tmp)                                   # the names of every rank's file
        _publish(tmp, final)                              # the checkpoint becomes visible, complete
        latest_tmp = root / ".latest.tmp"
        latest_tmp.write_text(final.name)
        fsync_path(latest_tmp)
        os.replace(latest_tmp, root / "latest")
        fsync_path(root)
        prune(root, keep, protect=final.name)
    comm.barrier(group, observed=observed)
    # --8<-- [end:atomic_save]
    if stats is not None:
        stats["bytes_written"] = info["bytes"]
    return final


def _manifest(meta: dict, gathered) -> dict:
    tensors: dict[str, dict] = {}
    for file, _, chunks, _ in gathered:
        for name, dtype, offsets, lengths, digest in chunks:
            t = tensors.setdefault(name, {"dtype": dtype, "shape": None, "chunks": []})
            if t["dtype"] != dtype:
                raise RuntimeError(f"checkpoint.save: {name} is {dtype} on one rank and {t['dtype']} on another")
            t["chunks"].append({"file": file, "key": _key(name, offsets), "offsets": offsets, "lengths": lengths,
                                "sha256": digest})
    for name, t in tensors.items():
        t["shape"] = meta["shapes"][name.split("/", 1)[1]] if t["chunks"][0]["offsets"] else []
    return {
        "format": FORMAT_VERSION, "package_version": meta["package_version"], "step": meta["step"],
        "layout": meta["layout"], "model_config": meta["model_config"], "train_config": meta["train_config"],
        "scaler": meta["scaler"],
        "files": {file: info for file, info, _, _ in gathered},
        "ranks": [{"file": file, "rng": {n: f"rng/{n}" for n in rng}, "rng_sha256": rng}
                  for file, _, _, rng in gathered],
        "tensors": tensors,
    }


def _shapes(engine):
    from .manifest import param_shapes
    return param_shapes(engine.model_config)


# --8<-- [start:publish]
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two directory entries (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    at_fdcwd = -100
    return fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0


def _publish(tmp: Path, final: Path) -> None:
    """Make ``tmp`` visible as ``final``. Re-saving a step swaps the two in one atomic step, so some
    complete ``final`` exists at every instant; only then is the old one (now at ``tmp``) removed."""
    if final.exists():
        if not _exchange(tmp, final):                     # no renameat2: a short window without `final`
            old = final.with_name(f".old-{final.name}")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
            os.rename(tmp, final)
            tmp = old
        fsync_path(final.parent)
        shutil.rmtree(tmp)
    else:
        os.rename(tmp, final)
    fsync_path(final.parent)
# --8<-- [end:publish]


# --8<-- [start:prune]
def prune(root: Path, keep: int, protect: str) -> list[str]:
    """Remove the oldest ``step-*`` directories beyond ``keep``, never ``protect`` (the one just written)
    nor the one ``latest`` names. Returns the names removed."""
    if keep <= 0:
        return []
    steps = sorted((p for p in root.iterdir() if p.is_dir() and STEP_DIR.fullmatch(p.name)),
                   key=lambda p: int(p.name[5:]))
    latest = root / "latest"
    try:
        named = read_bounded(latest, 64, "step directory name").decode(errors="replace").strip()
    except CheckpointError:                  # none yet, or not a file this reader accepts: spare nothing more
        named = None
    spared = {protect, named}
    doomed = [p for p in steps if p.name not in spared][:max(0, len(steps) - keep)]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    if doomed:
        fsync_path(root)
    return [p.name for p in doomed]
# --8<-- [end:prune]
