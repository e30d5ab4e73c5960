"""Which store holds a ZeRO rank's fp32 master shards and optimizer states: the device, host memory or disk.

    device   `offload.MasterStore`        (the default)
    host     `offload.CPUOffloadStore`    (``offload_optimizer``: ZeRO-Offload)
    disk     `nvme.NVMeOffloadStore`      (``offload_optimizer`` and ``nvme_path``: ZeRO-Infinity's NVMe tier;
                                           its module is loaded only then)
"""
from __future__ import annotations

import torch

from .offload import CPUOffloadStore, MasterStore


def make_store(shards: list[torch.Tensor], make_optimizer, config, rank: int = 0):
    """The store ``config`` asks for. ``rank``: this process's global rank (names its directory on disk)."""
    if getattr(config, "nvme_path", None):
        from .nvme import NVMeOffloadStore
        return NVMeOffloadStore(shards, make_optimizer, config.nvme_path, rank)
    return (CPUOffloadStore if config.offload_optimizer else MasterStore)(shards, make_optimizer)
