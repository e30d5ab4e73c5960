"""Named random streams: dropout inside a tensor-parallel region draws from a stream of its own.

Under tensor parallelism each tp rank holds different attention heads (and, with sequence
parallelism, a different slice of the sequence). If every rank drew dropout masks from the default
generator, which is seeded identically everywhere, the masks of different shards would be copies of
each other. Megatron-LM keeps a separate "model-parallel" generator per tp rank, seeded
seed + 2718 + tp_rank (Shoeybi et al. 2019, §B.2); `RNGStream` is that generator:

    with stream:            # the default generator now *is* this stream
        y = dropout(x)      # draws advance the stream, not the default one

Activation checkpointing must replay the same masks in backward, so every live stream is listed by
`live_streams()` and `train.activation_checkpoint` snapshots and restores them with the default state.
"""
from __future__ import annotations

import weakref

import torch

_LIVE: "weakref.WeakSet[RNGStream]" = weakref.WeakSet()


class RNGStream:
    """A CPU (and current-CUDA-device) random state that code borrows inside ``with stream:``."""

    def __init__(self, seed: int, device: torch.device | None = None):
        self.cuda = device is not None and device.type == "cuda"
        with torch.random.fork_rng(devices=[torch.cuda.current_device()] if self.cuda else []):
            torch.manual_seed(seed)
            self.state = self._get()
        _LIVE.add(self)

    def _get(self):
        return (torch.get_rng_state(), torch.cuda.get_rng_state() if self.cuda else None)

    def _set(self, state) -> None:
        torch.set_rng_state(state[0])
        if self.cuda:
            torch.cuda.set_rng_state(state[1])

    def __enter__(self):
        self._outer = self._get()
        self._set(self.state)
        return self

    def __exit__(self, *exc):
        self.state = self._get()
        self._set(self._outer)


def live_streams() -> list[RNGStream]:
    return list(_LIVE)
