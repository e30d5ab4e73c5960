"""minimega.analysis.hardware: the presets after Hopper against their vendor documents, NVLink domains larger
than a node, and a mesh fabric (no process group, no torch)."""
from dataclasses import replace

import pytest

from minimega.analysis import perf
from minimega.analysis.hardware import HARDWARE, Hardware, parse_custom

GB = 1e9


# As published (hardware_sources.md, "as published"): NVIDIA prints tensor rates with sparsity (dense = sparse / 2),
# AMD's MI300X data sheet prints the dense rate; links both ways (one way = both ways / 2); system totals / GPUs.
PUBLISHED = {
    "b200": dict(bf16_dense=4.5e15 / 2, fp8_dense=9e15 / 2, memory=180 * GB, hbm=7.7e12, nvlink_both=14.4e12 / 8, domain=8, per_node=8,
                 nic_gbit=400, nics=8),
    "gb200-nvl72": dict(bf16_dense=5e15 / 2, fp8_dense=10e15 / 2, memory=186 * GB, hbm=8e12, nvlink_both=1.8e12, domain=72,
                        per_node=4, nic_gbit=400, nics=4),
    "mi300x": dict(bf16_dense=1307.4e12, fp8_dense=2614.9e12, memory=192 * GB, hbm=5.3e12, nvlink_both=896 * GB, domain=8, per_node=8,
                   nic_gbit=400, nics=8),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_post_hopper_presets_match_their_sources(name):
    hw, src = HARDWARE[name], PUBLISHED[name]
    hw.check()
    assert hw.peak_flops == pytest.approx(src["bf16_dense"], rel=1e-12)
    assert hw.fp8_flops == pytest.approx(src["fp8_dense"], rel=1e-12)
    assert hw.memory_bytes == pytest.approx(src["memory"], rel=1e-12)
    assert hw.hbm_bandwidth == pytest.approx(src["hbm"], rel=1e-12)
    assert hw.intra.bandwidth == pytest.approx(src["nvlink_both"] / 2, rel=1e-12)
    assert (hw.domain, hw.gpus_per_node, hw.nics_per_node) == (src["domain"], src["per_node"], src["nics"])
    assert hw.link(10 ** 6).bandwidth == src["nic_gbit"] / 8 * GB * src["nics"] / src["per_node"]


def test_blackwell_outruns_hopper_and_gb200_runs_hotter_than_hgx():
    h100, b200, gb = HARDWARE["h100"], HARDWARE["b200"], HARDWARE["gb200-nvl72"]
    assert b200.peak_flops / h100.peak_flops == pytest.approx(2250 / 989)
    assert gb.peak_flops > b200.peak_flops and gb.hbm_bandwidth > b200.hbm_bandwidth


def test_a_72_gpu_domain_keeps_groups_on_nvlink_that_8_gpu_nodes_send_over_infiniband():
    gb, h100 = HARDWARE["gb200-nvl72"], HARDWARE["h100"]
    for span in (2, 4, 8, 24, 36, 72):                    # every span that divides the rack
        assert gb.link(span) is gb.intra
    assert h100.link(8) is h100.intra and h100.link(16).bandwidth == 50 * GB
    for span in (16, 32, 64, 144):                        # a span that does not divide 72 straddles two racks
        assert gb.link(span).bandwidth == 50 * GB, span
    # a job inside one rack has no rack boundary to straddle: tp 16 or 64 on 64 GPUs stays on NVLink
    assert gb.link(16, 64) is gb.link(64, 64) is gb.link(72, 72) is gb.intra
    assert gb.link(16, 144).bandwidth == gb.link(16).bandwidth == 50 * GB
    assert h100.link(6, 8) is h100.intra and h100.link(6, 16).bandwidth == 50 * GB      # ranks 6-11 straddle
    # the compute tray is 4 GPUs with 4 NICs: beyond the rack each GPU has one 400 Gb/s NIC
    assert gb.link(144).name.startswith("InfiniBand")


def test_a_mesh_group_reaches_only_its_own_links():
    mi = HARDWARE["mi300x"]
    per_link = mi.intra.bandwidth / 7
    assert per_link == pytest.approx(64 * GB)            # 128 GB/s both ways per Infinity Fabric link
    assert mi.link(2).bandwidth == pytest.approx(per_link)
    assert mi.link(4).bandwidth == pytest.approx(3 * per_link)
    assert mi.link(8) is mi.intra
    switched = replace(mi, mesh=False)
    assert switched.link(2) is switched.intra
    # a tp=2 all-reduce is 7x slower on the mesh than a switch of the same total would make it
    cfg = perf.PerfConfig(layers=4, hidden=4096, heads=32, vocab=32000, seq_len=2048, tp=2, global_batch=4)
    assert perf.layer_times(cfg, mi)["tp_comm"] > 5 * perf.layer_times(cfg, switched)["tp_comm"]


def test_nvlink_domain_is_checked_and_parsed():
    base = HARDWARE["h100"]
    with pytest.raises(ValueError, match="nvlink_domain=12: expected a multiple of gpus_per_node=8"):
        replace(base, nvlink_domain=12).check()
    with pytest.raises(ValueError, match="nvlink_domain"):
        replace(base, nvlink_domain=4).check()
    assert replace(base, nvlink_domain=16).domain == 16 and base.domain == 8
    spec = "peak_tflops=2500,hbm_gbs=8000,memory_gb=186,nvlink_gbs=900,ib_gbs=50,gpus_per_node=4,nics=4"
    custom = parse_custom(spec + ",nvlink_domain=72")
    assert custom.domain == 72 and custom.link(36) is custom.intra and custom.link(144).bandwidth == 50 * GB
    assert parse_custom(spec).domain == 4
    with pytest.raises(ValueError, match="nvlink_domain=2.5 is not an integer"):
        parse_custom(spec + ",nvlink_domain=2.5")
    with pytest.raises(ValueError, match="nvlink_domain=6: expected a multiple"):
        parse_custom(spec + ",nvlink_domain=6")
    with pytest.raises(ValueError, match="mesh"):
        Hardware(name="x", peak_flops=1, hbm_bandwidth=1, memory_bytes=1, gpus_per_node=1, mesh=True).check()


def test_fp8_rates_are_the_datasheets_and_the_a100_has_none():
    """H100/H200 SXM: FP8 3,958 TFLOP/s with sparsity, 1,979 dense (NVIDIA H100 datasheet); A100: no FP8 tensor
    cores, so `fp8_flops` is None and the time model refuses fp8 there."""
    assert HARDWARE["h100"].fp8_flops == HARDWARE["h200"].fp8_flops == 3958e12 / 2
    assert HARDWARE["a100-40gb"].fp8_flops is None and HARDWARE["a100-80gb"].fp8_flops is None
    with pytest.raises(ValueError, match="fp8_flops"):
        replace(HARDWARE["h100"], fp8_flops=0.0).check()
