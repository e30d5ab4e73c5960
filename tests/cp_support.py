"""What the context-parallel tests (ring and Ulysses) share: the tiny model and how its saved activations are measured."""
from __future__ import annotations

import torch

import minimega as mm
from minimega import data
from minimega.train.activation_checkpoint import saved_activation_bytes
from parity import parity_config, trained

TINY = mm.GPTConfig.tiny(block_size=32)


def activation_bytes(engine, mesh, config) -> int:
    """Bytes autograd saves for one forward of this rank's part of the first batch (collective over cp)."""
    x, y = next(data.batches(mesh, 1, config.batch_size, TINY.block_size, seed=config.seed))
    x, y = engine._context_shard(x), engine._context_shard(y)
    return saved_activation_bytes(engine.model, x, y)


def single_process_activation_bytes(rows: int) -> int:
    """What one process saves for ``rows`` whole sequences (a dp rank's rows)."""
    config = parity_config(batch_size=rows)
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(TINY), config, mm.init_mesh())
    return activation_bytes(engine, engine.mesh, config)


def train_case(dp: int, cp: int, config, steps: int):
    """Rank function body: ``(engine, mesh, activation bytes before the first step)`` of one (dp, cp) case."""
    return trained(TINY, config, mm.ParallelDims(dp=dp, cp=cp, tp=config.tp), steps, TINY.block_size,
                   measure=lambda engine, mesh: activation_bytes(engine, mesh, config))
