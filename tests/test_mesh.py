"""ParallelDims arithmetic (no process group) and the groups init_mesh builds on 4 ranks."""
import pytest
import torch

import minimega as mm
from minimega import comm


def test_dims_validate_with_arithmetic():
    with pytest.raises(ValueError, match=r"ParallelDims\(dp=2, tp=3, pp=1\): dp\*tp\*pp = 2\*3\*1 = 6 != world size 4"):
        mm.ParallelDims(dp=2, tp=3).check(4)
    with pytest.raises(ValueError, match="tp must be a positive integer, got 0"):
        mm.ParallelDims(tp=0)
    with pytest.raises(ValueError, match="world size 6 is not divisible by tp\\*pp = 4\\*1 = 4"):
        mm.ParallelDims.infer(6, tp=4)
    assert mm.ParallelDims.infer(8, tp=2, pp=2) == mm.ParallelDims(dp=2, tp=2, pp=2)


def test_grid_is_pp_dp_tp_with_tp_innermost():
    dims = mm.ParallelDims(dp=2, tp=2, pp=2)
    assert dims.group_ranks("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.group_ranks("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.group_ranks("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [dims.coords(r) for r in (0, 3, 5)] == [(0, 0, 0), (0, 1, 1), (1, 0, 1)]
    assert all(dims.rank_of(*dims.coords(r)) == r for r in range(8))


def test_single_process_mesh_without_a_process_group():
    mesh = mm.init_mesh()
    assert (mesh.dp_size, mesh.tp_size, mesh.pp_size, mesh.is_first_stage, mesh.is_last_stage) == (1, 1, 1, True, True)
    t = torch.ones(3)
    assert comm.all_reduce(t, mesh.dp_group) is t and t.tolist() == [1, 1, 1]
    with pytest.raises(ValueError, match="!= world size 1"):
        mm.init_mesh(mm.ParallelDims(dp=2))


def _mesh_and_collectives(dp, tp, pp):
    mesh = mm.init_mesh(mm.ParallelDims(dp=dp, tp=tp, pp=pp))
    r = mesh.rank
    log = comm.CommLog()
    out = {"coords": (mesh.pp_rank, mesh.dp_rank, mesh.tp_rank), "tp": mesh.tp_group.ranks, "dp": mesh.dp_group.ranks,
           "pp": mesh.pp_group.ranks, "prev": mesh.pp_prev, "next": mesh.pp_next,
           "first": mesh.is_first_stage, "last": mesh.is_last_stage}
    with log:
        out["tp_sum"] = comm.all_reduce(torch.tensor([float(r)]), mesh.tp_group).item()
        full = torch.arange(8, dtype=torch.float32) + 10 * r
        shard = torch.empty(8 // mesh.world.size)
        comm.reduce_scatter(shard, full, mesh.world)
        out["rs"] = shard.tolist()
        gathered = torch.empty(2 * mesh.world.size)
        h = comm.all_gather(gathered, torch.tensor([float(r), float(r)]), mesh.world, async_op=True)
        out["ag"] = h.wait().tolist()
        b = torch.tensor([float(r)])
        out["bcast"] = comm.broadcast(b, mesh.world.ranks[-1], mesh.world).item()
        if mesh.pp_size > 1:
            nxt, prv = mesh.pp_next, mesh.pp_prev
            ops = []
            if nxt is not None:
                ops.append(comm.P2P("send", torch.tensor([float(r)]), nxt))
            if prv is not None:
                got = torch.empty(1)
                ops.append(comm.P2P("recv", got, prv))
            comm.batch_p2p(ops, mesh.pp_group).wait()
            out["from_prev"] = got.item() if prv is not None else None
    out["log"] = log.summary()
    out["objects"] = comm.all_gather_object({"rank": r}, mesh.world)
    return out


def test_groups_and_collectives_on_four_ranks():
    res = mm.launch(_mesh_and_collectives, 4, 2, 1, 2, timeout=120)     # dp2 x pp2
    assert [o["coords"] for o in res] == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    assert [o["dp"] for o in res] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [o["pp"] for o in res] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [(o["prev"], o["next"], o["first"], o["last"]) for o in res] == [
        (None, 2, True, False), (None, 3, True, False), (0, None, False, True), (1, None, False, True)]
    assert [o["from_prev"] for o in res] == [None, None, 0.0, 1.0]
    assert [o["tp_sum"] for o in res] == [0.0, 1.0, 2.0, 3.0]          # tp groups of one: untouched
    # reduce-scatter: sum over ranks of (arange(8) + 10r) = 4*arange(8) + 60; rank i gets elements [2i, 2i+2).
    total = [4 * i + 60 for i in range(8)]
    assert [o["rs"] for o in res] == [total[2 * i:2 * i + 2] for i in range(4)]
    assert all(o["ag"] == [0, 0, 1, 1, 2, 2, 3, 3] for o in res)
    assert all(o["bcast"] == 3.0 for o in res)
    assert res[0]["objects"] == [{"rank": r} for r in range(4)]
    by_op = res[0]["log"]["by_op"]
    # Ring model: reduce-scatter and all-gather of S bytes each send (n-1)/n * S; broadcast S; no tp traffic.
    assert by_op["reduce_scatter"]["sent_bytes"] == 3 / 4 * 32
    assert by_op["all_gather"]["sent_bytes"] == 3 / 4 * 32
    assert by_op["broadcast"]["sent_bytes"] == 4
    assert by_op["send"]["sent_bytes"] == 4 and "all_reduce" not in by_op
    assert res[2]["log"]["by_op"]["recv"]["sent_bytes"] == 0
