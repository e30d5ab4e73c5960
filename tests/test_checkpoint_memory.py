"""A sharded checkpoint costs each rank its own shard, no more: peak memory and bytes read, measured.

GPTConfig.small() (10.9M parameters) at dp 4 under ZeRO-3: each rank owns a quarter of the fp32
masters and of Adam's two moments, 12 bytes per parameter / 4 = about 33 MB. Saving must not gather
the state (the old design put 16 bytes per parameter on every rank); loading must read only this
rank's boxes. Measured per rank from the kernel's own counters:

- peak memory: ``VmHWM`` after resetting it (``/proc/self/clear_refs``), minus ``VmRSS`` before, with the
  allocator's free memory handed back first (``malloc_trim``) and every allocation over 128 KiB mapped and
  unmapped on its own (``mallopt(M_MMAP_THRESHOLD)``), so that RSS follows the live tensors;
- bytes read: ``rchar`` of ``/proc/self/io`` (every byte the process got from read/pread).

Consolidation (one process, no group) streams: its peak is a few tensors, never the whole model.
"""
import ctypes
import gc

import torch
import torch.distributed as dist

import minimega as mm
from minimega import checkpoint, data

MODEL = mm.GPTConfig.small()
MODEL_BYTES = 4 * 10_916_736


def _status(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _rchar() -> int:
    for line in open("/proc/self/io"):
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise KeyError("rchar")


def _measured(fn):
    """(peak extra bytes, bytes read) while ``fn()`` runs."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 1 << 17)                              # M_MMAP_THRESHOLD: fixed, not adaptive
    gc.collect()
    libc.malloc_trim(0)
    base = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                                       # VmHWM := VmRSS
    read0 = _rchar()
    fn()
    return _status("VmHWM") - base, _rchar() - read0


def _save_and_load(config, directory):
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(MODEL), config, mesh)
    for batch in data.batches(mesh, 1, config.batch_size, 32, seed=config.seed):
        engine.train_step(batch)                           # Adam's moments exist
    save_peak, _ = _measured(lambda: engine.save(directory))
    shard = (directory / "step-00000001" / f"shard-{mesh.rank:05d}.safetensors").stat().st_size
    torch.manual_seed(config.seed)
    fresh = mm.initialize(mm.GPT(MODEL), config, mesh)
    load_peak, read = _measured(lambda: fresh.load(directory))
    same = all(torch.equal(a, b) for a, b in zip(engine.wrapper.store.master, fresh.wrapper.store.master))
    largest = max(p.numel() * 4 for p in mm.GPT(MODEL).parameters())
    consolidate_peak = None
    if mesh.rank == 0:                                     # one process, no group: one tensor at a time
        consolidate_peak, _ = _measured(lambda: checkpoint.consolidate(directory, directory / "model.safetensors"))
    return {"save_peak": save_peak, "load_peak": load_peak, "read": read, "shard": shard, "largest": largest,
            "same": same, "consolidate_peak": consolidate_peak}


def test_save_and_load_cost_a_shard_per_rank(tmp_path):
    config = mm.TrainConfig(zero_stage=3, batch_size=8, seq_len=32, seed=1)
    results = mm.launch(_save_and_load, 4, config, tmp_path, timeout=600)
    for rank, r in enumerate(results):
        print(f"rank {rank}: shard {r['shard'] / 2**20:.1f} MiB, largest tensor {r['largest'] / 2**20:.2f} MiB, "
              f"peak extra save {r['save_peak'] / 2**20:.1f} MiB, load {r['load_peak'] / 2**20:.1f} MiB, "
              f"read {r['read'] / 2**20:.2f} MiB")
        assert r["same"]
        bound = r["shard"] + r["largest"]
        assert r["save_peak"] <= bound, f"rank {rank}: save peaked {r['save_peak']} bytes > shard + largest {bound}"
        assert r["load_peak"] <= bound, f"rank {rank}: load peaked {r['load_peak']} bytes > shard + largest {bound}"
        assert 0.95 * r["shard"] <= r["read"] <= 1.05 * r["shard"], f"rank {rank}: read {r['read']} vs shard {r['shard']}"
    peak = results[0]["consolidate_peak"]
    print(f"consolidate: peak extra {peak / 2**20:.1f} MiB (the model's fp32 weights: {MODEL_BYTES / 2**20:.1f} MiB)")
    # Streaming: a few tensors and the parsed manifest (~10 MiB measured), never the weights (41.6 MiB) at once.
    assert peak <= MODEL_BYTES / 2, f"consolidate peaked {peak} bytes: more than half the model's weights"
