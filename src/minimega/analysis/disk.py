"""The disk tier of offload (ZeRO-Infinity, Rajbhandari et al. 2021, arXiv:2104.07857): bytes on disk and moved per step.

With ``offload_optimizer`` and ``nvme_path`` (`zero.nvme.NVMeOffloadStore`) each rank keeps its shard of
the fp32 master weights and of Adam's two moments in files: K = 4 + 8 = 12 bytes per element of the shard
(the host always keeps its own fp32 master, whatever the parameters' dtype; SGD without momentum: K = 4).
Every optimizer step reads each file once and writes it back once, so per rank and step

    read = write = K · Ψ/N_d            disk traffic = 2 · K · Ψ/N_d

with Ψ the padded parameter count the flat buffers hold. The host keeps only the fp32 gradient shards
(4Ψ/N_d) and ``IN_FLIGHT_UNITS`` staging buffers, each as big as the largest unit's file.
"""
from __future__ import annotations

from .memory import model_state_placement

DISK_STATE_BYTES = {"adamw": 12, "adam": 12, "sgd": 4}
"""Bytes per shard element in a unit's file: the fp32 master (4) plus the optimizer's per-element states."""


# --8<-- [start:nvme_bytes]
# --8<-- [start:nvme_bytes_c1]
def nvme_bytes_per_step(n_params: float, dp: int, stage: int, optimizer: str = "adamw") -> dict:
# --8<-- [end:nvme_bytes_c1]
    """Bytes one rank reads from and writes to its files in one optimizer step: K·Ψ/N_d each way.

    ``n_params``: Ψ, padded as the flat buffers pad it (``model_state_bytes_padded``'s rule) for an exact
    match with a run; ``stage`` 1-3 (offload moves ZeRO's shards; at every stage the optimizer's shard is Ψ/N_d).
    """
    if stage not in (1, 2, 3):
        raise ValueError(f"nvme_bytes_per_step: stage {stage!r}; NVMe offload moves ZeRO's shards (stages 1-3)")
    if optimizer not in DISK_STATE_BYTES:
        raise ValueError(f"nvme_bytes_per_step: optimizer {optimizer!r}; expected one of {sorted(DISK_STATE_BYTES)}")
    # --8<-- [start:nvme_bytes_c2]
    moved = DISK_STATE_BYTES[optimizer] * n_params / dp
    return {"read": moved, "write": moved, "total": 2 * moved}
    # --8<-- [end:nvme_bytes_c2]
# --8<-- [end:nvme_bytes]


def nvme_placement(n_params: float, dp: int, stage: int, precision: str = "mixed", *,
                   grad_bytes: int | None = None) -> dict:
    """`model_state_placement` with ``offload='optimizer'``, the master and Adam's states moved from 'cpu' to 'nvme'.

    The host ('cpu') keeps the fp32 gradient shards (4Ψ/N_d); the disk ('nvme') holds 12Ψ/N_d under Adam in
    every precision (K = 12 with 16-bit parameters; with fp32 ones K = 8 plus the host's own master, 4).
    Staging buffers are not model states and are not counted here.
    """
    out = model_state_placement(n_params, dp, stage, precision, "optimizer", grad_bytes=grad_bytes)
    out["nvme"] = nvme_bytes_per_step(n_params, dp, stage)["read"]
    out["cpu"] -= out["nvme"]
    return out
