"""Checkpoints: bit-exact resume, reshard across layouts, consolidation, and durability under faults."""
import json
import os

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

import minimega as mm
from minimega import checkpoint, data
from minimega.checkpoint import CheckpointError
from parity import max_rel_error, parity_config

MODEL = mm.GPTConfig.tiny(block_size=32)


def _engine(config):
    world = dist.get_world_size() if dist.is_initialized() else 1
    mesh = mm.init_mesh(mm.ParallelDims.infer(world, tp=config.tp, pp=config.pp))
    torch.manual_seed(config.seed)
    return mesh, mm.initialize(mm.GPT(MODEL), config, mesh)


def _train(engine, mesh, config, steps):
    for batch in data.batches(mesh, steps, config.batch_size, 32, seed=config.seed, start=engine.step):
        engine.train_step(batch)


HALF = 4        # steps before and after a save: Adam's step count, the moments and the data position all matter by then


def _straight_and_resumed(config, directory, resume_world_note):
    """2·HALF steps straight, and HALF + save + (fresh engine) load + HALF in the same layout."""
    mesh, straight = _engine(config)
    _train(straight, mesh, config, 2 * HALF)
    mesh, first = _engine(config)
    _train(first, mesh, config, HALF)
    first.save(directory)
    mesh, second = _engine(config)
    assert second.load(directory) == HALF
    _train(second, mesh, config, HALF)
    return straight.full_state_dict(), second.full_state_dict(), straight.losses[HALF:], second.losses


def test_resume_is_bit_identical_dp2(tmp_path):
    config = parity_config()
    straight, resumed, l1, l2 = mm.launch(_straight_and_resumed, 2, config, str(tmp_path), None, timeout=240)[0]
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert l1 == l2
    step_dir = tmp_path / f"step-{HALF:08d}"
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert manifest["layout"] == {"world": 2, "dp": 2, "tp": 1, "pp": 1, "zero_stage": 0}
    assert sorted(manifest["files"]) == ["shard-00000.safetensors", "shard-00001.safetensors"]
    assert (tmp_path / "latest").read_text() == f"step-{HALF:08d}"


def _save_after(config, directory, steps):
    mesh, engine = _engine(config)
    _train(engine, mesh, config, steps)
    engine.save(directory)
    _train(engine, mesh, config, HALF)
    return engine.full_state_dict()


def _load_and_continue(config, directory):
    mesh, engine = _engine(config)
    engine.load(directory)
    _train(engine, mesh, config, HALF)
    return engine.full_state_dict(), engine.eval_step(data.global_batch(0, 8, 32, split="val"))


LAYOUTS = {"dp1": (1, {}), "dp2": (2, {}), "dp4": (4, {}), "tp2": (2, {"tp": 2}), "dp2-tp2": (4, {"tp": 2}),
           "dp2-zero3": (2, {"zero_stage": 3}), "dp4-zero1": (4, {"zero_stage": 1}),
           "dp2-zero2": (2, {"zero_stage": 2}), "pp2": (2, {"pp": 2, "micro_batches": 4}),
           "dp2-tp2-zero1": (4, {"tp": 2, "zero_stage": 1}), "tp2-pp2": (4, {"tp": 2, "pp": 2, "micro_batches": 4}),
           "dp2-pp2-zero1": (4, {"pp": 2, "zero_stage": 1, "micro_batches": 4})}


@pytest.mark.parametrize("src, dst", [("dp2", "dp1"), ("dp1", "dp4"), ("dp2", "tp2"), ("dp2-tp2", "dp1"),
                                      ("dp2-zero3", "dp1"), ("dp2-zero3", "dp4-zero1"), ("dp2-zero3", "tp2"),
                                      ("tp2", "dp2-zero2"), ("tp2", "pp2"), ("pp2", "dp2-zero2"),
                                      ("dp2-tp2-zero1", "tp2-pp2"), ("tp2-pp2", "dp2-pp2-zero1")], ids=lambda v: v)
def test_reshard_across_layouts(saved_sources, src, dst):
    (w_dst, kw_dst) = LAYOUTS[dst]
    directory, straight = saved_sources(src)
    resumed, _ = mm.launch(_load_and_continue, w_dst, parity_config(**kw_dst), str(directory), timeout=240)[0]
    assert max_rel_error(resumed, straight) <= 1e-5


@pytest.fixture(scope="module")
def saved_sources(tmp_path_factory):
    """Each source layout trains, saves at step HALF and trains on once per module: its checkpoint (read-only to the
    targets, which load it and train on) and its straight weights."""
    done: dict[str, tuple] = {}

    def get(src):
        if src not in done:
            world, kw = LAYOUTS[src]
            directory = tmp_path_factory.mktemp(f"src-{src}")
            done[src] = directory, mm.launch(_save_after, world, parity_config(**kw), str(directory), HALF,
                                             timeout=240)[0]
        return done[src]
    return get


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_resume_is_bit_identical_under_zero(tmp_path, stage):
    straight, resumed, l1, l2 = mm.launch(_straight_and_resumed, 2, parity_config(zero_stage=stage), str(tmp_path),
                                          None, timeout=240)[0]
    assert all(torch.equal(straight[k], resumed[k]) for k in straight) and l1 == l2


def test_resume_is_bit_identical_pp2(tmp_path):
    config = parity_config(pp=2, micro_batches=4)
    straight, resumed, l1, l2 = mm.launch(_straight_and_resumed, 2, config, str(tmp_path), None, timeout=240)[0]
    assert all(torch.equal(straight[k], resumed[k]) for k in straight) and l1 == l2


def test_resume_is_bit_identical_tp2(tmp_path):
    straight, resumed, l1, l2 = mm.launch(_straight_and_resumed, 2, parity_config(tp=2), str(tmp_path), None,
                                          timeout=240)[0]
    assert all(torch.equal(straight[k], resumed[k]) for k in straight) and l1 == l2


def test_consolidate_gives_the_distributed_models_loss(tmp_path):
    config = parity_config()
    mm.launch(_save_after, 2, config, str(tmp_path), HALF, timeout=240)
    out = checkpoint.consolidate(tmp_path, tmp_path / "model.safetensors")
    weights = load_file(str(out))
    model = mm.GPT(MODEL)
    model.load_state_dict(weights)
    _, dist_loss = mm.launch(_load_and_continue, 2, parity_config(lr=1e-12), str(tmp_path), timeout=240)[0]
    with torch.no_grad():
        x, y = data.global_batch(0, 8, 32, split="val")
        # HALF steps at lr 1e-12 change nothing measurable: the loaded model's loss is the saved model's.
        assert model(x, y)[1].item() == pytest.approx(dist_loss, rel=1e-5)


def _save_with_fault(config, directory):
    mesh, engine = _engine(config)
    _train(engine, mesh, config, 2)
    engine.save(directory)
    _train(engine, mesh, config, 2)
    os.environ[checkpoint.FAULT_ENV] = "1:1"              # rank 1 dies right after writing its shard
    engine.save(directory)


def test_killed_writer_leaves_previous_checkpoint(tmp_path):
    with pytest.raises(mm.WorkerError, match="rank 1 of 2 was killed by signal SIGKILL"):
        mm.launch(_save_with_fault, 2, parity_config(), str(tmp_path), timeout=120)
    visible = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert visible == ["latest", "step-00000002"]                   # no half-written step-00000004
    manifest, state = checkpoint.read(tmp_path)
    assert manifest["step"] == 2 and len(state["model"]) == len(mm.GPT(MODEL).state_dict())


def test_corruption_and_wrong_model_are_refused(tmp_path):
    mm.launch(_save_after, 2, parity_config(), str(tmp_path), 1, timeout=120)
    shard = tmp_path / "step-00000001" / "shard-00001.safetensors"
    blob = bytearray(shard.read_bytes())
    blob[-5] ^= 0xFF
    shard.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="shard-00001.safetensors: checksum mismatch"):
        checkpoint.read(tmp_path)
    manifest = json.loads((tmp_path / "step-00000001" / "manifest.json").read_text())
    with pytest.raises(CheckpointError, match="saved for another model: n_embd=64 there vs 32 here"):
        checkpoint.check_compatible(manifest, mm.GPTConfig.tiny(block_size=32, n_embd=32), tmp_path)
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        checkpoint.resolve(tmp_path / "nowhere")


def _train_with_saves(config, directory, steps, crash_at):
    """Train to ``steps``, saving every 2 steps; rank 1 raises when it reaches ``crash_at`` (if given)."""
    mesh = mm.init_mesh(mm.ParallelDims.infer(dist.get_world_size(), tp=config.tp, pp=config.pp))
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(MODEL), config, mesh)
    if checkpoint.resolve_or_none(directory):
        engine.load(directory)
    for batch in data.batches(mesh, steps - engine.step, config.batch_size, 32, seed=config.seed, start=engine.step):
        if engine.step == crash_at and mesh.rank == 1:
            raise RuntimeError(f"injected crash at step {engine.step}")
        engine.train_step(batch)
        if engine.step % 2 == 0:
            engine.save(directory)
    return engine.full_state_dict()


def test_crash_then_resume_continues_from_the_last_complete_checkpoint(tmp_path):
    config = parity_config(zero_stage=2)
    straight = mm.launch(_train_with_saves, 2, config, str(tmp_path / "straight"), 8, None, timeout=240)[0]
    with pytest.raises(mm.WorkerError, match="rank 1 of 2 failed with RuntimeError: injected crash at step 5"):
        mm.launch(_train_with_saves, 2, config, str(tmp_path / "run"), 8, 5, timeout=240)
    assert (tmp_path / "run" / "latest").read_text() == "step-00000004"
    resumed = mm.launch(_train_with_saves, 2, config, str(tmp_path / "run"), 8, None, timeout=240)[0]
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def _straight_and_resumed_with_scaler(config, directory):
    """Like `_straight_and_resumed`, plus both runs' final loss-scaler states and the one saved at step 10."""
    mesh, straight = _engine(config)
    _train(straight, mesh, config, 20)
    mesh, first = _engine(config)
    _train(first, mesh, config, 10)
    saved = first.scaler_state()
    first.save(directory)
    mesh, second = _engine(config)
    second.load(directory)
    _train(second, mesh, config, 10)
    return (straight.full_state_dict(), second.full_state_dict(), straight.losses[10:], second.losses,
            saved, straight.scaler_state(), second.scaler_state())


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_resume_is_bit_identical_in_low_precision(tmp_path, precision):
    # window 4: the fp16 scale doubles 4 clean steps after the last overflow; a resumed run that restarted
    # the scaler (scale 2**16, no overflow seen) would double it at other steps, round and skip differently.
    scaler = {"loss_scale_window": 4} if precision == "fp16" else {}       # fp16-only settings are refused otherwise
    config = parity_config(zero_stage=2, precision=precision, **scaler)
    straight, resumed, l1, l2, saved, end1, end2 = mm.launch(_straight_and_resumed_with_scaler, 2, config,
                                                             str(tmp_path), timeout=240)[0]
    assert all(torch.equal(straight[k], resumed[k]) for k in straight) and l1 == l2
    assert end1 == end2
    manifest = json.loads((tmp_path / "step-00000010" / "manifest.json").read_text())
    assert manifest["scaler"] == saved
    if precision == "fp16":
        assert set(saved) == {"kind", "scale", "cur_hysteresis", "iteration", "last_overflow", "skipped"}
        assert saved["iteration"] == 10 and end1["iteration"] == 20
    else:
        assert saved is None and end1 is None


LOW = {"dp2-zero3-bf16": (2, {"zero_stage": 3, "precision": "bf16"}),
       "tp2-zero1-fp16": (2, {"tp": 2, "zero_stage": 1, "precision": "fp16"}),
       "dp2-tp2-zero3-fp16": (4, {"tp": 2, "zero_stage": 3, "precision": "fp16"}),
       "dp4-zero2-bf16": (4, {"zero_stage": 2, "precision": "bf16"}),
       "tp2-pp2-bf16": (4, {"tp": 2, "pp": 2, "zero_stage": 1, "precision": "bf16", "micro_batches": 4}),
       "dp2-tp2-zero3": (4, {"tp": 2, "zero_stage": 3}), "dp4": (4, {}),
       "dp2-pp2-zero1-bf16": (4, {"pp": 2, "zero_stage": 1, "precision": "bf16", "micro_batches": 4})}


def _load_and_resave(config, directory, out):
    _, engine = _engine(config)
    stats = {}
    checkpoint.load(engine, directory, stats=stats)
    engine.save(out)
    return stats


@pytest.mark.parametrize("src, dst", [("dp2-zero3-bf16", "tp2-zero1-fp16"), ("dp2-tp2-zero3-fp16", "dp4-zero2-bf16"),
                                      ("tp2-pp2-bf16", "dp2-tp2-zero3"), ("dp4", "dp2-pp2-zero1-bf16")], ids=lambda v: v)
def test_every_tensor_survives_a_trip_through_another_layout(tmp_path, src, dst):
    """Load under another layout and precision, save again: every weight and optimizer state bit for bit."""
    (w_src, kw_src), (w_dst, kw_dst) = LOW[src], LOW[dst]
    mm.launch(_save_after, w_src, parity_config(**kw_src), str(tmp_path / "a"), 2, timeout=240)
    stats = mm.launch(_load_and_resave, w_dst, parity_config(**kw_dst), str(tmp_path / "a"), str(tmp_path / "b"),
                      timeout=240)
    for s in stats:       # each rank read exactly the bytes of the boxes it holds, whatever wrote them
        assert s["bytes_read"] == s["bytes_needed"] > 0, s
    (ma, a), (mb, b) = checkpoint.read(tmp_path / "a"), checkpoint.read(tmp_path / "b")
    assert ma["layout"] != mb["layout"] and ma["step"] == mb["step"] == 2
    assert a["model"].keys() == b["model"].keys() and a["optimizer"].keys() == b["optimizer"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(torch.equal(a["optimizer"][k][s], b["optimizer"][k][s]) for k in a["optimizer"] for s in a["optimizer"][k])


def _dropout_straight_and_resumed(config, directory):
    model = mm.GPTConfig.tiny(block_size=32, dropout=0.1)

    def engine():
        mesh = mm.init_mesh(mm.ParallelDims.infer(dist.get_world_size(), tp=config.tp))
        torch.manual_seed(config.seed)
        return mesh, mm.initialize(mm.GPT(model), config, mesh)
    mesh, straight = engine()
    _train(straight, mesh, config, 8)
    mesh, first = engine()
    _train(first, mesh, config, 4)
    first.save(directory)
    torch.manual_seed(999)                                    # the load must restore every stream itself
    mesh, second = engine()
    second.load(directory)
    _train(second, mesh, config, 4)
    return straight.full_state_dict(), second.full_state_dict(), straight.losses[4:], second.losses


def test_resume_with_dropout_under_tp_restores_every_random_stream(tmp_path):
    """tp 2, dropout 0.1: the default generator and each rank's tp stream (seed + 2718 + tp_rank) come back."""
    straight, resumed, l1, l2 = mm.launch(_dropout_straight_and_resumed, 2, parity_config(tp=2), str(tmp_path),
                                          timeout=240)[0]
    assert all(torch.equal(straight[k], resumed[k]) for k in straight) and l1 == l2


def test_manifest_text_is_the_same_json_one_line_per_tensor_file_and_rank():
    from minimega.checkpoint.manifest import dumps
    manifest = {"format": 2, "step": 7, "layout": {"dp": 2, "tp": 1}, "scaler": None,
                "files": {f"shard-0000{r}.safetensors": {"bytes": 100 + r, "sha256": "ab" * 32} for r in range(2)},
                "ranks": [{"file": f"shard-0000{r}.safetensors", "rng": {"cpu": f"rng/cpu/{r}"}} for r in range(2)],
                "tensors": {f"param/w{i}": {"dtype": "float32", "shape": [4, 2], "chunks": [
                    {"file": "shard-00000.safetensors", "key": f"w{i}", "offsets": [0, 0], "lengths": [4, 2]}]}
                    for i in range(3)}}
    text = dumps(manifest)
    assert json.loads(text) == manifest
    lines = text.splitlines()
    assert sum('"param/w' in line for line in lines) == 3 and sum('"shard-0000' in line and '"bytes"' in line
                                                                 for line in lines) == 2
