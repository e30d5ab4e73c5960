"""ZeRO's collectives cost the tensors they are given, no more, under glibc's default allocator (gloo ranks).

Gloo's own all-gather and reduce-scatter run through a temporary buffer as big as the whole tensor, a new one
per call, and glibc keeps what they free: with `comm` calling them again, 20 calls on an 8 MiB tensor raised a
rank's peak RSS by 34-42 MiB (all-gather) and 38-62 MiB (reduce-scatter). Built from in-place broadcasts and
reduces (`comm.collectives._gather_by_broadcasts`, `comm.collectives._reduce_scatter_by_reduces`) it rises 0.9 and 9 MiB (what gloo's
reduce keeps for its chunks). Nothing is freed back to the OS on purpose here: the allocator is left as a ZeRO-3
run leaves it, and the peak (``VmHWM``, reset after ``malloc_trim``) is what a rank would need.
"""
import ctypes
import gc

import pytest
import torch

import minimega as mm
from minimega import comm
from minimega.run.launch import current_world_size

FULL = 2 * 1024 * 1024                     # fp32 elements: an 8 MiB tensor, a mid-sized ZeRO unit
CALLS = 20


def _status(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def peak_rise(op: str) -> int:
    """Bytes the peak RSS of this rank rises by over `CALLS` calls of ``op`` on two reused buffers."""
    mesh = mm.init_mesh(mm.ParallelDims.infer(current_world_size()))
    group = mesh.world
    fulls = [torch.ones(FULL) for _ in range(2)]
    shard = torch.zeros(FULL // group.size)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                                   # VmHWM := VmRSS
    for i in range(CALLS):
        if op == "all_gather":
            comm.all_gather(fulls[i % 2], shard, group, async_op=True).wait()
        else:
            comm.reduce_scatter(shard, fulls[i % 2], group, async_op=True).wait()
    return _status("VmHWM") - before


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_a_collective_allocates_no_full_size_temporary_per_call(op):
    rises = mm.launch(peak_rise, 2, op, timeout=120)
    bound = 3 * 4 * FULL                               # 24 MiB: less than one temporary per call would leave
    print(f"{op}: peak RSS rose {[round(r / 2**20, 1) for r in rises]} MiB")
    assert max(rises) < bound, f"{op}: peak RSS rose {[r / 2**20 for r in rises]} MiB over {CALLS} calls"
