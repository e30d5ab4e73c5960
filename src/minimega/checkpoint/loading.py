"""Load: check the manifest, hash the files (split over ranks), plan this rank's reads, read only those.

    Phase 1 (every rank): resolve ``latest``; check the manifest against the directory and the model.
    Phase 2: each rank hashes 1/world of the files; one failure anywhere refuses the load everywhere.
    Phase 3: make empty optimizer states of the saved kinds; describe this rank's state as boxes
             (`layout.pieces`, replicas in full); intersect them with the saved chunks (`plan.py`);
             check each file's header as it is opened; read each box with ``pread`` into its place.
    Phase 4: ZeRO refreshes the parameters from the masters; the loss scaler and (same layout only)
             the RNG states come back.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from .. import comm
from ..zero import state as zero_state
from .files import CheckpointError, Reader, read_bounded, sha256_file
from .layout import Box, engine_locals, pieces
from .manifest import STEP_DIR, check, check_headers, digests, dtype_of, load_json
from .plan import plan_reads


# --8<-- [start:resolve]
def resolve(directory: str | os.PathLike) -> Path:
    """A checkpoint directory: ``directory`` itself if it holds a manifest, else the sibling ``latest`` names.

    ``latest`` must hold a plain ``step-NNNNNNNN`` name of a directory next to it: an absolute path, a
    ``..`` or a link out of the directory is refused, never followed.
    """
    root = Path(directory)
    if os.path.lexists(root / "manifest.json"):
        return root
    latest = root / "latest"
    if not os.path.lexists(latest):
        raise CheckpointError(f"no checkpoint in {root}: neither manifest.json nor a 'latest' pointer")
    name = read_bounded(latest, 64, "step directory name").decode(errors="replace").strip()
    if not STEP_DIR.fullmatch(name):
        raise CheckpointError(f"{latest}: {name!r} is not a sibling step-NNNNNNNN directory name")
    path = root / name
    if path.is_symlink() or not os.path.lexists(path / "manifest.json"):
        raise CheckpointError(f"{latest}: names {name}, which is not a checkpoint directory next to it")
    return path
# --8<-- [end:resolve]


def resolve_or_none(directory: str | os.PathLike) -> Path | None:
    """Like `resolve`, but None when there is no checkpoint yet (a fresh run that may resume later)."""
    root = Path(directory)
    if not (root / "manifest.json").exists() and not (root / "latest").exists():
        return None
    return resolve(directory)


def verify(path: Path, manifest: dict, rank: int = 0, world: int = 1) -> list[str]:
    """sha256 of this rank's share of the files (file i by rank i mod world); returns the failures."""
    bad = []
    for i, (name, info) in enumerate(sorted(manifest["files"].items())):
        if i % world == rank and (digest := sha256_file(path / name)) != info["sha256"]:
            bad.append(f"{path / name}: checksum mismatch (sha256 {digest[:12]}… != manifest.json field "
                       f"'files.{name}.sha256' {info['sha256'][:12]}…): the file is corrupted or was modified")
    return bad


def verify_chunks(path: Path, manifest: dict) -> None:
    """Every stored tensor the manifest lists (each chunk, each RNG state) hashed against its own sha256: the
    check a load makes as it reads, made whole. Catches what the file checksums cannot, a file rewritten with
    its checksum (a NaN written into one tensor and ``files.*.sha256`` updated). Raises on the first mismatch."""
    table = digests(path, manifest)
    with Reader(table) as reader:
        for file, key in sorted(table):
            reader.verify(file, key)


def state_kinds(manifest: dict) -> dict[str, tuple[torch.dtype, bool]]:
    """The optimizer-state kinds the checkpoint holds: name → (dtype, is 0-d)."""
    out = {}
    for name, t in manifest["tensors"].items():
        kind = name.split("/", 1)[0]
        if kind != "param":
            out[kind] = (dtype_of(t["dtype"]), t["shape"] == [])
    return out


def open_checked(directory, model_config, mesh=None) -> tuple[Path, dict]:
    """(path, manifest) after the manifest checks and the (distributed) sha256 checks."""
    path = resolve(directory)
    manifest = load_json(path)
    check(path, manifest, model_config)
    rank, world = (mesh.rank, mesh.world_size) if mesh else (0, 1)
    bad = verify(path, manifest, rank, world)
    if mesh is not None:
        bad = [b for part in comm.all_gather_object(bad, mesh.world) for b in part]
    if bad:
        raise CheckpointError(bad[0])
    return path, manifest


def load(engine, directory: str | os.PathLike, verify_files: bool = True, stats: dict | None = None) -> int:
    """Load the latest (or the given) checkpoint into ``engine`` under its current layout; returns the step.

    With ``verify_files`` every stored tensor this rank reads is checked against its sha256 in the
    manifest. ``stats``, when given, receives this rank's ``bytes_read`` (tensor data, by the plan),
    ``bytes_hashed`` (whole stored tensors it read only part of), ``bytes_needed`` (its boxes) and
    ``files_opened`` and ``reads`` (its plan: tensor, file, offsets, lengths). A refusal on any rank is
    raised on every rank (no rank waits for another).
    """
    if engine.config.precision == "fp8":   # every rank refuses alike: the config is the same on all
        raise ValueError("checkpoint: precision='fp8' keeps per-tensor amax histories and scales that checkpoints "
                         "do not hold yet (a resumed run would restart them at 1); checkpoint a bf16 run")
    mesh = engine.mesh
    path = resolve(directory)
    manifest = load_json(path)
    check(path, manifest, engine.model_config)
    kinds = state_kinds(manifest)
    saved_opt = manifest.get("train_config", {}).get("optimizer")
    if kinds and saved_opt != engine.config.optimizer:
        raise CheckpointError(f"{path / 'manifest.json'}: field 'train_config.optimizer' = {saved_opt!r} holds "
                              f"states this run's optimizer={engine.config.optimizer!r} cannot use")
    if manifest.get("scaler") is not None:            # checked before anything is overwritten
        try:
            engine.load_scaler_state(manifest["scaler"])
        except (ValueError, TypeError, KeyError) as exc:
            raise CheckpointError(f"{path / 'manifest.json'}: field 'scaler': {exc}") from None
    _prepare(engine, manifest, kinds)
    needs = pieces(engine_locals(engine), for_save=False)
    error = None
    # --8<-- [start:execute_plan]
    reads = plan_reads(manifest, needs)
    with torch.no_grad(), Reader(digests(path, manifest) if verify_files else None) as reader:
        checked = set()
        try:
            for r in reads:
                if r.file not in checked:                    # the header must say what the manifest says
                    check_headers(path, manifest, r.file, reader.header(path / r.file))
                    checked.add(r.file)
                rel = r.relative()
                got = reader.read_box(path / r.file, r.key, rel.offsets, rel.lengths, into=r.dest)
                if got is not r.dest:                        # read into a buffer: the destination is strided
                    r.dest.copy_(got)
            _restore_rng(engine, manifest, path, reader, checked)
        except CheckpointError as exc:
            error = str(exc)
    # --8<-- [end:execute_plan]
    if errors := [e for e in comm.all_gather_object(error, mesh.world) if e]:
        raise CheckpointError(errors[0])
    for wrapper in engine.zero_stages + ([engine.experts] if engine.zero_stages and engine.experts else []):
        zero_state.finish_load(wrapper)
    engine.step = manifest["step"]
    if stats is not None:
        stats.update(bytes_read=reader.bytes_read, bytes_hashed=reader.bytes_hashed, files_opened=len(checked),
                     bytes_needed=sum(p.data.numel() * p.data.element_size() for p in needs),
                     reads=[(r.name, r.file, r.part.offsets, r.part.lengths) for r in reads])
    return manifest["step"]


@torch.no_grad()
def _prepare(engine, manifest: dict, kinds: dict) -> None:
    """Empty optimizer states of the saved kinds, for the plan to fill (none if the checkpoint has none)."""
    for wrapper in engine.zero_stages:
        zero_state.prepare_load(wrapper, kinds)
    if engine.zero_stages:                  # ZeRO holds all but the experts (MoE): their ZeRO-1 over edp
        if engine.experts is not None:
            zero_state.prepare_load(engine.experts, kinds)
        return
    named = [(k, p) for part in engine.parts for k, p in part.named_parameters()]
    state = engine.optimizer.state
    for key, p in named:
        mine = {k: v for k, v in kinds.items() if f"{k}/{key}" in manifest["tensors"]}
        old = state.get(p, {})
        if mine and set(old) == set(mine) and all(
                t.dtype == mine[k][0] and t.shape == (() if mine[k][1] else p.shape) for k, t in old.items()):
            continue                                     # the plan overwrites every element: reuse them
        state.pop(p, None)
        if mine:
            state[p] = {k: torch.zeros((), dtype=dt) if scalar else torch.zeros_like(p, dtype=dt)
                        for k, (dt, scalar) in mine.items()}


def _restore_rng(engine, manifest: dict, path: Path, reader: Reader, checked: set) -> None:
    """This rank's RNG states, when the layout is the one that saved them (else the streams stay as seeded)."""
    if manifest.get("layout") != engine.layout():
        return
    entry = manifest["ranks"][engine.mesh.rank]
    if entry["file"] not in checked:
        check_headers(path, manifest, entry["file"], reader.header(path / entry["file"]))
        checked.add(entry["file"])
    header = reader.header(path / entry["file"])
    states = {}
    for name, key in entry["rng"].items():
        shape = tuple(header[key]["shape"])
        states[name] = reader.read_box(path / entry["file"], key, (0,) * len(shape), shape)
    engine.set_rng_state(states)


def read_tensor(path: Path, manifest: dict, name: str, reader: Reader) -> torch.Tensor:
    """One whole global tensor, assembled from its chunks (consolidation reads one at a time)."""
    t = manifest["tensors"][name]
    out = torch.empty(t["shape"], dtype=dtype_of(t["dtype"]))
    whole = Box((0,) * len(t["shape"]), tuple(t["shape"]))
    for c in t["chunks"]:
        box = Box(tuple(c["offsets"]), tuple(c["lengths"]))
        dest = out[box.slices(whole)]
        got = reader.read_box(path / c["file"], c["key"], (0,) * len(box.lengths), box.lengths, into=dest)
        if got is not dest:
            dest.copy_(got)
    return out
