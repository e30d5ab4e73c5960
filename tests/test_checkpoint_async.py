"""Asynchronous checkpoints: training goes on while a save is written, and a kill during one loses nothing saved.

Two launches of 2 ranks (ZeRO-2, the tiny model, 6 steps). The first saves at step 2 with its writer held until
step 3 has changed every weight, saves again at step 4 and is killed (SIGKILL, rank 1, inside the background
writer) before that save commits. The second resumes from what is on disk and is compared bit for bit with a
run that never stopped.
"""
import os
import threading

import pytest
import torch
import torch.distributed as dist

import minimega as mm
from minimega import checkpoint, data
from minimega.checkpoint import saving
from parity import parity_config

MODEL = mm.GPTConfig.tiny(block_size=32)
STEPS, FIRST, SECOND = 6, 2, 4          # the run's length, the save that commits, the save that is killed


def _engine(config):
    mesh = mm.init_mesh(mm.ParallelDims.infer(dist.get_world_size()))
    torch.manual_seed(config.seed)
    return mesh, mm.initialize(mm.GPT(MODEL), config, mesh)


def _step(engine, mesh, config):
    batch = next(data.batches(mesh, 1, config.batch_size, 32, seed=config.seed, start=engine.step))
    engine.train_step(batch)


def _saves_then_killed(config, directory):
    """Save at FIRST while its writer is held (training goes on), save at SECOND, die inside that save's writer."""
    mesh, engine = _engine(config)
    release, writes = threading.Event(), []
    real_write = saving.write_safetensors

    def held_write(*args, **kwargs):        # the background writer starts only when the test says so
        writes.append(threading.current_thread().name)
        assert release.wait(60), "the held writer was never released"
        return real_write(*args, **kwargs)
    saving.write_safetensors = held_write
    for _ in range(FIRST):
        _step(engine, mesh, config)
    engine.save(directory)
    _step(engine, mesh, config)             # step 3 runs (and changes every weight) while the save is held
    assert engine._saver.in_flight and not (mesh.rank == 0 and os.path.exists(f"{directory}/latest"))
    release.set()
    _step(engine, mesh, config)
    os.environ[checkpoint.FAULT_ENV] = "1:1"             # rank 1 dies once its writer has written its shard
    engine.save(directory)                  # waits for the first save, then starts the second
    assert writes[0] == "minimega-save-2"                # written by the background thread
    while engine.step < STEPS:
        _step(engine, mesh, config)
    engine.wait_for_save()
    raise AssertionError("rank 1 was not killed during the second save")


def _straight_and_resumed(config, directory):
    """A run that never stopped (its state at FIRST and at the end), and one resumed from ``directory``."""
    mesh, straight = _engine(config)
    at_first = None
    while straight.step < STEPS:
        _step(straight, mesh, config)
        if straight.step == FIRST:
            at_first = straight.full_state_dict()
    mesh, resumed = _engine(config)
    start = resumed.load(directory)
    while resumed.step < STEPS:
        _step(resumed, mesh, config)
    return at_first, start, straight.full_state_dict(), resumed.full_state_dict(), straight.losses[FIRST:], \
        resumed.losses


@pytest.fixture(scope="module")
def killed_during_async_save(tmp_path_factory):
    directory = tmp_path_factory.mktemp("async")
    config = parity_config(zero_stage=2, async_save=True)
    with pytest.raises(mm.WorkerError, match="rank 1 of 2 was killed by signal SIGKILL"):
        mm.launch(_saves_then_killed, 2, config, str(directory), timeout=120)
    return directory, mm.launch(_straight_and_resumed, 2, config, str(directory), timeout=120)[0]


def test_a_kill_during_an_async_save_leaves_the_previous_checkpoint(killed_during_async_save):
    directory, _ = killed_during_async_save
    visible = sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))
    assert visible == ["latest", f"step-{FIRST:08d}"]                 # no half-written step-4
    assert (directory / "latest").read_text() == f"step-{FIRST:08d}"
    assert (directory / f".tmp-step-{SECOND:08d}").is_dir()         # the killed save got as far as its files


def test_the_async_save_holds_the_state_of_its_step_not_a_later_one(killed_during_async_save):
    directory, (at_first, *_) = killed_during_async_save
    manifest, state = checkpoint.read(directory)                     # every check, checksums included
    assert manifest["step"] == FIRST and manifest["train_config"]["async_save"] is True
    assert state["model"].keys() == at_first.keys()
    assert all(torch.equal(state["model"][k], at_first[k]) for k in at_first)   # step 3 ran while it was written


def test_resume_from_the_async_save_is_bit_identical(killed_during_async_save):
    _, (_, start, straight, resumed, l1, l2) = killed_during_async_save
    assert start == FIRST
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert l1 == l2


def test_async_save_is_a_checked_flag():
    with pytest.raises(ValueError, match="TrainConfig.async_save must be True or False"):
        mm.TrainConfig(async_save=1)


def test_async_save_without_saves_is_refused(capsys):
    from minimega.tools.cli import main
    assert main(["train", "--async-save"]) == 2
    assert "--async-save" in (err := capsys.readouterr().err) and "--save-every" in err
