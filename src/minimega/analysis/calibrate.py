"""`calibrate()`: measure this machine as the performance model sees a GPU; `predict_minimega()`: minimega's
own step time from those measurements; ``minimega calibrate``.

What is measured (each a median of short repeats, a few seconds in all):
    matmul_flops      one thread (and, as all_threads, every core): FLOP/s of an fp32 (N, D) → (N, 4D) linear layer,
                      forward and backward through autograd (three matmuls), the MLP's shape
    memory_bandwidth  bytes/s of a GeLU over (N, 4D), forward and backward through autograd (five tensor passes,
                      fresh outputs as training allocates them): the roofline's slope for element-wise ops
    stream_bandwidth  bytes/s of an in-place add over 16 MB (what an offload copy moves)
    adam_rate         parameters/s of torch's AdamW step (foreach=False, as minimega's engine runs it) on 1M
                      parameters: on a CPU the sqrt and division per element make it compute-bound, far from
                      the streaming roof a fused GPU Adam reaches
    op_overhead       seconds to dispatch one small autograd op forward and backward (PyTorch's per-op
                      cost; on a GPU the launch queue hides it, on a CPU every op pays it)
    collectives       for all_reduce, reduce_scatter, all_gather, all_to_all, send_recv over gloo with
                      `world_size` ranks: time at two sizes, solved for α and β of that op's α-β formula
                      (``perf.collective_time``), so gloo's own algorithms are folded into the fit.

Then `cpu_hardware` turns the numbers into a `Hardware` (efficiencies 1: the rates are measured), and
`predict_minimega` runs ``perf.step_time`` on minimega's model with three CPU facts added: ranks share the
cores (w ranks on c cores each get min(1, c/w) of their compute rate), every op pays op_overhead, and with
no core left over gloo's communication threads compete with compute, so nothing overlaps (overlap_comm off).
"""
from __future__ import annotations

import os
import statistics
import time

from .. import analysis as est
from . import perf
from .hardware import Hardware, Link

SIZES = (4096, 1 << 22)          # bytes: latency-bound and bandwidth-bound
OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv")
# (α steps, β factor) of each op on n ranks, ring model (perf.collective_time)
_COEF = {"all_reduce": lambda n: (2 * (n - 1), 2 * (n - 1) / n), "reduce_scatter": lambda n: (n - 1, (n - 1) / n),
         "all_gather": lambda n: (n - 1, (n - 1) / n), "all_to_all": lambda n: (n - 1, (n - 1) / n),
         "send_recv": lambda n: (1, 1.0)}


def _median_time(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure_compute(d: int = 384, n: int = 1024, reps: int = 5) -> dict:
    """matmul FLOP/s, memory bytes/s and per-op overhead of this process (its torch threads), each measured the
    way a training step runs it: through autograd, forward and backward, at an MLP's shapes."""
    import torch
    lin = torch.nn.Linear(d, 4 * d, bias=False)
    x = torch.randn(n, d, requires_grad=True)
    g = torch.ones(n, 4 * d)
    t_mm = _median_time(lambda: lin(x).backward(g), reps)                 # 3 matmuls: y, dx, dW
    z = torch.randn(n, 4 * d, requires_grad=True)
    t_gelu = _median_time(lambda: torch.nn.functional.gelu(z).backward(g), reps)   # read z, write y; read z, dy, write dz
    s = torch.randn(4 << 20)                                                # 16 MB, updated in place as Adam does
    t_stream = _median_time(lambda: s.add_(1.0), reps)
    p = torch.randn(4, requires_grad=True)

    def tiny():
        y = p
        for _ in range(20):
            y = y * 1.0001
        y.sum().backward()
    t_op = _median_time(tiny, reps) / 21
    params = [torch.nn.Parameter(torch.randn(1 << 18)) for _ in range(4)]
    for q in params:
        q.grad = torch.randn_like(q)
    t_adam = _median_time(torch.optim.AdamW(params, lr=1e-3, foreach=False).step, reps)
    return {"matmul_flops": 6 * n * d * 4 * d / t_mm, "memory_bandwidth": 5 * z.numel() * 4 / t_gelu,
            "stream_bandwidth": 2 * s.numel() * 4 / t_stream, "op_overhead": t_op,
            "adam_rate": 4 * (1 << 18) / t_adam, "threads": torch.get_num_threads()}


def _collectives_worker(sizes, reps):
    import torch
    import torch.distributed as dist
    from .. import comm
    n, rank = dist.get_world_size(), dist.get_rank()
    world = comm.Group(dist.group.WORLD, list(range(n)), "world")
    out = {}
    for op in OPS:
        times = []
        for size in sizes:
            numel = max(n, size // 4 // n * n)
            x, full, part = torch.ones(numel), torch.empty(numel), torch.ones(numel // n)
            fn = {"all_reduce": lambda: comm.all_reduce(x, world),
                  "reduce_scatter": lambda: comm.reduce_scatter(part, x, world),
                  "all_gather": lambda: comm.all_gather(full, part, world),
                  "all_to_all": lambda: comm.all_to_all(full, x, world),
                  "send_recv": lambda: comm.send(x, 1, world) if rank == 0 else
                  comm.recv(x, 0, world) if rank == 1 else None}[op]
            comm.barrier(world)
            times.append(_median_time(fn, reps))
            comm.barrier(world)
        out[op] = times
    return out


def _fit(op: str, n: int, sizes, times) -> tuple[float, float]:
    """(α, β) of `op` from its times at two sizes; β from the slope, α from what is left at the small size."""
    k_a, k_b = _COEF[op](n)
    (s1, s2), (t1, t2) = sizes, times
    beta = k_b * (s2 - s1) / max(t2 - t1, 1e-9)
    alpha = max(t1 - k_b * s1 / beta, 0.0) / k_a
    return alpha, beta


# --8<-- [start:calibrate]
def measure_compute_now(reps: int = 5) -> dict:
    """`measure_compute` with one thread and with every thread, and the load average: the part of a
    calibration that moves with the machine's load (cheap enough to repeat before every measurement)."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                       # what each rank of a multi-rank job gets on few cores
    try:
        one = measure_compute(reps=reps)
    finally:
        torch.set_num_threads(threads)
    return {**one, "all_threads": measure_compute(reps=reps), "load": os.getloadavg()[0]}


def calibrate(world_size: int = 2, reps: int = 5, sizes=SIZES) -> dict:
    """Measure this machine: compute (one process) and gloo collectives (`world_size` ranks)."""
    from ..run.launch import launch
    if world_size < 2:
        raise ValueError(f"world_size={world_size}: collectives need at least 2 ranks")
    compute = measure_compute_now(reps)
    raw = launch(_collectives_worker, world_size, list(sizes), reps, backend="gloo")
    coll = {}
    for op in OPS:
        times = [max(r[op][i] for r in raw) for i in range(len(sizes))]   # a collective ends when its last rank does
        alpha, beta = _fit(op, world_size, sizes[:2], times[:2])
        coll[op] = {"alpha": alpha, "beta": beta, "times": times}
    return {**compute, "world_size": world_size, "sizes": list(sizes), "collectives": coll, "cores": os.cpu_count()}
# --8<-- [end:calibrate]


def cpu_hardware(cal: dict) -> Hardware:
    """The calibration as a `Hardware`: measured rates (efficiencies 1) and one node of many ranks."""
    per_op = tuple((op, c["alpha"], c["beta"]) for op, c in cal["collectives"].items())
    ar = cal["collectives"]["all_reduce"]
    link = Link(name="gloo (measured)", bandwidth=ar["beta"], alpha=ar["alpha"], efficiency=1.0, per_op=per_op)
    stream = cal.get("stream_bandwidth", cal["memory_bandwidth"])
    host = Link(name="memory copy (offload)", bandwidth=stream / 2, alpha=0.0, efficiency=1.0)  # read + write
    return Hardware(name="this CPU", peak_flops=cal["matmul_flops"], hbm_bandwidth=cal["memory_bandwidth"],
                    memory_bytes=float(1 << 40), gpus_per_node=1 << 20, intra=link, inter=link,
                    matmul_efficiency=1.0, memory_efficiency=1.0, host=host, host_memory_bandwidth=stream)


def ops_per_step(cfg: perf.PerfConfig, blocks: int) -> float:
    """Dispatched ops one rank runs per step, counted from minimega's block: 17 forward per block (two
    LayerNorms, q/k/v split and transposes, attention, projections, GELU, residual adds), twice that backward,
    17 again when recomputed (Adam's ops are inside the measured `adam_rate`)."""
    per_block = 17 * (3 + {"none": 0, "selective": 0.3, "full": 1}[cfg.recompute])
    return cfg.micro_batches * blocks * per_block


def predict_minimega(cal: dict, cfg: perf.PerfConfig) -> dict:
    """Predicted seconds of one minimega step on this machine (`cfg`: fp32, fused attention, no dropout)."""
    cores, w = cal["cores"] or 1, cfg.n_gpus
    load = max(0.0, cal.get("load", 0.0))
    if w == 1:                                     # one process, every core's thread: measured as such
        cal, share = {**cal, **cal["all_threads"]}, 1.0
    else:                                          # launch gives each rank cores // w threads (at least 1)
        t = max(1, cores // w)
        share = t * max(cores, load + 1) / max(cores, load + w * t)     # in units of one thread's rate
    hw = cpu_hardware(cal)
    threads = cal.get("threads", 1) if w == 1 else max(1, cores // w)
    if w * threads >= cores:           # no core left for gloo's threads: communication competes with compute
        cfg = perf.replace(cfg, overlap_comm=False)
    r = perf.step_time(cfg, hw)
    slow = 1 / share
    blocks = -(-cfg.layers // cfg.pp)
    overhead = ops_per_step(cfg, blocks) * cal["op_overhead"] * slow
    # torch's AdamW on this rank's shard at the measured rate (offloaded or not: the CPU runs it either way),
    # plus the offload copies, which are CPU work too
    shard = est.stage_params(cfg.memory_config()) / (cfg.dp if cfg.zero_stage >= 1 else 1)
    optimizer = shard / cal["adam_rate"] + r["offload"]
    busy = r["compute"] + r["bubble"] + optimizer
    total = busy * slow + overhead + r["tp_comm"] + r["p2p"] + r["dp_comm"]
    return {"total": total, "compute": busy * slow, "optimizer": optimizer * slow, "overhead": overhead,
            "comm": r["tp_comm"] + r["p2p"] + r["dp_comm"], "share": share}
