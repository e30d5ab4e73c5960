"""Reference solution to ``labs/exercises/offload.py``."""
from __future__ import annotations


def bytes_by_location(n_params: int, dp: int, stage: int, precision: str, offload: bool) -> dict:
    """Without offload everything is on the device; with it the fp32 master, Adam's moments and the gradient shard
    (summed in fp32) are on the host, and the device keeps the parameters (and at stage 1 its whole gradient buffer)."""
    width = 4 if precision == "fp32" else 2
    grad_width = 2 if precision == "fp16" else 4                # bf16: fp32 main grads
    params = width * n_params // (dp if stage >= 3 else 1)
    grads = grad_width * n_params // (dp if stage >= 2 else 1)
    separate_master = offload or precision != "fp32"          # fp32 on the device: the shard is the master
    optimizer = (4 * n_params // dp if separate_master else 0) + 8 * n_params // dp
    if offload:
        return {"device": params + (grads if stage == 1 else 0), "cpu": optimizer + 4 * n_params // dp}
    return {"device": params + grads + optimizer, "cpu": 0}
