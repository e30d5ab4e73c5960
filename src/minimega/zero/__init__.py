"""ZeRO: shard optimizer states (stage 1), gradients (2) and parameters (3) over the data-parallel group.

    flat.py     flat padded buffers per unit, shard bounds
    stages.py   Zero1 ⊂ Zero2
    stage3.py   Zero3 (⊂ Zero2), driven by the model's own unit chain (``module.units()``)
    offload.py  where the fp32 master weights, optimizer states and (offloaded) gradient shards live, and the step
    store.py    which store a rank's shards go to: the device, host memory or disk
    nvme.py     the disk tier: master shards and optimizer states in files, streamed through the step
    state.py    what a rank's shards hold of each parameter, for sharded checkpoints
    fp8_gather.py  Zero3Fp8: ZeRO-3 gathering the fp8 linears' weights in E4M3 (precision='fp8')
"""
from __future__ import annotations

from .flat import FlatUnit, padded_numel, shard_bounds
from .offload import CPUOffloadStore, MasterStore
from .store import make_store
from .stages import Zero1, Zero2, model_units
from .stage3 import Zero3

STAGES = {1: Zero1, 2: Zero2, 3: Zero3}


def wrap(module, config, group, rank: int, make_optimizer, model_parallel=()):
    """The ZeRO stage ``config.zero_stage`` (1-3) around ``module``, sharded over ``group``.

    ``model_parallel``: the groups (tp, pp) holding the model's other parts, see `Zero1`.
    """
    if config.zero_stage not in STAGES:
        raise ValueError(f"zero.wrap: zero_stage must be 1, 2 or 3, got {config.zero_stage}")
    stage = STAGES[config.zero_stage]
    if config.zero_stage == 3 and config.precision == "fp8":           # loaded only for fp8
        from .fp8_gather import Zero3Fp8 as stage
    return stage(module, group, rank, config, make_optimizer, model_parallel)


__all__ = ["FlatUnit", "padded_numel", "shard_bounds", "MasterStore", "CPUOffloadStore",
           "make_store", "Zero1", "Zero2", "Zero3", "model_units", "STAGES", "wrap"]
