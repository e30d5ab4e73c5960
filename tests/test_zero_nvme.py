"""NVMe offload (`zero/nvme.py`): the disk tier trains bit for bit as the CPU store and moves the bytes the estimator says.

One 2-rank launch runs ZeRO-1 (fp32), ZeRO-2 (bf16) and ZeRO-3 (fp32) twice in lockstep, with
``offload_optimizer`` (the host store, the reference) and with ``nvme_path`` too. After every step:
the consolidated weights are equal to the last bit, the files read back with numpy (not through the
store) hold exactly the reference's fp32 master and Adam moments, and the bytes the store read and wrote
are `estimate.nvme_bytes_per_step` for the padded Ψ. The pipeline's order and its bound (3 buffers) and the
refusals are checked without a process group.
"""
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist

import minimega as mm
from minimega import data, estimate
from minimega.zero import model_units
from minimega.zero.nvme import ALIGN, storage_io

MODEL = dict(vocab_size=255, block_size=64, n_layer=3, n_head=3, n_embd=33)     # odd widths: padded shards
DP, STEPS = 2, 3
CASES = [(1, "fp32"), (2, "bf16"), (3, "fp32")]


def _nvme_worker(cases, directory):
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    out = {}
    for stage, precision in cases:
        engines = []
        for nvme in (None, directory):
            config = mm.TrainConfig(zero_stage=stage, precision=precision, offload_optimizer=True, nvme_path=nvme,
                                    batch_size=8, gradient_clipping=0.5, weight_decay=0.1, seed=3)
            torch.manual_seed(config.seed)
            engines.append(mm.initialize(mm.GPT(mm.GPTConfig(**MODEL)), config, mesh))
        host, disk = (e.zero_stages[0].store for e in engines)
        steps = []
        for batch in data.batches(mesh, STEPS, 8, 64, seed=3):
            losses = [engines[0].train_step(batch)]
            before = storage_io()                                  # the disk engine's whole step, this process
            losses.append(engines[1].train_step(batch))
            after = storage_io()
            weights = [e.full_state_dict() for e in engines]
            files = []                                             # each unit's file, read independently
            for fd, m in zip(disk.fds, host.master):            # unlinked files: opened again through /proc
                raw = torch.from_numpy(np.fromfile(f"/proc/self/fd/{fd}", dtype=np.float32))
                n, state = m.numel(), host.optimizer.state[m]
                files.append(torch.equal(raw[:n], m.detach()) and torch.equal(raw[n:2 * n], state["exp_avg"])
                             and torch.equal(raw[2 * n:3 * n], state["exp_avg_sq"]) and not raw[3 * n:].any()
                             and raw.numel() * 4 % ALIGN == 0)
            steps.append({"loss": losses[0] == losses[1], "files": all(files),
                          "weights": all(torch.equal(weights[1][k], v) for k, v in weights[0].items()),
                          "traffic": dict(disk.traffic), "direct": disk.direct,
                          "storage": {k: after[k] - before[k] for k in after}})
        resumed = None
        if stage == 2:                 # a checkpoint reads the files; a load writes into a fresh store's files
            engines[1].save(os.path.join(directory, "checkpoint"))
            torch.manual_seed(0)
            engine = mm.initialize(mm.GPT(mm.GPTConfig(**MODEL)), engines[1].config, mesh)
            engine.load(os.path.join(directory, "checkpoint"))
            batch = next(iter(data.batches(mesh, 1, 8, 64, start=STEPS, seed=3)))
            engines[0].train_step(batch)
            engine.train_step(batch)
            weights = [e.full_state_dict() for e in (engines[0], engine)]
            resumed = all(torch.equal(weights[1][k], v) for k, v in weights[0].items())
            engine.zero_stages[0].store.close()
        out[(stage, precision)] = {"steps": steps, "memory": engines[1].report()["memory_at_step"],
                                   "directory": disk.directory, "files": len(disk.fds),
                                   "left": os.path.exists(disk.directory),
                                   "resumed": resumed}
        disk.close()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("nvme")
    out = mm.launch(_nvme_worker, DP, CASES, str(directory), timeout=300)
    assert os.listdir(directory) == ["checkpoint"]                # no rank's files or directory left behind
    return out


def _psi():
    units = [[p.numel() for _, p in params] for _, params in model_units(mm.GPT(mm.GPTConfig(**MODEL)))]
    return sum(estimate.padded_numel(sum(u), DP) for u in units), len(units)


@pytest.mark.parametrize("stage,precision", CASES, ids=[f"stage{s}-{p}" for s, p in CASES])
def test_nvme_offload_is_bit_equal_to_cpu_offload_at_every_step(runs, stage, precision):
    for rank, result in enumerate(runs):
        for k, step in enumerate(result[(stage, precision)]["steps"]):
            assert step["loss"] and step["weights"], f"rank {rank} step {k}: weights differ from CPU offload"
            assert step["files"], f"rank {rank} step {k}: a unit's file is not the CPU store's master and moments"
        if stage == 2:                # saved from the files, loaded into new ones: the next step is the host store's
            assert result[(stage, precision)]["resumed"], f"rank {rank}: the step after a resume differs"


@pytest.mark.parametrize("stage,precision", CASES, ids=[f"stage{s}-{p}" for s, p in CASES])
def test_bytes_read_and_written_per_step_are_the_estimators(runs, stage, precision):
    psi, n_units = _psi()
    want = estimate.nvme_bytes_per_step(psi, DP, stage)
    placed = estimate.nvme_placement(psi, DP, stage, precision)
    for rank, result in enumerate(runs):
        run = result[(stage, precision)]
        assert [s["traffic"] for s in run["steps"]] == [{"read": want["read"], "written": want["write"]}] * STEPS
        m = run["memory"]                                         # at the step: what is where
        assert (m["optimizer_location"], m["master"], m["optimizer_states"]) == ("nvme", 0, 0)
        assert (m["nvme"], m["host_grads"]) == (placed["nvme"], placed["cpu"]), f"rank {rank}"
        assert (m["params"], m["grads"]) == (placed["params"], placed["grads"]), f"rank {rank}"
        assert run["files"] == n_units and os.path.basename(run["directory"]).startswith(f"minimega-rank{rank}-")
        assert not run["left"]                                    # unlinked once open: nothing outlives the process


@pytest.mark.parametrize("stage,precision", CASES, ids=[f"stage{s}-{p}" for s, p in CASES])
def test_the_bytes_come_from_the_disk(runs, stage, precision):
    """/proc/self/io's read_bytes and write_bytes (page-cache hits excluded) over the disk engine's steps: at least
    the estimator's bytes, at most 10 % more (each unit's file is padded to 4 KiB; the rest of the step reads none).
    The test's directory is on a block device (ext4 under /tmp here), where O_DIRECT is taken."""
    psi, _ = _psi()
    want = estimate.nvme_bytes_per_step(psi, DP, stage)
    for rank, result in enumerate(runs):
        steps = result[(stage, precision)]["steps"]
        assert all(s["direct"] for s in steps), "the files were not opened with O_DIRECT"
        read = sum(s["storage"]["read_bytes"] for s in steps)
        written = sum(s["storage"]["write_bytes"] for s in steps)
        print(f"rank {rank} stage {stage}: read {read:,} B, wrote {written:,} B over {STEPS} steps; "
              f"estimate {STEPS * want['read']:,.0f} B each way")
        assert STEPS * want["read"] <= read <= 1.1 * STEPS * want["read"], f"rank {rank}: read_bytes {read}"
        assert STEPS * want["write"] <= written <= 1.1 * STEPS * want["write"], f"rank {rank}: write_bytes {written}"


def test_units_are_read_ahead_and_written_behind_through_three_buffers(tmp_path):
    """Submission order for 4 units: read i+1 is issued before unit i is updated and write i right after it;
    unit 3 is read into the buffer unit 0 was written from (at most 3 buffers); the numbers are the host store's."""
    from minimega.zero.nvme import NVMeOffloadStore
    from minimega.zero.offload import CPUOffloadStore
    torch.manual_seed(0)
    params = [torch.randn(n) for n in (5, 7, 3, 6)]
    adam = lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.1, foreach=False)
    ref, store = CPUOffloadStore([p.clone() for p in params], adam), NVMeOffloadStore(params, adam, str(tmp_path))
    log = []
    submit, update = store.io.submit, store._update
    store.io.submit = lambda fn, i, slot: (log.append((fn.__name__[1:], i, slot)), submit(fn, i, slot))[1]
    store._update = lambda i, slot, grad: (log.append(("update", i, slot)), update(i, slot, grad))
    for step in range(2):
        for s in (ref, store):
            for i, p in enumerate(params):
                s.receive_grad(i, torch.full_like(p, step + 1.0) * torch.arange(p.numel()))
            s.grads_received()
            s.set_grads([], 2.0)
            s.step()
            s.zero_grad()
    assert log[:13] == [("read", 0, 0), ("read", 1, 1), ("update", 0, 0), ("write", 0, 0), ("read", 2, 2),
                        ("update", 1, 1), ("write", 1, 1), ("read", 3, 0), ("update", 2, 2), ("write", 2, 2),
                        ("update", 3, 0), ("write", 3, 0), ("read", 0, 0)]
    assert all(torch.equal(a, b) for a, b in zip(ref.shards, store.shards))
    assert store.staging.shape == (3, ALIGN // 4) and store.in_flight_bound == 3 * ALIGN    # one padded file each
    assert store.staging.data_ptr() % ALIGN == 0
    assert store.total == {"read": 2 * 21 * 12, "written": 2 * 21 * 12}
    store.close()


def test_every_step_reads_and_writes_the_drive(tmp_path):
    """No process group: 3 units of 40,000 elements (480,000 B per file under Adam), 3 steps, /proc/self/io around
    each: every step fetches each file from storage and sends it back, not only the first (the page cache would
    answer a buffered read of what the last step wrote: read_bytes 0)."""
    from minimega.zero.nvme import NVMeOffloadStore, aligned
    params = [torch.randn(40_000) for _ in range(3)]
    store = NVMeOffloadStore(params, lambda p: torch.optim.AdamW(p, lr=0.1, foreach=False), str(tmp_path))
    moved = 3 * aligned(40_000 * 12)
    seen = []
    for step in range(3):
        for i, p in enumerate(params):
            store.receive_grad(i, torch.ones_like(p))
        store.grads_received()
        store.set_grads([], 1.0)
        store.step()
        store.zero_grad()
        seen.append(dict(store.storage))
    store.close()
    assert store.direct
    assert all(moved <= s["read_bytes"] <= 1.1 * moved and moved <= s["write_bytes"] <= 1.1 * moved for s in seen), seen


def test_a_file_system_without_o_direct_is_named_and_the_page_cache_used(tmp_path, capsys, monkeypatch):
    """A file system that refuses O_DIRECT at open (EINVAL: tmpfs before Linux 6.6; simulated here, as this kernel's
    tmpfs takes it): one line on stderr, and the buffered path trains the same numbers."""
    import errno
    from minimega.zero import nvme
    real_open = os.open

    def refusing(path, flags, *mode):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *mode)
    monkeypatch.setattr(nvme.os, "open", refusing)
    torch.manual_seed(0)
    params = [torch.randn(n) for n in (5, 7)]
    adam = lambda p: torch.optim.AdamW(p, lr=0.1, foreach=False)
    ref = nvme.CPUOffloadStore([p.clone() for p in params], adam)
    stores = [nvme.NVMeOffloadStore([p.clone() for p in params], adam, str(tmp_path)) for _ in range(2)]
    err = capsys.readouterr().err
    assert err.count("refuses O_DIRECT") == 1 and f"nvme_path={str(tmp_path)!r}" in err      # one line, not per store
    for s in (ref, *stores):
        for i, p in enumerate(params):
            s.receive_grad(i, torch.ones_like(p))
        s.grads_received()
        s.set_grads([], 1.0)
        s.step()
    assert [s.direct for s in stores] == [False, False]
    assert all(torch.equal(a, b) for a, b in zip(ref.shards, stores[0].shards))
    for s in stores:
        s.close()


def test_a_full_drive_fails_at_the_start_and_leaves_no_folder(tmp_path, monkeypatch):
    """ENOSPC while a unit's space is allocated: one line naming the directory, and the rank's folder is gone."""
    import errno
    from minimega.zero import nvme
    calls = []

    def full(fd, offset, size):
        calls.append(size)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(nvme.os, "posix_fallocate", full)
    adam = lambda p: torch.optim.AdamW(p, lr=0.1)
    with pytest.raises(OSError, match="no space left for unit 1's 4,096 bytes in .*minimega-rank0-"):
        nvme.NVMeOffloadStore([torch.randn(5), torch.randn(7)], adam, str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_nvme_path_must_be_a_writable_directory(tmp_path):
    from minimega.zero.nvme import rank_directory
    with pytest.raises(ValueError, match="nvme_path=.*missing.* does not exist"):
        rank_directory(str(tmp_path / "missing"), 0)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="nvme_path=.*file.* is not a directory"):
        rank_directory(str(tmp_path / "file"), 0)
    if os.geteuid() != 0:                                          # root writes anywhere
        (tmp_path / "ro").mkdir(mode=0o500)
        with pytest.raises(ValueError, match="nvme_path=.*ro.* is not writable"):
            rank_directory(str(tmp_path / "ro"), 0)
    assert rank_directory(str(tmp_path), 3) != rank_directory(str(tmp_path), 3)     # a fresh one per store
    from minimega.train.engine import validate                           # before any rank starts (minimega train)
    config = mm.TrainConfig(zero_stage=1, offload_optimizer=True, nvme_path=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="nvme_path=.*missing.* does not exist"):
        validate(mm.GPTConfig.tiny(), config, mm.ParallelDims(dp=2))


def test_config_and_deepspeed_reader():
    with pytest.raises(ValueError, match=r"nvme_path='/x' has an effect only with offload_optimizer=True"):
        mm.TrainConfig(zero_stage=1, nvme_path="/x")
    with pytest.raises(ValueError, match=r"TrainConfig\.nvme_path must be the path of a directory"):
        mm.TrainConfig(zero_stage=1, offload_optimizer=True, nvme_path="")
    ds = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"}}}
    cfg = mm.TrainConfig.from_deepspeed(ds)
    assert (cfg.offload_optimizer, cfg.nvme_path) == (True, "/local_nvme")
    with pytest.raises(ValueError, match="device='nvme' needs nvme_path"):
        mm.TrainConfig.from_deepspeed({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})
    with pytest.raises(ValueError, match="nvme_path has an effect only with device 'nvme'"):
        mm.TrainConfig.from_deepspeed({"zero_optimization": {"stage": 2, "offload_optimizer": {
            "device": "cpu", "nvme_path": "/local_nvme"}}})


def test_disk_estimator():
    """12 bytes per shard element each way under Adam (fp32 master + two moments), 4 under SGD; the host keeps 4."""
    psi, gpus = 7.5e9, 64
    assert estimate.nvme_bytes_per_step(psi, gpus, 3) == {"read": 12 * psi / gpus, "write": 12 * psi / gpus,
                                                          "total": 24 * psi / gpus}
    assert estimate.nvme_bytes_per_step(psi, gpus, 1, "sgd")["read"] == 4 * psi / gpus
    cpu = estimate.model_state_placement(psi, gpus, 3, "mixed", "optimizer")
    disk = estimate.nvme_placement(psi, gpus, 3, "mixed")
    assert (disk["cpu"], disk["nvme"], disk["cpu"] + disk["nvme"]) == (4 * psi / gpus, 12 * psi / gpus, cpu["cpu"])
    assert estimate.nvme_placement(psi, gpus, 2, "fp32")["nvme"] == 12 * psi / gpus     # K = 8 + the host's master
    with pytest.raises(ValueError, match="stages 1-3"):
        estimate.nvme_bytes_per_step(psi, gpus, 0)
