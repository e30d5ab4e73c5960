"""The placement map (`ParallelDims.replicas`): for every accepted layout up to 8 ranks, every rank and every kind of
parameter, this rank's (index, count) among the ranks holding the same elements. No process group: pure arithmetic.

Two oracles: the replica indices of the ranks that hold the same elements (grouped here from the ranks' grid
coordinates, independently of the map) are exactly 0 … count-1; and the map gives today's answers, the expressions
checkpoints and clipping wrote by hand before it existed.
"""
import itertools
from collections import defaultdict

import pytest

import minimega as mm

KINDS = {"tp-sharded": dict(tp_sharded=True), "whole over tp": dict(tp_sharded=False),
         "expert": dict(tp_sharded=False, expert=True), "ZeRO shard, tp-sharded": dict(tp_sharded=True, dp_sharded=True),
         "ZeRO shard, whole over tp": dict(tp_sharded=False, dp_sharded=True)}


def layouts(max_world: int = 8):
    for dp, tp, pp, cp in itertools.product(range(1, 9), repeat=4):
        if dp * tp * pp * cp <= max_world:
            for ep in range(1, dp + 1):
                if dp % ep == 0:
                    yield mm.ParallelDims(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)


def held(dims: mm.ParallelDims, rank: int, kind: dict) -> tuple:
    """What ``rank`` holds of a parameter of this kind, named by grid coordinates (not by the map)."""
    pp, dp, tp = dims.coords(rank)
    cp = dims.cp_coord(rank)
    return (pp, tp if kind["tp_sharded"] else None,
            (dp, cp) if kind.get("dp_sharded") else (dp % dims.ep if kind.get("expert") else None))


def by_hand(dims: mm.ParallelDims, rank: int, kind: dict) -> tuple[int, int]:
    """Today's answers, as `checkpoint/layout.py` and clipping wrote them before the map."""
    pp, dp_rank, tp_rank = dims.coords(rank)
    cp_rank, dp_cp_size = dims.cp_coord(rank), dims.dp * dims.cp
    dp_cp_rank = dp_rank * dims.cp + cp_rank
    if kind.get("dp_sharded"):
        return (0, 1) if kind["tp_sharded"] else (tp_rank, dims.tp)
    if kind.get("expert"):
        edp = dims.dp // dims.ep * dims.cp
        return tp_rank * edp + dp_rank // dims.ep * dims.cp + cp_rank, edp * dims.tp
    return (dp_cp_rank, dp_cp_size) if kind["tp_sharded"] else (tp_rank * dp_cp_size + dp_cp_rank, dp_cp_size * dims.tp)


@pytest.mark.parametrize("kind", list(KINDS), ids=list(KINDS))
def test_replicas_number_each_group_of_holders_and_equal_todays_answers(kind):
    cases = 0
    for dims in layouts():
        holders = defaultdict(list)
        for rank in range(dims.world_size):
            index, count = dims.replicas(rank, **KINDS[kind])
            assert (index, count) == by_hand(dims, rank, KINDS[kind]), (dims, rank)
            holders[held(dims, rank, KINDS[kind])].append((index, count))
            cases += 1
        for what, places in holders.items():
            counts = {c for _, c in places}
            assert counts == {len(places)}, f"{dims} {what}: {len(places)} holders, counts {counts}"
            assert sorted(i for i, _ in places) == list(range(len(places))), f"{dims} {what}: indices {places}"
    assert cases > 500
