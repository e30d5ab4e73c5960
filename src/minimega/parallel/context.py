"""Context parallelism: each sequence split over a ring of cp ranks, attention computed by ring attention
(or by Ulysses' all-to-all over heads, `minimega.parallel.ulysses`, with ``TrainConfig.cp_attention='ulysses'``).

Layout (causal load balancing). A sequence of T tokens is cut into 2·cp chunks of c = T/(2·cp) tokens;
cp rank r holds chunks r and 2·cp-1-r, in that order (Megatron-LM's context parallelism). Under a causal
mask chunk i attends to chunks 0..i, so rank r's two chunks see (r+1) + (2·cp-r) = 2·cp+1 chunks of keys
on every rank: the work is balanced. Plain contiguous slices would leave the last rank cp times the first
one's work and the first rank idle.

Everything but attention is per token: embeddings (indexed by each token's *global* position), LayerNorms,
MLPs, head and loss run on the rank's 2c tokens alone, so activations per rank are ∝ T/cp. Attention needs
every earlier key; ring attention (Liu et al. 2023, arXiv:2310.01889) brings them by, never all at once:

    Phase 1 (forward): cp steps. At step s the rank holds the K/V of rank (r - s) mod cp. It starts
        sending them to rank r+1 (receiving the next block from r-1), attends its queries to the block it
        holds, and folds the result into a running (max, sum, output) per query: the online softmax
        (Milakov & Gimelshein 2018, arXiv:1805.02867), so the result equals softmax over all keys at once.
    Phase 2 (backward): the same ring with K/V again, plus an accumulator dK/dV that travels with them:
        each rank adds its queries' share of the block's gradient; after cp hops the accumulator is home.

Bytes one rank sends per layer and step (`estimate.cp_ring_bytes`): forward (cp-1) K/V blocks, backward
(cp-1) K/V blocks and cp dK/dV blocks, each block 2·B·(T/cp)·(D/tp) elements:
(6·cp - 4) · B · (T/cp) · (D/tp) · bytes per element.

Gradients: the parameters are replicated over dp·cp. Each rank's loss is the mean over its B·T/cp tokens,
the same count on every rank, so averaging gradients over the dp·cp group (`mesh.grad_group`: DDP or ZeRO
over it) gives the gradient of the mean over every token of the global batch.

With Llama's blocks: RoPE rotates q and k on each rank with their *global* positions (`positions`, set on each
attention module) before they go around the ring or through Ulysses' all-to-alls, so every score sees the same
angle difference as on one device; with grouped-query attention each key/value head is repeated for the query
heads that read it before the core (the ring then carries nh/tp heads of K/V, as without GQA).

Composes with dp (and ZeRO over dp·cp), tp (each tp rank runs the ring on its n_head/tp heads) and a
mixture of experts with dropless dispatch (routing is per token; the aux loss's means are pooled over the
ring, see `minimega.parallel.moe.layer`). Refused by name (`check`): pipeline parallelism, sequence parallelism, dropout (and,
for Ulysses, an n_head that tp·cp does not divide); capacity-routed experts by `moe.check`.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn

from .. import comm
from . import ulysses
from ..comm import Group
from .ulysses import ulysses_attention


def chunk_ids(cp_rank: int, cp: int) -> tuple[int, int]:
    """The two chunks (of 2·cp) rank ``cp_rank`` holds: an early one and its mirror."""
    return cp_rank, 2 * cp - 1 - cp_rank


# --8<-- [start:shard_sequence]
# --8<-- [start:shard_sequence_c1]
def shard_sequence(t: torch.Tensor, cp_rank: int, cp: int) -> torch.Tensor:
# --8<-- [end:shard_sequence_c1]
    """(B, T, ...) → (B, T/cp, ...): this rank's chunks r and 2·cp-1-r of the 2·cp along T, concatenated."""
    # --8<-- [start:shard_sequence_c2]
    if t.shape[1] % (2 * cp):
        raise ValueError(f"context parallelism: sequence length {t.shape[1]} is not divisible by 2*cp = {2 * cp}")
    chunks = t.chunk(2 * cp, dim=1)                                            # 2cp × (B, c, ...)
    a, b = chunk_ids(cp_rank, cp)
    return torch.cat([chunks[a], chunks[b]], dim=1)                            # (B, 2c, ...)


def positions(local_len: int, cp_rank: int, cp: int, device=None) -> torch.Tensor:
    # --8<-- [end:shard_sequence_c2]
    """Global positions of this rank's ``local_len`` = 2c tokens (what the position embedding indexes)."""
    # --8<-- [start:shard_sequence_c3]
    c = local_len // 2
    a, b = chunk_ids(cp_rank, cp)
    return torch.cat([torch.arange(a * c, (a + 1) * c, device=device), torch.arange(b * c, (b + 1) * c, device=device)])
    # --8<-- [end:shard_sequence_c3]
# --8<-- [end:shard_sequence]


def unshard_sequence(parts: list[torch.Tensor], cp: int) -> torch.Tensor:
    """The inverse of `shard_sequence`: every rank's (B, T/cp, ...) in cp-rank order → (B, T, ...)."""
    chunks: list = [None] * (2 * cp)
    for r, part in enumerate(parts):
        a, b = chunk_ids(r, cp)
        chunks[a], chunks[b] = part.chunk(2, dim=1)
    return torch.cat(chunks, dim=1)


# --8<-- [start:visibility]
# --8<-- [start:visibility_c1]
def visibility(q_chunk: int, k_chunk: int) -> str | None:
# --8<-- [end:visibility_c1]
    """How a block of queries from chunk ``q_chunk`` sees keys from chunk ``k_chunk`` under a causal mask:
    'full' (every key is earlier), 'causal' (the diagonal block: mask j > i) or None (every key is later)."""
    # --8<-- [start:visibility_c2]
    if k_chunk < q_chunk:
        return "full"
    return "causal" if k_chunk == q_chunk else None
    # --8<-- [end:visibility_c2]
# --8<-- [end:visibility]


def _scores(q, k, mode, scale):
    """fp32 scores (B, nh, c, c) of one query block against one key block, the causal mask applied."""
    s = (q.float() @ k.float().transpose(-2, -1)) * scale                      # (B, nh, c, c)
    if mode == "causal":
        c = s.shape[-1]
        s = s.masked_fill(torch.ones(c, c, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return s


def _ring_exchange(tensors: list[torch.Tensor], group: Group, tag: str) -> tuple[list[torch.Tensor], comm.Handle]:
    """Send each tensor to the next rank of the ring, receive the previous rank's into new buffers (async)."""
    me = group.rank_of(torch.distributed.get_rank())
    nxt, prv = group.ranks[(me + 1) % group.size], group.ranks[(me - 1) % group.size]
    got = [torch.empty_like(t) for t in tensors]
    ops = [comm.P2P("send", t, nxt, tag) for t in tensors] + [comm.P2P("recv", g, prv, tag) for g in got]
    return got, comm.batch_p2p(ops, group)


# --8<-- [start:ring_forward]
class _RingAttention(torch.autograd.Function):
    """Causal attention of this rank's queries over the whole sequence's keys, K/V passed around the ring.

    Shapes: q, k, v (B, nh, 2c, hs): this rank's chunks (a, b) = (r, 2cp-1-r), each c tokens → (B, nh, 2c, hs).
    Forward: cp-1 ring sends of (k, v). Backward: cp-1 of (k, v) and cp of (dk, dv).
    """

    @staticmethod
    def forward(ctx, q, k, v, group):
        cp, me = group.size, group.rank_of(torch.distributed.get_rank())
        scale = 1.0 / math.sqrt(q.shape[-1])
        mine = chunk_ids(me, cp)
        qs = q.chunk(2, dim=2)                                                 # 2 × (B, nh, c, hs)
        m = [torch.full(t.shape[:-1], float("-inf"), device=q.device) for t in qs]     # running max (B, nh, c)
        ell = [torch.zeros(t.shape[:-1], device=q.device) for t in qs]                 # running sum ℓ
        o = [torch.zeros(t.shape, device=q.device) for t in qs]                        # running output, fp32
        kv = [k.contiguous(), v.contiguous()]
        for step in range(cp):
            if step < cp - 1:                                                  # overlap: next block in flight
                nxt, handle = _ring_exchange(kv, group, "cp_kv")
            theirs = chunk_ids((me - step) % cp, cp)
            for i, (qi, qc) in enumerate(zip(qs, mine)):
                for kj, vj, kc in zip(kv[0].chunk(2, dim=2), kv[1].chunk(2, dim=2), theirs):
                    mode = visibility(qc, kc)
                    if mode is None:
                        continue
                    s = _scores(qi, kj, mode, scale)                           # (B, nh, c, c)
                    m_new = torch.maximum(m[i], s.amax(-1))
                    p = torch.exp(s - m_new.unsqueeze(-1))
                    alpha = torch.exp(m[i] - m_new)                            # rescales what came before
                    ell[i] = ell[i] * alpha + p.sum(-1)
                    o[i] = o[i] * alpha.unsqueeze(-1) + p @ vj.float()
                    m[i] = m_new
            if step < cp - 1:
                handle.wait()
                kv = nxt
        # Laid out (B, 2c, nh, hs) like the fused kernels' output: the caller's transpose(1, 2).reshape is a
        # view, so the block keeps one copy of it, not two.
        out = torch.cat([oi / li.unsqueeze(-1) for oi, li in zip(o, ell)], dim=2).to(q.dtype)
        out = out.transpose(1, 2).contiguous().transpose(1, 2)                     # (B, nh, 2c, hs)
        lse = torch.cat([mi + li.log() for mi, li in zip(m, ell)], dim=2)            # (B, nh, 2c)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.scale = group, scale
        return out
    # --8<-- [end:ring_forward]

    # --8<-- [start:ring_backward]
    @staticmethod
    def backward(ctx, dout):                                                   # dout: (B, nh, 2c, hs)
        q, k, v, out, lse = ctx.saved_tensors
        group, scale = ctx.group, ctx.scale
        cp, me = group.size, group.rank_of(torch.distributed.get_rank())
        mine = chunk_ids(me, cp)
        dout = dout.float()
        delta = (dout * out.float()).sum(-1)                                           # (B, nh, 2c): rowsum(dO ∘ O)
        qs, dos, lses, deltas = (t.chunk(2, dim=2) for t in (q, dout, lse, delta))
        dq = [torch.zeros(t.shape, device=q.device) for t in qs]
        kv = [k.contiguous(), v.contiguous()]
        dkv = [torch.zeros(k.shape, device=k.device), torch.zeros(v.shape, device=v.device)]   # fp32 accumulators
        for step in range(cp):
            if step < cp - 1:
                nxt, handle = _ring_exchange(kv, group, "cp_kv")
            theirs = chunk_ids((me - step) % cp, cp)
            dks, dvs = dkv[0].chunk(2, dim=2), dkv[1].chunk(2, dim=2)          # views: add_ writes the accumulators
            for i, qc in enumerate(mine):
                for j, kc in enumerate(theirs):
                    mode = visibility(qc, kc)
                    if mode is None:
                        continue
                    kj, vj = kv[0].chunk(2, dim=2)[j].float(), kv[1].chunk(2, dim=2)[j].float()
                    p = torch.exp(_scores(qs[i], kj, mode, scale) - lses[i].unsqueeze(-1))    # (B, nh, c, c)
                    dvs[j].add_(p.transpose(-2, -1) @ dos[i])
                    ds = p * (dos[i] @ vj.transpose(-2, -1) - deltas[i].unsqueeze(-1))
                    dq[i] += (ds @ kj) * scale
                    dks[j].add_((ds.transpose(-2, -1) @ qs[i].float()) * scale)
            # The accumulator moves on with its block; after the last hop it holds this rank's own dK/dV.
            dkv, dhandle = _ring_exchange(dkv, group, "cp_dkv")
            if step < cp - 1:
                handle.wait()
                kv = nxt
            dhandle.wait()
        dq = torch.cat(dq, dim=2)
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None
    # --8<-- [end:ring_backward]


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Group) -> torch.Tensor:
    """Causal attention over the ring ``group`` (see `_RingAttention`); one rank: the local causal attention."""
    if group.size == 1:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return _RingAttention.apply(q, k, v, group)


ATTENTION = {"ring": ring_attention, "ulysses": ulysses_attention}
"""The attention cores context parallelism runs (`TrainConfig.cp_attention`); both on the same chunk layout."""


def apply_context_parallel(model: nn.Module, mesh, attention: str = "ring") -> nn.Module:
    """In place (on the engine's own copy): attention cores run ``attention`` ('ring' or 'ulysses') over
    ``mesh.cp_group`` and the embedding reads each token's global position. A `model.GPT` or its
    tensor-parallel form; cp = 1: unchanged."""
    group = mesh.cp_group
    if group is None or group.size == 1:
        return model
    core = ATTENTION[attention]
    for block in model.blocks:
        attn = block.attn
        repeat = attn.n_head // attn.n_kv_head                      # query heads per key/value head (GQA)
        bound = functools.partial(core, group=group)
        attn.core = functools.partial(_repeat_kv, bound, repeat) if repeat > 1 else bound
        attn.positions = functools.partial(positions, cp_rank=mesh.cp_rank, cp=group.size)   # RoPE's angles
    model.positions = functools.partial(global_positions, rank=mesh.cp_rank, cp=group.size,
                                        block_size=model.config.block_size)
    return model


def _repeat_kv(core, repeat: int, q, k, v):
    """``core`` with each of the nkv key/value heads repeated for the ``repeat`` query heads that read it:
    k, v (B, nkv, T/cp, hs) → (B, nkv·repeat, T/cp, hs). Their gradients sum back over the copies."""
    return core(q, k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1))


def global_positions(idx: torch.Tensor, rank: int, cp: int, block_size: int) -> torch.Tensor:
    """idx: (B, T/cp), this cp rank's chunks (r, 2cp-1-r) → their (T/cp,) places in the whole sequence."""
    T = idx.shape[1] * cp
    if T > block_size:
        raise ValueError(f"sequence length {T} exceeds block_size={block_size}")
    return positions(idx.shape[1], rank, cp, idx.device)


def check(model_config, config, dims) -> None:
    """What the engine builds with cp > 1; everything else is refused by name before any rank starts (a mixture
    of experts: `moe.check`)."""
    if config.cp != dims.cp:
        raise ValueError(f"TrainConfig(cp={config.cp}) does not match the mesh (cp={dims.cp}); build the mesh from "
                         f"the same numbers")
    if dims.cp == 1:
        return
    seq = config.seq_len or model_config.block_size
    if seq % (2 * dims.cp):
        raise ValueError(f"cp={dims.cp}: seq_len={seq} is not divisible by 2*cp = {2 * dims.cp} (each rank holds "
                         f"two chunks of seq_len/(2*cp) tokens); pick a seq_len that is")
    refused = [("pp", config.pp != 1, "pp=1 (context parallelism is not built into the pipeline)"),
               ("sequence_parallel", config.sequence_parallel, "sequence_parallel=False (cp already splits the sequence)")]
    for name, bad, fix in refused:
        if bad:
            raise ValueError(f"cp={dims.cp} does not compose with {name}={getattr(config, name)!r}; use {fix}")
    if model_config.dropout:
        raise ValueError(f"cp={dims.cp}: GPTConfig.dropout={model_config.dropout} is not supported (ring attention "
                         f"has no dropout); use dropout=0")
    ulysses.check(model_config, config, dims)
