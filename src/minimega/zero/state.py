"""ZeRO's part of a checkpoint: the layout-free training state, gathered from and scattered to shards.

`training_state` all-gathers each unit's fp32 master shard and each optimizer-state shard into the
unit's padded flat buffer and cuts it back into `model.py`'s tensors. `load_training_state` does the
reverse for *this* rank's shard bounds, whatever dp the checkpoint was saved with, then refreshes the
parameters exactly as after an optimizer step.
"""
from __future__ import annotations

import torch

from .. import comm


def _gather_unit(stage, unit, shard: torch.Tensor) -> list[torch.Tensor]:
    full = torch.empty(unit.padded, dtype=shard.dtype, device=shard.device)
    comm.all_gather(full, shard.detach().contiguous(), stage.group, tag="checkpoint")
    return [v.detach().cpu().clone() for v in unit.views(full)]


@torch.no_grad()
def training_state(stage) -> dict:
    """{'model': {key: fp32}, 'optimizer': {key: {state: tensor}}} on every rank (a collective over dp)."""
    model, optimizer = {}, {}
    for unit, master in zip(stage.units, stage.store.master):
        model.update(zip(unit.names, _gather_unit(stage, unit, master.float())))
        for kind, value in sorted(stage.store.optimizer.state.get(master, {}).items()):
            if value.dim() == 0:                          # Adam's step counter: one per unit, copied per key
                for name in unit.names:
                    optimizer.setdefault(name, {})[kind] = value.detach().cpu().clone()
            else:
                for name, t in zip(unit.names, _gather_unit(stage, unit, value)):
                    optimizer.setdefault(name, {})[kind] = t
    order = [n for n, _ in stage.module.named_parameters()]
    return {"model": {n: model[n] for n in order}, "optimizer": {n: optimizer[n] for n in order if n in optimizer}}


def _my_shard(unit, tensors: dict[str, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    flat = torch.zeros(unit.padded, dtype=torch.float32)
    offset = 0
    for name, p in zip(unit.names, unit.params):
        flat[offset:offset + p.numel()] = tensors[name].reshape(-1).float()
        offset += p.numel()
    return flat[unit.start:unit.end].to(device=like.device, dtype=like.dtype)


@torch.no_grad()
def load_training_state(stage, state: dict) -> None:
    """Put a full-shaped training state into this rank's shards (any saved dp), then refresh the parameters."""
    if missing := sorted(n for u in stage.units for n in u.names if n not in state["model"]):
        raise ValueError(f"checkpoint lacks parameters {missing[:5]}")
    opt = stage.store.optimizer
    for unit, master, shard in zip(stage.units, stage.store.master, stage.shards):
        master.copy_(_my_shard(unit, state["model"], master))
        if not stage.store.aliased:
            shard.copy_(master.to(shard.dtype))
        kinds = sorted(state["optimizer"].get(unit.names[0], {}))
        opt.state.pop(master, None)
        if kinds:
            opt.state[master] = {
                k: (state["optimizer"][unit.names[0]][k].clone() if state["optimizer"][unit.names[0]][k].dim() == 0
                    else _my_shard(unit, {n: state["optimizer"][n][k] for n in unit.names}, master))
                for k in kinds}
    stage._gather_after_step()
