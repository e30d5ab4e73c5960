"""minimega.analysis.perf_offload: the optimizer step on the GPU, on the CPU and with its states on NVMe (no torch)."""
from dataclasses import replace

import pytest

from minimega import estimate as est
from minimega.analysis import perf
from minimega.analysis.hardware import HARDWARE, parse_custom
from minimega.analysis.perf import PerfConfig

GB = 1e9
# 13B (GPT-3's 13B shape with h = 5120) under ZeRO-3 with optimizer offload on one 8-GPU node
Z3_13B = PerfConfig(layers=40, hidden=5120, heads=40, vocab=50257, seq_len=2048, micro_batch=4, precision="bf16",
                    zero_stage=3, dp=8, global_batch=64, recompute="full", attention="fused", offload="optimizer")


def test_disk_presets_are_drives_times_the_measured_rate_over_the_gpus():
    """DeepNVMe (DeepSpeed 2024): 4 SSDs in RAID-0 read 10 GB/s and write 5 GB/s. DGX H100: 8 data drives for
    8 GPUs (NVIDIA DGX BasePOD RA); DGX A100: 4 for 8 (assumed, hardware_sources.md)."""
    per_drive = (10 * GB / 4, 5 * GB / 4)
    for name, drives in (("a100-40gb", 4), ("a100-80gb", 4), ("h100", 8), ("h200", 8)):
        hw = HARDWARE[name]
        assert (hw.disk_read_bandwidth, hw.disk_write_bandwidth) == pytest.approx(
            (drives * per_drive[0] / 8, drives * per_drive[1] / 8), rel=1e-12), name
    custom = parse_custom("peak_tflops=1,hbm_gbs=1,memory_gb=1,nvlink_gbs=1,ib_gbs=1,disk_read_gbs=7,disk_write_gbs=3")
    assert (custom.disk_read_bandwidth, custom.disk_write_bandwidth) == (7 * GB, 3 * GB)
    with pytest.raises(ValueError, match="disk_write_bandwidth"):
        replace(custom, disk_write_bandwidth=0.0).check()


@pytest.mark.parametrize("hw", ["a100-80gb", "h100"])
def test_nvme_step_reads_and_writes_k_psi_over_nd_beyond_what_cpu_adam_hides(hw):
    """Each rank reads its 12·Ψ/N_d bytes of master and moments and writes them back (`nvme_bytes_per_step`):
    read/β_r + write/β_w, minus the CPU Adam it is pipelined with; the rest of the step is the CPU offload's."""
    h = HARDWARE[hw]
    cpu, nvme = perf.step_time(Z3_13B, hw), perf.step_time(replace(Z3_13B, offload_device="nvme"), hw)
    psi = est.stage_params(Z3_13B.memory_config())
    moved = 12 * psi / 8
    busy = moved / h.disk_read_bandwidth + moved / h.disk_write_bandwidth
    assert nvme["disk"] == pytest.approx(busy - cpu["optimizer"], rel=1e-12)
    assert cpu["disk"] == 0.0
    for k in ("compute", "dp_comm", "offload", "optimizer"):
        assert nvme[k] == cpu[k], k
    assert nvme["total"] == pytest.approx(cpu["total"] + nvme["disk"], rel=1e-12)
    assert nvme["disk"] > cpu["total"]       # a 13B model's states through one node's drives: the bottleneck


def test_overlap_off_exposes_the_whole_disk_time_and_more_ranks_share_it():
    on = perf.step_time(replace(Z3_13B, offload_device="nvme"), "h100")
    off = perf.step_time(replace(Z3_13B, offload_device="nvme", overlap_comm=False), "h100")
    assert off["disk"] == pytest.approx(on["disk"] + on["optimizer"], rel=1e-12)
    wide = perf.step_time(replace(Z3_13B, offload_device="nvme", dp=64, global_batch=256), "h100")
    assert wide["disk"] < on["disk"] / 7                 # each rank's shard is 1/64, not 1/8


def test_gpu_optimizer_has_no_copies_and_no_disk():
    r = perf.step_time(replace(Z3_13B, offload="none"), "h100")
    assert r["offload"] == r["disk"] == 0.0


@pytest.mark.parametrize("kw, match", [
    ({"offload": "none", "offload_device": "nvme"}, "offload_device='nvme' needs offload="),
    ({"offload_device": "tape"}, r"offload_device='tape': expected one of \('cpu', 'nvme'\)"),
])
def test_bad_offload_devices_are_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        perf.step_time(replace(Z3_13B, **kw), "h100")
    with pytest.raises(ValueError, match=match):
        est.memory_per_gpu(replace(Z3_13B.memory_config(), **kw))
