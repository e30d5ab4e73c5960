"""minimega.analysis.calculator: the optimizer states on NVMe in `memory_per_gpu` (no torch, no process group)."""
from dataclasses import replace

import pytest

from minimega import estimate as est
from minimega.analysis import disk

GPT2 = est.MemoryConfig(layers=12, hidden=768, heads=12, vocab=50257, seq_len=1024, dp=4, zero_stage=1,
                        offload="optimizer")


@pytest.mark.parametrize("precision", ["mixed", "bf16", "fp32", "fp8"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_memory_puts_the_states_on_disk_as_nvme_placement_does(precision, stage):
    """With the states on NVMe the host keeps the fp32 gradient shard (4Ψ/N_d) and the disk holds the master and
    Adam's moments (12Ψ/N_d): `disk.nvme_placement`, an independent route; the GPU's bytes do not change."""
    cfg = replace(GPT2, precision=precision, zero_stage=stage)
    cpu, nvme = est.memory_per_gpu(cfg), est.memory_per_gpu(replace(cfg, offload_device="nvme"))
    want = disk.nvme_placement(cpu["stage_params"], 4, stage, precision)
    assert (nvme["nvme"], nvme["cpu"]) == pytest.approx((want["nvme"], want["cpu"]), rel=1e-12)
    assert nvme["cpu"] == pytest.approx(4 * cpu["stage_params"] / 4, rel=1e-12)
    assert nvme["nvme"] == pytest.approx(12 * cpu["stage_params"] / 4, rel=1e-12)
    assert cpu["nvme"] == 0.0 and nvme["total"] == cpu["total"]


def test_parameters_offloaded_too_stay_in_host_memory():
    """'optimizer+params' with the states on NVMe: the 16-bit parameter shards stay on the host (2Ψ/N_d more)."""
    cfg = replace(GPT2, zero_stage=3, offload="optimizer+params", offload_device="nvme")
    got = est.memory_per_gpu(cfg)
    psi = got["stage_params"]
    assert got["cpu"] == pytest.approx((4 + 2) * psi / 4, rel=1e-12) and got["nvme"] == pytest.approx(12 * psi / 4)


@pytest.mark.parametrize("kw, match", [
    ({"offload": "none", "offload_device": "nvme"}, "offload_device='nvme' needs offload="),
    ({"offload_device": "tape"}, r"offload_device='tape': expected one of \('cpu', 'nvme'\)"),
])
def test_bad_offload_devices_are_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        est.memory_per_gpu(replace(GPT2, **kw))
