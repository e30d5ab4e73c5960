"""Reference solution to ``labs/exercises/offload.py``."""
from __future__ import annotations


def bytes_by_location(n_params: int, dp: int, stage: int, precision: str, offload: bool) -> dict:
    """Parameters and gradients stay on the device; the fp32 master and Adam's moments move when offloaded."""
    width = 4 if precision == "fp32" else 2
    params = width * n_params // (dp if stage >= 3 else 1)
    grads = width * n_params // (dp if stage >= 2 else 1)
    separate_master = offload or precision != "fp32"          # fp32 on the device: the shard is the master
    optimizer = (4 * n_params // dp if separate_master else 0) + 8 * n_params // dp
    if offload:
        return {"device": params + grads, "cpu": optimizer}
    return {"device": params + grads + optimizer, "cpu": 0}
