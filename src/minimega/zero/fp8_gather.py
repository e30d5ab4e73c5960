"""ZeRO-3 with fp8 weight gathers: each block's linear weights cross the wire in E4M3, one byte an element.

A ZeRO-3 rank holds 1/dp of each unit and all-gathers the rest before the unit's forward and again before
its backward: 2Ψ parameter elements per step. In bf16 that is 2 bytes each; the fp8 linears
(`minimega.train.fp8`) only ever multiply the E4M3 cast of their weight, so the cast can happen *before* the
gather, on the shard, and halve those bytes (torchao's float8 all-gather for FSDP2 does the same):

    Phase 1 (unshard, per block): cast this rank's bf16 shard to E4M3 with each weight's scale, all-gather
        the bytes (uint8: gloo and NCCL move them as they are).
    Phase 2 (wait): dequantize the gathered bytes into the unit's bf16 flat buffer, ``q / scale``.

The fp8 linear then casts that weight again with the same scale and gets the same bytes back (``q / s``
in bf16 is within 2^-9 of q / s, far inside half an E4M3 step), so the forward multiplies what was
gathered. The scales themselves need no gather: delayed scaling derives each weight's scale from its
amax history, and every rank's history observed the same gathered weight, so they agree on every rank.

Only the blocks' linear weights are fp8; the rest of a block (LayerNorm weights, biases: a few hundred
elements) stays whole on every rank (persistent), so a block's gathered unit is fp8 throughout. The
embeddings and the head are gathered in bf16 as before.
"""
from __future__ import annotations

import torch

from .. import comm
from ..train import fp8
from .flat import FlatUnit
from .stage3 import Zero3


class _DequantizeAfter:
    """The all-gather's handle; ``wait()`` also writes the dequantized weights into the unit's buffer."""

    def __init__(self, handle: comm.Handle, finish):
        self.handle, self.finish = handle, finish

    def wait(self):
        self.handle.wait()
        self.finish()


class Zero3Fp8(Zero3):
    """ZeRO-3 whose block units are gathered as E4M3 bytes (see the module docstring)."""

    def _units(self, module):
        self._scaling = {id(m.weight): m.fp8.weight for m in fp8.fp8_linears(module)}
        return super()._units(module)

    def _whole(self, params):
        """In a unit holding fp8 weights every other parameter stays whole, so the gathered unit is fp8 throughout."""
        if any(id(p) in self._scaling for _, p in params):
            return {n for n, p in params if id(p) not in self._scaling}
        return super()._whole(params)

    # --8<-- [start:fp8_gather]
    def _gather(self, u: FlatUnit, shard: torch.Tensor):
        if not all(id(p) in self._scaling for p in u.params):
            return super()._gather(u, shard)                                # embed, head: bf16
        scales = torch.ones(u.padded, device=shard.device)                  # each element's weight scale
        for view, p in zip(u.views(scales), u.params):
            view.fill_(self._scaling[id(p)].scale.to(shard.device))              # on the device: no host wait
        q = fp8.quantize(shard, scales[u.start:u.end], fp8.E4M3)            # (N/dp,) E4M3
        full = torch.empty(u.padded, dtype=torch.uint8, device=shard.device)
        handle = comm.all_gather(full, q.view(torch.uint8), self.group, async_op=True, tag=u.name)

        def finish():                                                       # (N,) E4M3 -> bf16 weights
            u.flat.data.copy_(fp8.dequantize(full.view(fp8.E4M3), scales, u.flat.dtype))
        return _DequantizeAfter(handle, finish)
    # --8<-- [end:fp8_gather]
