"""Reference solution to ``labs/exercises/rank_grid.py``."""
from __future__ import annotations


def group_ranks(dp: int, tp: int, pp: int, dim: str) -> list[list[int]]:
    """rank = (pp_rank · dp + dp_rank) · tp + tp_rank; a group varies one coordinate and fixes the other two."""
    sizes = {"pp": pp, "dp": dp, "tp": tp}

    def rank(c: dict) -> int:
        return (c["pp"] * dp + c["dp"]) * tp + c["tp"]

    others = [d for d in ("pp", "dp", "tp") if d != dim]
    groups = []
    for a in range(sizes[others[0]]):
        for b in range(sizes[others[1]]):
            groups.append([rank({others[0]: a, others[1]: b, dim: i}) for i in range(sizes[dim])])
    return groups
