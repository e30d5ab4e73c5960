"""Where the optimizer step runs and what it moves: on the GPU, in host memory (ZeRO-Offload) or on NVMe (ZeRO-Infinity).

The step-time model's phases 5 and 6 (``perf.step_time``), for this rank's shard of the optimizer's work:

    GPU        Adam reads p32, m, v and the gradient and writes p32, m, v and the 16-bit copy, memory-bound on HBM.
    CPU        the same bytes at host memory bandwidth (Ren et al. 2021, arXiv:2101.06840); the reduced gradient shard
               goes down PCIe during the last backward (only the excess is exposed; all of it with pp > 1 or without
               overlap) and the updated 16-bit shard comes back up, exposed, before the all-gather.
    NVMe       as CPU, and the master and Adam's states live in files (`zero.nvme.NVMeOffloadStore`): the step reads
               each rank's K·Ψ/N_d bytes and writes them back (`disk.nvme_bytes_per_step`, K = 12 for Adam) at the
               node's disk bandwidth per GPU (`Hardware.disk_read_bandwidth`, ``disk_write_bandwidth``). Reads and
               writes share the drives, so they add up; the store pipelines them with the CPU Adam (read ahead,
               write behind, ``IN_FLIGHT_UNITS`` staging buffers), so only the disk's excess over the CPU Adam is
               exposed: max(0, read/β_r + write/β_w - t_adam). Without overlap (``overlap_comm=False``, no core free
               for the I/O threads) read, update and write run one after another and all of it is exposed.

Only the dense parameters' states go to disk: with experts their states stay on the GPU, as
`calculator.memory_per_gpu` counts them.
"""
from __future__ import annotations

from .disk import nvme_bytes_per_step
from .hardware import Hardware, collective_time


# --8<-- [start:optimizer_time]
def optimizer_time(cfg, hw: Hardware, n_stage: float, shard: float, grad_b: int, e: int, last_bwd: float) -> dict:
    """Seconds of the optimizer step by part: ``optimizer`` (Adam), ``offload`` (exposed PCIe), ``disk`` (exposed NVMe).

    Args:
        cfg: a `perf.PerfConfig`.
        n_stage: dense parameters on this GPU's pipeline stage (before ZeRO sharding).
        shard: parameters this rank's optimizer steps (its ZeRO shard, experts included).
        grad_b, e: bytes per gradient and per 16-bit parameter element.
        last_bwd: seconds of the last micro-batch's backward, what the gradients' trip down PCIe hides behind.
    """
    adam_bytes = shard * (4 * 6 + grad_b + e)          # read p32, m, v, grad; write p32, m, v and the 16-bit copy
    if cfg.offload == "none":
        return {"optimizer": adam_bytes / (hw.hbm_bandwidth * hw.memory_efficiency), "offload": 0.0, "disk": 0.0}
    optimizer = adam_bytes / (hw.host_memory_bandwidth * hw.memory_efficiency)
    down = collective_time("send_recv", shard * grad_b, 2, hw.host)
    up = collective_time("send_recv", shard * e, 2, hw.host)
    offload = (max(0.0, down - last_bwd) if cfg.pp == 1 and cfg.overlap_comm else down) + up
    return {"optimizer": optimizer, "offload": offload, "disk": disk_time(cfg, hw, n_stage, optimizer)}


def disk_time(cfg, hw: Hardware, n_stage: float, optimizer: float) -> float:
    """Exposed seconds of the disk tier in one step: K·Ψ/N_d read and written, less what the CPU Adam hides."""
    if cfg.offload_device != "nvme":
        return 0.0
    moved = nvme_bytes_per_step(n_stage, cfg.dp * cfg.cp, cfg.zero_stage)
    busy = moved["read"] / hw.disk_read_bandwidth + moved["write"] / hw.disk_write_bandwidth
    return max(0.0, busy - optimizer) if cfg.overlap_comm else busy
# --8<-- [end:optimizer_time]
