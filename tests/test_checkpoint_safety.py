"""Checkpoints are hostile input: nothing executable, a manifest checked against everything, durable
writes, pruning that never removes what it just wrote."""
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import minimega as mm
from minimega import checkpoint, data
from minimega.checkpoint import CheckpointError, saving
from parity import parity_config

MODEL = mm.GPTConfig.tiny(block_size=32)
SRC = Path(mm.__file__).parent


def _engine(config):
    world = dist.get_world_size() if dist.is_initialized() else 1
    mesh = mm.init_mesh(mm.ParallelDims.infer(world, tp=config.tp, pp=config.pp))
    torch.manual_seed(config.seed)
    return mesh, mm.initialize(mm.GPT(MODEL), config, mesh)


def _train_and_save(config, directory, steps, keep=3):
    mesh, engine = _engine(config)
    for batch in data.batches(mesh, steps, config.batch_size, 32, seed=config.seed, start=engine.step):
        engine.train_step(batch)
    engine.save(directory, keep=keep)
    return engine.full_state_dict()


def _load(config, directory):
    mesh, engine = _engine(config)
    step = engine.load(directory)
    return step, engine.full_state_dict()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A dp 2, ZeRO-1 checkpoint after 1 step (step-00000001 and latest)."""
    root = tmp_path_factory.mktemp("saved")
    mm.launch(_train_and_save, 2, parity_config(zero_stage=1), str(root), 1, timeout=120)
    return root


@pytest.fixture
def ckpt(saved, tmp_path):
    root = tmp_path / "ckpt"
    shutil.copytree(saved, root)
    return root


def _edit_manifest(root: Path, edit) -> None:
    f = root / "step-00000001" / "manifest.json"
    manifest = json.loads(f.read_text())
    edit(manifest)
    f.write_text(json.dumps(manifest))


def _refused(root, pattern: str) -> str:
    with pytest.raises(CheckpointError) as info:
        checkpoint.read(root)
    msg = str(info.value)
    assert re.search(pattern, msg), msg
    assert "\n" not in msg, "a refusal is one line"
    return msg


# ---- nothing executable ---------------------------------------------------------------------------

def test_every_torch_load_in_the_package_is_weights_only():
    calls = []
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        for m in re.finditer(r"torch\.load\(", text):
            call = text[m.start():text.find(")", m.start()) + 1]
            calls.append((path.name, "weights_only=True" in call))
    assert all(ok for _, ok in calls), calls
    for path in (SRC / "checkpoint").rglob("*.py"):        # checkpoint files never reach an unpickler
        assert not re.search(r"\bpickle\.loads?\(", path.read_text()), f"{path}: unrestricted pickle.load"


class _Marker:
    """Unpickling this runs ``open(marker, 'w')``: the attack a pickled RNG file allowed."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_crafted_pickle_is_refused_and_never_runs(ckpt, tmp_path):
    marker = tmp_path / "pwned"
    step = ckpt / "step-00000001"
    evil = pickle.dumps({"torch": _Marker(str(marker))})
    # 1. the old format's RNG file, listed in the manifest with its true sha256
    (step / "rng-00000.pt").write_bytes(evil)
    _edit_manifest(ckpt, lambda m: m["files"].update({"rng-00000.pt": {"bytes": len(evil), "sha256": "0" * 64}}))
    _refused(ckpt, r"'rng-00000.pt', which is not a shard-NNNNN.safetensors name")
    with pytest.raises(mm.WorkerError, match="rng-00000.pt"):
        mm.launch(_load, 2, parity_config(zero_stage=1), str(ckpt), timeout=120)
    # 2. a pickle posing as a shard, its size and sha256 written into the manifest
    (step / "rng-00000.pt").unlink()
    (step / "shard-00000.safetensors").write_bytes(evil)
    import hashlib
    _edit_manifest(ckpt, lambda m: (m["files"].pop("rng-00000.pt"), m["files"].update(
        {"shard-00000.safetensors": {"bytes": len(evil), "sha256": hashlib.sha256(evil).hexdigest()}})))
    _refused(ckpt, r"shard-00000.safetensors: (header length|too short)")
    with pytest.raises(mm.WorkerError, match="shard-00000.safetensors"):
        mm.launch(_load, 2, parity_config(zero_stage=1), str(ckpt), timeout=120)
    assert not marker.exists()


# ---- the manifest, checked --------------------------------------------------------------------------

def test_manifest_step_must_match_the_directory(ckpt):
    _edit_manifest(ckpt, lambda m: m.update(step=999))
    _refused(ckpt, r"manifest.json: field 'step' = 999 does not match the directory name 'step-00000001'")


def test_manifest_shape_must_match_the_model(ckpt):
    def edit(m):
        m["tensors"]["param/blocks.0.mlp.fc.weight"]["shape"] = [128, 64]
    _edit_manifest(ckpt, edit)
    _refused(ckpt, r"field 'tensors.param/blocks.0.mlp.fc.weight.shape' = \[128, 64\], but the model's "
                   r"blocks.0.mlp.fc.weight is \[256, 64\]")


def test_manifest_file_names_are_plain(ckpt):
    _edit_manifest(ckpt, lambda m: m["files"].update({"../../etc/hostname": {"bytes": 1, "sha256": "0" * 64}}))
    _refused(ckpt, r"field 'files': '../../etc/hostname' is not a plain file name inside the checkpoint directory")


def test_a_shard_missing_from_files_with_a_flipped_bit_is_refused(ckpt):
    shard = ckpt / "step-00000001" / "shard-00001.safetensors"
    blob = bytearray(shard.read_bytes())
    blob[-5] ^= 0x01
    shard.write_bytes(bytes(blob))
    _edit_manifest(ckpt, lambda m: m["files"].pop("shard-00001.safetensors"))
    _refused(ckpt, r"shard-00001.safetensors: unknown file \(not listed in manifest.json field 'files'\)")


def test_a_flipped_bit_is_refused_on_every_rank_at_load(ckpt):
    shard = ckpt / "step-00000001" / "shard-00001.safetensors"
    blob = bytearray(shard.read_bytes())
    blob[-5] ^= 0x01
    shard.write_bytes(bytes(blob))
    with pytest.raises(mm.WorkerError, match=r"shard-00001.safetensors: '.*' checksum mismatch"):
        mm.launch(_load, 2, parity_config(zero_stage=1), str(ckpt), timeout=120)


def test_header_must_agree_with_the_manifest(ckpt):
    def edit(m):
        m["tensors"]["param/wte.weight"]["dtype"] = "float16"
    _edit_manifest(ckpt, edit)
    _refused(ckpt, r"shard-0000[01].safetensors: 'param/wte.weight@[0-9,]+' is F32\[[0-9, ]+\], manifest.json field "
                   r"'tensors.param/wte.weight' says float16")


@pytest.mark.parametrize("pointer", ["/etc", "../saved/step-00000001", "step-00000001/../..", "/abs/step-00000001"])
def test_latest_must_name_a_sibling(ckpt, pointer):
    (ckpt / "latest").write_text(pointer)
    _refused(ckpt, r"latest: '.*' is not a sibling step-NNNNNNNN directory name")


def test_cli_refusal_is_one_line(ckpt):
    _edit_manifest(ckpt, lambda m: m.update(step=999))
    out = subprocess.run([sys.executable, "-m", "minimega", "checkpoint", "info", str(ckpt)], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(SRC.parent)})
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "field 'step' = 999" in out.stderr


# ---- durable, atomic, safe pruning ------------------------------------------------------------------

def test_save_fsyncs_files_then_directory_then_renames_then_parent(tmp_path, monkeypatch):
    events = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(a, b):
        events.append(("rename", str(a), str(b)))
        real_rename(a, b)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    _, engine = _engine(parity_config())
    engine.save(tmp_path)
    tmp, final = str(tmp_path / ".tmp-step-00000000"), str(tmp_path / "step-00000000")
    names = [e[1] if e[0] == "fsync" else "rename" for e in events]
    i_shard = names.index(tmp + "/shard-00000.safetensors")
    i_dir = names.index(tmp)
    i_rename = events.index(("rename", tmp, final))
    i_parent = names.index(str(tmp_path), i_rename)
    assert i_shard < names.index(tmp + "/manifest.json") < i_dir < i_rename < i_parent


def test_resaving_a_step_swaps_atomically(tmp_path, monkeypatch):
    _, engine = _engine(parity_config())
    first = engine.save(tmp_path)
    before = (first / "manifest.json").read_text()
    engine.config = engine.config.replace(lr=0.5)             # a visible difference in the new manifest
    real_rmtree = shutil.rmtree

    def rmtree(path, ignore_errors=False):          # removing the old copy fails (a leftover tmp may go)
        if not ignore_errors:
            raise OSError("disk gone")
        real_rmtree(path, ignore_errors=True)
    monkeypatch.setattr(saving.shutil, "rmtree", rmtree)
    with pytest.raises(OSError, match="disk gone"):          # dies while removing the old copy
        engine.save(tmp_path)
    now = json.loads((first / "manifest.json").read_text())
    assert now["train_config"]["lr"] == 0.5 and before != json.dumps(now)   # the new one was in place first
    monkeypatch.undo()
    assert checkpoint.read(tmp_path)[0]["step"] == 0


def _fresh_run_over_old_steps(config, directory):
    mesh = mm.init_mesh(mm.ParallelDims.infer(dist.get_world_size()))
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(mm.GPTConfig.tiny()), config, mesh)     # `minimega train`'s default preset
    for batch in data.batches(mesh, 5, config.batch_size, 32, seed=config.seed):
        engine.train_step(batch)
    engine.save(directory, keep=2)
    return sorted(os.listdir(directory))


def test_fresh_run_keeps_its_new_checkpoint_when_pruning(saved, tmp_path, capsys):
    root = tmp_path / "run"
    root.mkdir()
    for step in (65, 70, 75):                                 # an older run's checkpoints
        shutil.copytree(saved / "step-00000001", root / f"step-{step:08d}")
        _edit_manifest_at(root / f"step-{step:08d}", step)
    (root / "latest").write_text("step-00000075")
    listing = mm.launch(_fresh_run_over_old_steps, 2, parity_config(zero_stage=1), str(root), timeout=120)[0]
    assert listing == ["latest", "step-00000005", "step-00000075"]
    assert (root / "latest").read_text() == "step-00000005"
    from minimega.tools.cli import main         # in this process: its ranks fork from the warm forkserver
    capsys.readouterr()
    assert main(["train", "--nproc", "2", "--zero-stage", "1", "--batch-size", "8", "--seed", "1", "--seq-len", "32",
                 "--steps", "2", "--resume", str(root), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["losses"]) == 2


def _edit_manifest_at(step_dir: Path, step: int) -> None:
    f = step_dir / "manifest.json"
    m = json.loads(f.read_text())
    m["step"] = step
    f.write_text(json.dumps(m))


def test_prune_spares_latest_and_the_new_one(tmp_path):
    for step in (1, 2, 3, 4, 5):
        (tmp_path / f"step-{step:08d}").mkdir()
    (tmp_path / "latest").write_text("step-00000002")
    assert saving.prune(tmp_path, 3, protect="step-00000005") == ["step-00000001", "step-00000003"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000002", "step-00000004", "step-00000005"]


def test_shards_are_plain_safetensors(saved):
    """Any safetensors reader opens the shards; a box read by the plan equals safetensors' own slice."""
    from safetensors import safe_open

    from minimega.checkpoint.files import Reader
    step = saved / "step-00000001"
    manifest = json.loads((step / "manifest.json").read_text())
    chunks = [c for t in manifest["tensors"].values() for c in t["chunks"] if len(c["lengths"]) == 2]
    with Reader() as reader:
        for c in chunks[:20]:
            with safe_open(str(step / c["file"]), framework="pt") as f:
                rows, cols = c["lengths"]
                want = f.get_slice(c["key"])[rows // 3:rows, 1:cols]
            got = reader.read_box(step / c["file"], c["key"], (rows // 3, 1), (rows - rows // 3, cols - 1))
            assert torch.equal(got, want)


def test_loss_scaler_state_round_trips_and_refuses_nonsense():
    from minimega.train.precision import DynamicLossScaler, StaticLossScaler
    a = DynamicLossScaler(init_scale=2.0 ** 10, window=3, hysteresis=2)
    for overflow in (True, False, False, False, True, True, False):
        a.update(overflow)
    b = DynamicLossScaler(init_scale=2.0 ** 10, window=3, hysteresis=2)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))          # JSON, nothing else
    for overflow in (False, False, False, True, False):
        a.update(overflow)
        b.update(overflow)
        assert a.state_dict() == b.state_dict()
    for bad, msg in (({**a.state_dict(), "scale": -1.0}, "scale must be > 0"),
                     ({**a.state_dict(), "cur_hysteresis": 7}, r"cur_hysteresis in \[1, 2\]"),
                     ({"kind": 0, "scale": 8.0, "skipped": 0}, "saved with another fp16 loss_scale setting"),
                     ({**a.state_dict(), "extra": 1}, "saved with another fp16 loss_scale setting")):
        with pytest.raises(ValueError, match=msg):
            DynamicLossScaler(hysteresis=2).load_state_dict(bad)
    with pytest.raises(ValueError, match="saved with loss_scale=8.0, this run uses 4.0"):
        StaticLossScaler(4.0).load_state_dict({"kind": 0, "scale": 8.0, "skipped": 0})


def test_a_tampered_scaler_state_is_refused_before_loading(tmp_path):
    config = parity_config(zero_stage=1, precision="fp16")
    mm.launch(_train_and_save, 2, config, str(tmp_path), 1, timeout=120)
    _edit_manifest(tmp_path, lambda m: m["scaler"].update(scale=-1.0))
    with pytest.raises(mm.WorkerError, match=r"manifest.json: field 'scaler': .*scale must be > 0"):
        mm.launch(_load, 2, config, str(tmp_path), timeout=120)


# ---- hostile files: one hardened reader, every command refuses in one line, about as fast as a clean read ----
# The bound is in the machine's own time, so it holds on two loaded cores: before each hostile command the
# driver times `checkpoint info` accepting the clean copy (the reference), and the refusal may take at most
# REFUSAL_REFS of those (and never less than FLOOR_S). A hang is cut off there (SIGALRM); reading a 1.5 GB
# manifest or following /dev/zero would take far longer. Measured at load 22 on two cores: clean reads of
# 0.02-0.7 s, every refusal within 1.6 of them.

REFUSAL_REFS = 20.0
FLOOR_S = 1.0
_DRIVER = r"""
import io, json, signal, sys, time, contextlib
from minimega.tools.cli import main
import minimega.tools.checkpoint_cli, minimega.tools.train   # torch and the commands load before any clock starts

class Hung(Exception):
    pass

def alarm(*_):
    raise Hung()

def run(argv, limit):
    err = io.StringIO()
    t = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, limit)                # the hard bound: a hang is cut off here
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(argv)
    except Hung:
        rc = "hung"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return {"argv": argv, "rc": rc, "s": time.perf_counter() - t, "stderr": err.getvalue()}

signal.signal(signal.SIGALRM, alarm)
clean, *hostile = json.loads(sys.argv[1])
refs, floor = float(sys.argv[2]), float(sys.argv[3])
run(clean, 60.0)                                               # warm: the first read pays one-off imports
out = [run(clean, 60.0)]
for argv in hostile:
    ref = run(clean, 60.0)["s"]                                # the machine's speed now
    limit = max(floor, refs * ref)
    out.append({**run(argv, limit), "ref": ref, "limit": limit})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def resumable(tmp_path_factory):
    """A checkpoint `minimega train --resume` accepts (the tiny preset, one process, one step)."""
    root = tmp_path_factory.mktemp("resumable")
    config = mm.TrainConfig(batch_size=2)
    mesh = mm.init_mesh(mm.ParallelDims())
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(mm.GPTConfig.tiny()), config, mesh)
    engine.train_step(next(iter(data.batches(mesh, 1, 2, 64, seed=config.seed))))
    engine.save(root)
    return root


def _manifest_of(step: Path) -> dict:
    return json.loads((step / "manifest.json").read_text())


def _fifo_shard(step: Path) -> None:
    shard = step / "shard-00000.safetensors"
    shard.unlink()
    os.mkfifo(shard)
    m = _manifest_of(step)
    m["files"]["shard-00000.safetensors"]["bytes"] = 0          # the attacker rewrites what the size check sees
    (step / "manifest.json").write_text(json.dumps(m))


def _dev_zero_shard(step: Path) -> None:
    shard = step / "shard-00000.safetensors"
    shard.unlink()
    shard.symlink_to("/dev/zero")
    m = _manifest_of(step)
    m["files"]["shard-00000.safetensors"]["bytes"] = os.lstat(shard).st_size
    (step / "manifest.json").write_text(json.dumps(m))


def _deep_model(step: Path) -> None:
    m = _manifest_of(step)
    m["model_config"]["n_layer"] = 10 ** 6
    m["padding"] = "x" * 65_000                                  # the issue's 65 KB manifest
    (step / "manifest.json").write_text(json.dumps(m))


def _huge_manifest(step: Path) -> None:
    os.truncate(step / "manifest.json", 1_500_000_000)          # 1.5 GB, sparse: no disk, no time to write


def _text_manifest(text: str):
    return lambda step: (step / "manifest.json").write_text(text)


def _pickle_with_rewritten_hash(step: Path) -> None:
    import hashlib
    evil = pickle.dumps({"torch": _Marker(str(step.parent / "pwned"))})
    (step / "shard-00000.safetensors").write_bytes(evil)
    m = _manifest_of(step)
    m["files"]["shard-00000.safetensors"] = {"bytes": len(evil), "sha256": hashlib.sha256(evil).hexdigest()}
    (step / "manifest.json").write_text(json.dumps(m))


def _fifo_latest(step: Path) -> None:
    latest = step.parent / "latest"
    latest.unlink()
    os.mkfifo(latest)


HOSTILE = {
    "fifo-shard": (_fifo_shard, r"shard-00000.safetensors: is a FIFO, not a regular file"),
    "dev-zero-shard": (_dev_zero_shard, r"shard-00000.safetensors: is a symbolic link"),
    "n_layer-1e6": (_deep_model, r"n_layer"),
    "manifest-1.5GB": (_huge_manifest, r"manifest.json: 1500000000 bytes is larger than any manifest"),
    "manifest-{}": (_text_manifest("{}"), r"manifest.json: field 'format' = None"),
    "manifest-[]": (_text_manifest("[]"), r"manifest.json: not a JSON object \(got list\)"),
    "manifest-nested": (_text_manifest("[" * 100_000 + "]" * 100_000), r"manifest.json: not JSON \(RecursionError"),
    "pickle-rehashed": (_pickle_with_rewritten_hash, r"shard-00000.safetensors: (header length|too short)"),
    "fifo-latest": (_fifo_latest, r"latest: is a FIFO, not a regular file"),
}
COMMANDS = {
    "info": lambda root, out: ["checkpoint", "info", str(root)],
    "consolidate": lambda root, out: ["checkpoint", "consolidate", str(root), str(out)],
    "train-resume": lambda root, out: ["train", "--nproc", "1", "--steps", "1", "--batch-size", "2", "--resume",
                                       str(root)],
    "train-resume-timeout": lambda root, out: ["train", "--nproc", "1", "--steps", "1", "--batch-size", "2",
                                               "--timeout", "10", "--resume", str(root)],
}


def test_hostile_checkpoints_are_refused_by_every_command_in_one_line_about_as_fast_as_a_clean_read(
        resumable, tmp_path):
    """Each hostile directory, each command, in one `minimega` process (the CLI's own `main`), each run cut
    off at REFUSAL_REFS clean reads: rc 2 and the refusal on one line. The clean copy is accepted by `info` (the cases fail for
    their own reason)."""
    argvs, expect = [], []
    clean = tmp_path / "clean"
    shutil.copytree(resumable, clean)
    argvs.append(COMMANDS["info"](clean, None))
    for case, (make, pattern) in HOSTILE.items():
        root = tmp_path / case
        shutil.copytree(resumable, root)
        make(root / "step-00000001")
        for command, argv in COMMANDS.items():
            argvs.append(argv(root, tmp_path / f"{case}.safetensors"))
            expect.append((case, command, pattern))
    proc = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(argvs), str(REFUSAL_REFS), str(FLOOR_S)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(SRC.parent)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results[0]["rc"] == 0, results[0]["stderr"]
    bad = []
    for (case, command, pattern), r in zip(expect, results[1:]):
        lines = r["stderr"].strip().splitlines()
        ok = (r["rc"] == 2 and len(lines) == 1 and re.search(pattern, lines[0]) and r["s"] < r["limit"])
        print(f"{case:16} {command:21} rc={r['rc']} {r['s']:.3f} s = {r['s'] / r['ref']:.1f} clean reads "
              f"(limit {r['limit']:.2f} s)  {lines[-1][:120] if lines else ''}")
        if not ok:
            bad.append(f"{case} {command}: rc={r['rc']} after {r['s']:.2f} s (limit {r['limit']:.2f} s = "
                       f"{REFUSAL_REFS:g} clean reads of {r['ref']:.3f} s): {r['stderr'][-400:]!r}")
    assert not bad, "\n".join(bad)
    assert not (tmp_path / "pickle-rehashed" / "pwned").exists()


def test_the_reader_refuses_what_is_not_a_regular_file(tmp_path):
    from minimega.checkpoint.files import open_regular, read_bounded
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to("/dev/zero")
    (tmp_path / "big").write_bytes(b"x" * 65)
    for name, msg in (("fifo", "is a FIFO"), ("link", "is a symbolic link"), ("missing", "missing")):
        with pytest.raises(CheckpointError, match=msg):
            open_regular(tmp_path / name)
    with pytest.raises(CheckpointError, match="65 bytes is larger than any step name"):
        read_bounded(tmp_path / "big", 64, "step name")
    assert read_bounded(tmp_path / "big", 65, "step name") == b"x" * 65


def _nan_in_one_tensor_rehashed(step: Path) -> str:
    """A NaN written over the first element of one stored fp32 tensor, the file's sha256 in the manifest rewritten
    to match (so only the tensor's own checksum can tell); returns the tensor's key."""
    import hashlib
    from minimega.checkpoint.files import read_header
    shard = step / "shard-00000.safetensors"
    header, start = read_header(shard)
    key = next(k for k, v in header.items() if k.startswith("param/") and v["dtype"] == "F32")
    blob = bytearray(shard.read_bytes())
    at = start + header[key]["data_offsets"][0]
    blob[at:at + 4] = torch.tensor([float("nan")]).numpy().tobytes()
    shard.write_bytes(bytes(blob))
    m = _manifest_of(step)
    m["files"]["shard-00000.safetensors"]["sha256"] = hashlib.sha256(bytes(blob)).hexdigest()
    (step / "manifest.json").write_text(json.dumps(m))
    return key


def test_a_nan_in_one_tensor_is_refused_by_every_reader_in_one_line(resumable, tmp_path):
    """The file checksum agrees (rewritten), one tensor's does not: `checkpoint info`, `consolidate`, `export`
    (both formats) and `train --resume` (refused by its rank's load, after its start-up banner) each answer rc 2
    with one line naming the shard and the tensor, and write nothing."""
    root = tmp_path / "nan"
    shutil.copytree(resumable, root)
    key = _nan_in_one_tensor_rehashed(root / "step-00000001")
    argvs = [COMMANDS["info"](root, None), COMMANDS["consolidate"](root, tmp_path / "c.safetensors"),
             ["checkpoint", "export", str(root), str(tmp_path / "e.safetensors"), "--format", "safetensors"],
             ["checkpoint", "export", str(root), str(tmp_path / "dcp"), "--format", "dcp"],
             COMMANDS["train-resume"](root, None)]
    # The driver times a first command as its yardstick (here `info` itself); no clock is asserted, only answers.
    proc = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps([argvs[0], *argvs]), "20", "120"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(SRC.parent)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in json.loads(proc.stdout.strip().splitlines()[-1])[1:]:
        lines = [line for line in r["stderr"].strip().splitlines() if " rank(s), dp=" not in line]   # train's banner
        assert r["rc"] == 2 and len(lines) == 1, (r["argv"], r["rc"], r["stderr"][-2000:])
        assert re.search(rf"shard-00000.safetensors: '{re.escape(key)}' checksum mismatch", lines[0]), lines[0]
    assert not (tmp_path / "c.safetensors").exists() and not (tmp_path / "e.safetensors").exists()
