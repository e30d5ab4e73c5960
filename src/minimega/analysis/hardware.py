"""Hardware for the performance model (``perf.py``): one GPU type, its node, and the links between GPUs.

A `Hardware` is everything `perf.step_time` needs to turn FLOPs and bytes into seconds:

    peak_flops          dense 16-bit tensor-core FLOP/s (the MFU denominator)
    fp8_flops           dense fp8 tensor-core FLOP/s, None where the GPU has no fp8 tensor cores (A100)
    hbm_bandwidth       bytes/s to device memory (the roofline's slope)
    intra, inter        `Link`s: NVLink/NVSwitch inside an NVLink domain, InfiniBand beyond it (per NIC)
    nvlink_domain       GPUs one NVLink fabric joins: the node's 8 on DGX/HGX, a rack's 72 on GB200 NVL72
    disk_read_bandwidth, disk_write_bandwidth
                        the node's NVMe drives per GPU: what NVMe offload (ZeRO-Infinity) reads and writes at

Spec sources (vendor datasheets; the "achievable" fractions are this model's assumptions, see below):
    A100 SXM4 40/80 GB  NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4):
                        BF16 312 TFLOP/s dense, HBM2 1,555 GB/s (40 GB), HBM2e 2,039 GB/s (80 GB),
                        NVLink 3 600 GB/s total (300 GB/s each way)
    H100 SXM5           NVIDIA H100 Tensor Core GPU datasheet: BF16 989 TFLOP/s dense (1,979 with sparsity),
                        FP8 1,979 dense (3,958 with sparsity), HBM3 3.35 TB/s, NVLink 4 900 GB/s total (450 GB/s
                        each way). The A100 has no fp8 tensor cores (A100 datasheet: FP16/BF16, TF32, INT8 only).
    H200 SXM            NVIDIA H200 datasheet: the H100's compute (fp8 too) with 141 GB HBM3e at 4.8 TB/s
    B200, GB200 NVL72,  see hardware_sources.md beside this file: each number with its vendor document
    MI300X              (DGX/HGX B200, GB200 NVL72, AMD Instinct MI300X data sheets), dense = sparse / 2
    DGX A100 node       8 GPUs, 8 HDR InfiniBand NICs at 200 Gb/s (25 GB/s) each: Narayanan et al. 2021
                        (arXiv:2104.04473) §5, the cluster behind Table 1, MT-NLG and BLOOM's Jean Zay nodes
    DGX H100 node       8 GPUs, 8 NDR InfiniBand NICs at 400 Gb/s (50 GB/s) each
    Host side (offload) A100 SXM4: PCIe Gen4 x16, 64 GB/s both ways (A100 datasheet), 32 GB/s each way;
                        H100/H200 SXM: PCIe Gen5, 128 GB/s both ways (H100, H200 datasheets), 64 GB/s each way.
                        Host memory per GPU: DGX A100 has 2 AMD EPYC 7742 (DGX A100 datasheet), 8 channels of
                        DDR4-3200 each, 204.8 GB/s per socket (AMD's specification): 51.2 GB/s per GPU;
                        DGX H100/H200 have 2 Intel Xeon Platinum 8480C, 8 channels of DDR5-4800, 307.2 GB/s per
                        socket: 76.8 GB/s per GPU. CPU Adam is memory-bound on it (ZeRO-Offload, Ren et al. 2021).
    Disk (NVMe offload) DeepSpeed's DeepNVMe blog (2024, blogs/deepspeed-gds/README.md) measured 10 GB/s reads and
                        5 GB/s writes between 4 NVMe SSDs in RAID-0 and CPU memory (Azure NC96ads_A100_v4): 2.5 and
                        1.25 GB/s per drive. DGX A100 holds 4 data NVMe drives for 8 GPUs, DGX H100/H200 8 (NVIDIA DGX
                        BasePOD reference architecture: "eight 3.84 TB U.2 NVMe drives for storage/cache"), so per
                        GPU 1.25 / 0.625 GB/s (A100) and 2.5 / 1.25 GB/s (Hopper) read / write, achieved rates: no
                        efficiency applies. The drive count of the A100 node and of the presets after Hopper are
                        assumptions (hardware_sources.md).

Assumptions (not datasheet numbers; `minimega calibrate` measures the CPU equivalents on this machine):
    matmul_efficiency   the fraction of peak a large 16-bit GEMM sustains in a training step. 0.75 for A100
                        is fitted once to one measured layer, Korthikanti et al. 2022 Table 4 (22B, one layer:
                        19.6 ms forward + backward); the published runs in tests/test_perf_published.py are
                        then predictions, not fits. Hopper uses the same fraction.
    memory_efficiency   the fraction of HBM bandwidth an element-wise kernel sustains: 0.8.
    link efficiency     collectives reach 80% of a link's one-way bandwidth (bus bandwidth); α = 5 µs on
                        NVLink, 10 µs over InfiniBand: the order of nccl-tests' small-message times.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..sizes import moe_capacity
from .communication import ring_time

GB = 1e9
PER_DRIVE = (2.5 * GB, 1.25 * GB)
"""Achieved (read, write) bytes/s of one data-center NVMe SSD: DeepNVMe's 10 and 5 GB/s over 4 drives in RAID-0."""
DISK_4_DRIVES = (4 * PER_DRIVE[0] / 8, 4 * PER_DRIVE[1] / 8)   # DGX A100: 4 data drives, 8 GPUs
DISK_8_DRIVES = (8 * PER_DRIVE[0] / 8, 8 * PER_DRIVE[1] / 8)   # DGX H100/H200: 8 data drives, 8 GPUs


@dataclass(frozen=True, kw_only=True)
class Link:
    """One tier of the interconnect, seen from one GPU: latency α and one-way bandwidth β."""
    name: str
    bandwidth: float
    """Bytes/s one GPU can send one way on this tier (datasheet), before `efficiency`."""
    alpha: float
    """Seconds of start-up latency per message (per ring step)."""
    efficiency: float = 0.8
    """Share of `bandwidth` a collective reaches (its bus bandwidth over the link's)."""
    per_op: tuple = ()
    """Measured (op, alpha, beta) triples that replace α and β for that collective (``minimega calibrate``)."""

    @property
    def beta(self) -> float:
        """Achieved bytes/s: what the α-β formulas divide by."""
        return self.bandwidth * self.efficiency

    def for_op(self, op: str) -> "Link":
        """This link as `op` sees it: the measured α and β when calibrated, else the link's own."""
        for name, alpha, beta in self.per_op:
            if name == op:
                return Link(name=f"{self.name} ({op})", bandwidth=beta, alpha=alpha, efficiency=1.0)
        return self


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """One GPU type in one kind of node."""
    name: str
    peak_flops: float
    """Dense 16-bit tensor-core FLOP/s per GPU."""
    hbm_bandwidth: float
    """Bytes/s between the GPU and its memory."""
    memory_bytes: float
    """Device memory per GPU."""
    gpus_per_node: int = 8
    nvlink_domain: int | None = None
    """GPUs joined by the `intra` fabric (a multiple of `gpus_per_node`); None: the node."""
    intra: Link = field(default_factory=lambda: NVLINK3)
    """Link inside the NVLink domain (NVLink through NVSwitch)."""
    mesh: bool = False
    """`intra` is a full mesh of point-to-point links (Infinity Fabric), not a switch: `intra.bandwidth` is the
    sum over a GPU's domain - 1 links, and a group of n GPUs reaches (n - 1)/(domain - 1) of it."""
    inter: Link = field(default_factory=lambda: IB_HDR)
    """Link between nodes, per NIC."""
    nics_per_node: int = 8
    matmul_efficiency: float = 0.75
    memory_efficiency: float = 0.8
    host: Link = field(default_factory=lambda: PCIE4)
    """GPU <-> CPU memory (PCIe), one way: what offload moves gradients and parameters over."""
    host_memory_bandwidth: float = 51.2 * GB
    """Bytes/s of CPU memory per GPU (the node's sockets shared by its GPUs): CPU Adam's roof."""
    fp8_flops: float | None = None
    """Dense fp8 tensor-core FLOP/s per GPU; None: no fp8 tensor cores, and the time model refuses precision='fp8'."""
    disk_read_bandwidth: float = DISK_4_DRIVES[0]
    """Bytes/s one GPU's rank reads from the node's NVMe drives (their achieved rate shared by the node's GPUs)."""
    disk_write_bandwidth: float = DISK_4_DRIVES[1]
    """Bytes/s one GPU's rank writes to the node's NVMe drives."""

    def check(self) -> None:
        for name in ("peak_flops", "hbm_bandwidth", "memory_bytes", "host_memory_bandwidth", "disk_read_bandwidth",
                     "disk_write_bandwidth"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be > 0")
        if self.fp8_flops is not None and not self.fp8_flops > 0:
            raise ValueError(f"fp8_flops={self.fp8_flops!r}: must be > 0, or None for a GPU without fp8 tensor cores")
        for name in ("gpus_per_node", "nics_per_node"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(f"{name}={getattr(self, name)!r}: expected an integer >= 1")
        d = self.nvlink_domain
        if d is not None and not (isinstance(d, int) and d >= self.gpus_per_node and d % self.gpus_per_node == 0):
            raise ValueError(f"nvlink_domain={d!r}: expected a multiple of gpus_per_node={self.gpus_per_node} "
                             "(a domain holds whole nodes)")
        if self.mesh and self.domain < 2:
            raise ValueError("mesh=True needs an NVLink domain of at least 2 GPUs")
        for name in ("matmul_efficiency", "memory_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be in (0, 1]")
        for link in (self.intra, self.inter, self.host):
            if not (link.bandwidth > 0 and link.alpha >= 0 and 0 < link.efficiency <= 1):
                raise ValueError(f"link {link.name}: bandwidth > 0, alpha >= 0, 0 < efficiency <= 1")

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) above which an op is compute-bound: the roofline's knee."""
        return self.peak_flops * self.matmul_efficiency / (self.hbm_bandwidth * self.memory_efficiency)

    @property
    def domain(self) -> int:
        """GPUs a tp, ep or cp group may span at NVLink bandwidth: `nvlink_domain`, else the node."""
        return self.nvlink_domain or self.gpus_per_node

    def link(self, span: int, world: int | None = None) -> Link:
        """The link a group of `span` consecutive ranks uses, in a job of `world` GPUs (None: many domains).

        NVLink when every such group lies inside one NVLink domain: no domain boundary falls inside a group
        (spans of 16 in 72-GPU racks straddle ranks 64-79 once a job outgrows a rack, and the slowest hop sets
        a ring's pace); on a mesh, the share of its links a group of `span` reaches. Else InfiniBand, each
        GPU's share of its node's NICs."""
        d = self.domain                           # the first boundary, rank d, is inside a group unless span | d
        if span <= d and (d % span == 0 or (world is not None and world <= d)):
            if not self.mesh or span >= d:
                return self.intra
            return replace(self.intra, bandwidth=self.intra.bandwidth * (max(span, 2) - 1) / (d - 1))
        share = self.nics_per_node / self.gpus_per_node
        return replace(self.inter, bandwidth=self.inter.bandwidth * share)


NVLINK3 = Link(name="NVLink 3 (A100)", bandwidth=300 * GB, alpha=5e-6)
NVLINK4 = Link(name="NVLink 4 (H100/H200)", bandwidth=450 * GB, alpha=5e-6)
NVLINK5 = Link(name="NVLink 5 (B200/GB200)", bandwidth=900 * GB, alpha=5e-6)
XGMI_MI300X = Link(name="Infinity Fabric (MI300X, 7 links)", bandwidth=448 * GB, alpha=5e-6)
IB_HDR = Link(name="InfiniBand HDR 200 Gb/s", bandwidth=25 * GB, alpha=10e-6)
IB_NDR = Link(name="InfiniBand NDR 400 Gb/s", bandwidth=50 * GB, alpha=10e-6)
C2C_GB200 = Link(name="NVLink-C2C (GB200, per GPU)", bandwidth=225 * GB, alpha=10e-6)
PCIE4 = Link(name="PCIe Gen4 x16", bandwidth=32 * GB, alpha=10e-6)
PCIE5 = Link(name="PCIe Gen5 x16", bandwidth=64 * GB, alpha=10e-6)
LINKS = {"nvlink3": NVLINK3, "nvlink4": NVLINK4, "nvlink5": NVLINK5, "xgmi-mi300x": XGMI_MI300X, "ib-hdr": IB_HDR,
         "ib-ndr": IB_NDR, "pcie4": PCIE4, "pcie5": PCIE5, "c2c-gb200": C2C_GB200}

HARDWARE = {
    "a100-40gb": Hardware(name="A100 SXM4 40GB", peak_flops=312e12, hbm_bandwidth=1555 * GB, memory_bytes=40 * GB),
    "a100-80gb": Hardware(name="A100 SXM4 80GB", peak_flops=312e12, hbm_bandwidth=2039 * GB, memory_bytes=80 * GB),
    "h100": Hardware(name="H100 SXM5 80GB", peak_flops=989e12, hbm_bandwidth=3350 * GB, memory_bytes=80 * GB,
                     intra=NVLINK4, inter=IB_NDR, host=PCIE5, host_memory_bandwidth=76.8 * GB, fp8_flops=1979e12,
                     disk_read_bandwidth=DISK_8_DRIVES[0], disk_write_bandwidth=DISK_8_DRIVES[1]),
    "h200": Hardware(name="H200 SXM 141GB", peak_flops=989e12, hbm_bandwidth=4800 * GB, memory_bytes=141 * GB,
                     intra=NVLINK4, inter=IB_NDR, host=PCIE5, host_memory_bandwidth=76.8 * GB, fp8_flops=1979e12,
                     disk_read_bandwidth=DISK_8_DRIVES[0], disk_write_bandwidth=DISK_8_DRIVES[1]),
    # hardware_sources.md: every number below, its vendor document and what is assumed
    "b200": Hardware(name="B200 SXM 180GB", peak_flops=2250e12, hbm_bandwidth=7700 * GB, memory_bytes=180 * GB,
                     intra=NVLINK5, inter=IB_NDR, host=PCIE5, host_memory_bandwidth=76.8 * GB, fp8_flops=4500e12,
                     disk_read_bandwidth=DISK_8_DRIVES[0], disk_write_bandwidth=DISK_8_DRIVES[1]),
    "gb200-nvl72": Hardware(name="GB200 NVL72 (B200 186GB)", peak_flops=2500e12, hbm_bandwidth=8000 * GB,
                            memory_bytes=186 * GB, gpus_per_node=4, nvlink_domain=72, intra=NVLINK5, inter=IB_NDR,
                            nics_per_node=4, host=C2C_GB200, host_memory_bandwidth=250 * GB, fp8_flops=5000e12,
                            disk_read_bandwidth=DISK_8_DRIVES[0], disk_write_bandwidth=DISK_8_DRIVES[1]),
    "mi300x": Hardware(name="MI300X OAM 192GB", peak_flops=1307.4e12, hbm_bandwidth=5300 * GB, memory_bytes=192 * GB,
                       intra=XGMI_MI300X, mesh=True, inter=IB_NDR, host=PCIE5, host_memory_bandwidth=76.8 * GB,
                       fp8_flops=2614.9e12, disk_read_bandwidth=DISK_8_DRIVES[0], disk_write_bandwidth=DISK_8_DRIVES[1]),
}


def hardware(name: str) -> Hardware:
    """A preset by name; the error lists them."""
    try:
        return HARDWARE[name]
    except KeyError:
        raise ValueError(f"hardware {name!r}: expected one of {sorted(HARDWARE)} or a custom form") from None


def parse_custom(spec: str) -> Hardware:
    """The ``--custom`` form: ``key=value`` pairs separated by commas, units in the names.

    Example: ``peak_tflops=312,hbm_gbs=2039,memory_gb=80,gpus_per_node=8,nvlink_gbs=300,ib_gbs=25,nics=8``.
    Optional: ``nvlink_alpha_us``, ``ib_alpha_us``, ``matmul_eff``, ``memory_eff``, ``link_eff``, ``pcie_gbs`` (one
    way, default 32), ``host_mem_gbs`` (CPU memory per GPU, default 51.2), ``nvlink_domain`` (GPUs one NVLink
    fabric joins, a multiple of gpus_per_node; default the node), ``fp8_tflops`` (dense fp8; default none: fp8 is
    refused), ``disk_read_gbs`` and ``disk_write_gbs`` (NVMe per GPU, default 1.25 and 0.625). Unknown keys are
    refused by name.
    """
    keys = {"peak_tflops", "hbm_gbs", "memory_gb", "gpus_per_node", "nvlink_gbs", "ib_gbs", "nics",
            "nvlink_alpha_us", "ib_alpha_us", "matmul_eff", "memory_eff", "link_eff", "pcie_gbs", "host_mem_gbs",
            "nvlink_domain", "fp8_tflops", "disk_read_gbs", "disk_write_gbs"}
    vals: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        k, sep, v = part.partition("=")
        if not sep or k not in keys:
            raise ValueError(f"--custom: {part!r} is not key=value with a key in {sorted(keys)}")
        try:
            vals[k] = float(v)
        except ValueError:
            raise ValueError(f"--custom: {k}={v!r} is not a number") from None
    missing = {"peak_tflops", "hbm_gbs", "memory_gb", "nvlink_gbs", "ib_gbs"} - vals.keys()
    if missing:
        raise ValueError(f"--custom: missing {sorted(missing)}")
    for k in ("gpus_per_node", "nics", "nvlink_domain"):
        if k in vals and not (vals[k].is_integer() and vals[k] >= 1):
            raise ValueError(f"--custom: {k}={vals[k]:g} is not an integer >= 1")
    eff = vals.get("link_eff", 0.8)
    hw = Hardware(
        name="custom", peak_flops=vals["peak_tflops"] * 1e12, hbm_bandwidth=vals["hbm_gbs"] * GB,
        memory_bytes=vals["memory_gb"] * GB, gpus_per_node=int(vals.get("gpus_per_node", 8)),
        nvlink_domain=int(vals["nvlink_domain"]) if "nvlink_domain" in vals else None,
        intra=Link(name="custom intra", bandwidth=vals["nvlink_gbs"] * GB,
                   alpha=vals.get("nvlink_alpha_us", 5) * 1e-6, efficiency=eff),
        inter=Link(name="custom inter", bandwidth=vals["ib_gbs"] * GB,
                   alpha=vals.get("ib_alpha_us", 10) * 1e-6, efficiency=eff),
        nics_per_node=int(vals.get("nics", 8)), matmul_efficiency=vals.get("matmul_eff", 0.75),
        memory_efficiency=vals.get("memory_eff", 0.8),
        host=Link(name="custom PCIe", bandwidth=vals.get("pcie_gbs", 32) * GB, alpha=10e-6, efficiency=eff),
        host_memory_bandwidth=vals.get("host_mem_gbs", 51.2) * GB,
        fp8_flops=vals["fp8_tflops"] * 1e12 if "fp8_tflops" in vals else None,
        disk_read_bandwidth=vals.get("disk_read_gbs", DISK_4_DRIVES[0] / GB) * GB,
        disk_write_bandwidth=vals.get("disk_write_gbs", DISK_4_DRIVES[1] / GB) * GB)
    hw.check()
    return hw


# ----------------------------------------------------------------------------------------------
# Collectives on a link (α-β)

ALGORITHMS = ("ring", "tree")
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv")


# --8<-- [start:collective_time]
def collective_time(op: str, size_bytes: float, n: int, link: Link, algorithm: str = "ring") -> float:
    """Seconds for one collective of a `size_bytes` buffer over `n` ranks on `link`.

    ring (reduce-scatter, all-gather, all-reduce): `estimate.ring_time`, steps·α + ring bytes/β.
    tree (all-reduce only, NCCL's double binary tree): 2·log2(n) steps of α, and the buffer goes up
    and down the tree once each, pipelined: 2·log2(n)·α + 2S/β. Latency grows with log n, not n.
    all-to-all (pairwise exchange): (n-1)·α + (n-1)/n·S/β. send/recv: α + S/β (n is ignored).
    """
    if op not in COLLECTIVES:
        raise ValueError(f"collective {op!r}: expected one of {COLLECTIVES}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r}: expected one of {ALGORITHMS}")
    link = link.for_op(op)
    if op == "send_recv":
        return link.alpha + size_bytes / link.beta
    if n <= 1:
        return 0.0
    if algorithm == "tree":
        if op != "all_reduce":
            raise ValueError(f"algorithm 'tree' is implemented for all_reduce only, not {op!r}; use 'ring'")
        return 2 * math.log2(n) * link.alpha + 2 * size_bytes / link.beta
    if op == "all_to_all":
        return (n - 1) * link.alpha + (n - 1) / n * size_bytes / link.beta
    return ring_time(op, size_bytes, n, link.alpha, link.beta)
# --8<-- [end:collective_time]


def moe_alltoall_time(n_layer: int, rows: int, seq_len: int, d_model: int, ep: int, n_experts: int, top_k: int,
                      capacity_factor: float, link: Link, bytes_per_elem: int = 2) -> float:
    """Seconds of one step's expert-parallel all-to-alls: 4 per MoE layer (dispatch and combine, forward and
    backward), each over the (E, rows · C, D) slot buffer (`estimate.moe_alltoall_bytes`), α-β pairwise."""
    size = n_experts * rows * moe_capacity(seq_len, n_experts, top_k, capacity_factor) * d_model * bytes_per_elem
    return 4 * n_layer * collective_time("all_to_all", size, ep, link)
