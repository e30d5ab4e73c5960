"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, arXiv:1909.08053) and sequence parallelism
(Korthikanti et al. 2022, arXiv:2205.05198 §4.2.2).

Each transformer block is split over the tp group so that only its two ends communicate:

    attention:  qkv  column-parallel by heads (W[3D_tp, D])  →  core on D/tp of the heads  →  proj row-parallel
    MLP:        fc   column-parallel (W[F_tp, D])            →  GELU                       →  proj row-parallel

With Llama's blocks: grouped-query attention splits the n_kv_head key/value heads over tp as well (each rank
keeps the kv heads its n_head/tp query heads read), and SwiGLU's gate and fc (up) are both column-parallel
behind one `f`, its proj (down) row-parallel: the same two all-reduces per block (`tensor_blocks`).

A column-parallel layer starts with `f` (forward: identity, backward: all-reduce); a row-parallel layer
ends with `g` (forward: all-reduce, backward: identity). That is 2 all-reduces forward and 2 backward per
layer, each on a (B, T, D) activation. With sequence parallelism the LayerNorms and dropouts between the
blocks work on T/tp of the sequence: `f` becomes an all-gather along T (backward: reduce-scatter) and `g`
a reduce-scatter along T (backward: all-gather), the same bytes as a ring all-reduce.

The token embedding and the head are split over the vocabulary (padded to a multiple of tp; padded
logits are masked to -inf so they never enter the softmax), and the cross-entropy runs on the vocab
shards without ever gathering the (B, T, V) logits.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import comm
from ..comm import Group
from ..config import GPTConfig
from ..model import GPT
from .rng import RNGStream
from .tensor_blocks import ParallelSelfAttention, ParallelSwiGLU

SEQ_DIM = 1          # activations are (B, T, D); sequence parallelism shards T


def check_divisible(config: GPTConfig, tp: int) -> None:
    """Raise before launch when tp cannot split the heads, the key/value heads, the hidden size or the MLP width."""
    for name, value in (("n_head", config.n_head), ("n_kv_head", config.kv_heads), ("n_embd", config.n_embd),
                        ("MLP width", config.mlp_hidden)):
        if value % tp:
            raise ValueError(f"tensor parallelism: tp={tp} does not divide {name}={value} "
                             f"({value} % {tp} = {value % tp}); pick a tp that divides it")


def _all_gather(x: torch.Tensor, group: Group, tag: str) -> torch.Tensor:
    """(tp, *x.shape): every rank's ``x``, in rank order (flat buffers: what every backend accepts)."""
    out = torch.empty(group.size * x.numel(), dtype=x.dtype, device=x.device)
    comm.all_gather(out, x.detach().reshape(-1), group, tag=tag)
    return out.view(group.size, *x.shape)


def _gather(x: torch.Tensor, dim: int, group: Group) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` (rank order)."""
    return torch.cat(_all_gather(x, group, "tp").unbind(0), dim=dim)


def _reduce_scatter(x: torch.Tensor, dim: int, group: Group) -> torch.Tensor:
    """Sum ``x`` over the group; this rank keeps its chunk along ``dim``."""
    if x.shape[dim] % group.size:
        raise ValueError(f"sequence parallelism: length {x.shape[dim]} is not divisible by tp={group.size}")
    chunks = torch.stack(x.chunk(group.size, dim))                           # (tp, ..., T/tp, ...)
    out = torch.empty_like(chunks[0])
    comm.reduce_scatter(out.view(-1), chunks.view(-1), group, tag="tp")
    return out


def _split(x: torch.Tensor, dim: int, group: Group) -> torch.Tensor:
    return x.chunk(group.size, dim)[group.rank].contiguous()


# --8<-- [start:regions]
# --8<-- [start:f_region]
# --8<-- [start:f_region_c1]
class _CopyToTP(torch.autograd.Function):
# --8<-- [end:f_region_c1]
    """Forward: identity. Backward: all-reduce (sum) over tp. `f` in Megatron-LM."""
    # --8<-- [start:f_region_c2]
    @staticmethod
    def forward(ctx, x, group):      # x: (B, T, D) replicated on every tp rank
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):         # grad: (B, T, D) partial (each rank saw D/tp of the columns)
        return comm.all_reduce(grad.clone(), ctx.group, tag="tp"), None
    # --8<-- [end:f_region_c2]
# --8<-- [end:f_region]


# --8<-- [start:g_region]
# --8<-- [start:g_region_c1]
class _ReduceFromTP(torch.autograd.Function):
# --8<-- [end:g_region_c1]
    """Forward: all-reduce (sum) over tp. Backward: identity. `g` in Megatron-LM."""
    # --8<-- [start:g_region_c2]
    @staticmethod
    def forward(ctx, x, group):      # x: (B, T, D) partial sums on each tp rank
        return comm.all_reduce(x.clone(), group, tag="tp")

    @staticmethod
    def backward(ctx, grad):         # grad: (B, T, D), replicated
        return grad, None
    # --8<-- [end:g_region_c2]
# --8<-- [end:g_region]


class _ScatterToTP(torch.autograd.Function):
    """Forward: keep this rank's slice of the last dim. Backward: all-gather along the last dim."""
    @staticmethod
    def forward(ctx, x, group):      # (..., D) → (..., D/tp)
        ctx.group = group
        return _split(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, -1, ctx.group), None


class _GatherFromTP(torch.autograd.Function):
    """Forward: all-gather along the last dim. Backward: keep this rank's slice."""
    @staticmethod
    def forward(ctx, x, group):      # (..., D/tp) → (..., D)
        ctx.group = group
        return _gather(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, -1, ctx.group), None


class _GatherFromSP(torch.autograd.Function):
    """Forward: all-gather along T. Backward: reduce-scatter along T. `f` under sequence parallelism."""
    @staticmethod
    def forward(ctx, x, group):      # (B, T/tp, D) → (B, T, D)
        ctx.group = group
        return _gather(x, SEQ_DIM, group)

    @staticmethod
    def backward(ctx, grad):         # (B, T, D) partial → (B, T/tp, D) summed
        return _reduce_scatter(grad, SEQ_DIM, ctx.group), None


class _ReduceScatterToSP(torch.autograd.Function):
    """Forward: reduce-scatter along T. Backward: all-gather along T. `g` under sequence parallelism."""
    @staticmethod
    def forward(ctx, x, group):      # (B, T, D) partial → (B, T/tp, D) summed
        ctx.group = group
        return _reduce_scatter(x, SEQ_DIM, group)

    @staticmethod
    def backward(ctx, grad):         # (B, T/tp, D) → (B, T, D)
        return _gather(grad, SEQ_DIM, ctx.group), None


def _region(fn):
    def apply(x: torch.Tensor, group: Group) -> torch.Tensor:
        return x if group.size == 1 else fn.apply(x, group)
    apply.__doc__ = fn.__doc__
    return apply


copy_to_tp = _region(_CopyToTP)
reduce_from_tp = _region(_ReduceFromTP)
scatter_to_tp = _region(_ScatterToTP)
gather_from_tp = _region(_GatherFromTP)
gather_from_sp = _region(_GatherFromSP)
reduce_scatter_to_sp = _region(_ReduceScatterToSP)
# --8<-- [end:regions]


def _gather_shards(w: torch.Tensor, group: Group) -> torch.Tensor:
    return _all_gather(w, group, "consolidate")                             # (tp, *shard)


# --8<-- [start:column_parallel_forward]
class ColumnParallelLinear(nn.Module):
    """Y = XA with A = [A_1 … A_tp] split by output columns: rank r computes Y_r = X A_r.

    Forward: `f` on the input (identity, or an all-gather along T with sequence parallelism), then a
    local matmul; the output stays split. Backward: the input gradient X̄ = Σ_r Ȳ_r A_r^T is summed by `f`.

    Shapes: weight (out/tp, in) ("rows split over tp"); x (B, T, in) → (B, T, out/tp).
    ``partitions`` splits each stacked row block separately (qkv's [q; k; v]), so a rank holds the q, k and
    v rows of the same heads: an int p (p equal blocks) or the blocks' row counts (grouped-query attention's
    (D, k, k), k = n_kv_head·hs). ``out_features`` is padded up to a multiple of tp (rows of zeros) when
    ``pad`` is set: the vocabulary of the head.
    """

    def __init__(self, linear: nn.Linear, group: Group, *, sequence_parallel: bool = False,
                 partitions: int | tuple[int, ...] = 1, pad: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.out_features, tp = linear.out_features, group.size
        padded = math.ceil(self.out_features / tp) * tp if pad else self.out_features
        blocks = (padded // partitions,) * partitions if isinstance(partitions, int) else tuple(partitions)
        if sum(blocks) != padded or any(b % tp for b in blocks):
            raise ValueError(f"ColumnParallelLinear: {padded} output rows do not split into block(s) {blocks}, "
                             f"each over tp={tp}")
        self.blocks, self.partitions, rank = blocks, len(blocks), group.rank   # blocks: global rows of each

        def shard(t: torch.Tensor) -> torch.Tensor:
            t = F.pad(t.detach(), (0, 0) * (t.dim() - 1) + (0, padded - t.shape[0]))
            parts = t.split(blocks, 0)                                      # [q; k; v] → (D, in), 2 × (k, in)
            return torch.cat([b.chunk(tp, 0)[rank] for b in parts]).clone()
        self.weight = nn.Parameter(shard(linear.weight))                    # (out/tp, in)
        self.bias = nn.Parameter(shard(linear.bias)) if linear.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.local(self.enter(x))                                    # (B, T, out/tp)

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        """`f`: identity forward and an all-reduce backward, or the all-gather along T under SP."""
        return gather_from_sp(x, self.group) if self.sequence_parallel else copy_to_tp(x, self.group)

    def local(self, x: torch.Tensor) -> torch.Tensor:
        """The matmul on this rank's rows, for input that has been through `enter`."""
        return F.linear(x, self.weight, self.bias)

    def full(self, t: torch.Tensor) -> torch.Tensor:
        """The unsharded, unpadded tensor (weight or bias) in `nn.Linear`'s layout."""
        shards = _gather_shards(t, self.group)                              # (tp, out/tp, ...)
        local = [b // self.group.size for b in self.blocks]
        return torch.cat([s.reshape(-1, *t.shape[1:])                       # block j: (tp·rows_j/tp, ...)
                          for s in shards.split(local, dim=1)])[: self.out_features]
# --8<-- [end:column_parallel_forward]


# --8<-- [start:row_parallel_forward]
class RowParallelLinear(nn.Module):
    """Y = XA with A = [A_1; …; A_tp] split by input rows and X = [X_1 … X_tp] split by columns:
    Y = Σ_r X_r A_r.

    Forward: local matmul, then `g` (all-reduce, or a reduce-scatter along T with sequence
    parallelism), then the bias. Backward: `g` is the identity (or an all-gather along T); each rank's
    X̄_r = Ȳ A_r^T needs no communication.

    Shapes: weight (out, in/tp) ("columns split over tp"); x (B, T, in/tp) → (B, T, out)
    (B, T/tp, out with sequence parallelism).
    """

    def __init__(self, linear: nn.Linear, group: Group, *, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = nn.Parameter(linear.weight.detach().chunk(group.size, 1)[group.rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)                                        # (B, T, out) partial sum
        y = reduce_scatter_to_sp(y, self.group) if self.sequence_parallel else reduce_from_tp(y, self.group)
        return y if self.bias is None else y + self.bias

    def full(self, t: torch.Tensor) -> torch.Tensor:
        if t is self.bias:
            return t.detach()
        return torch.cat(_gather_shards(t, self.group).unbind(0), dim=1)   # (out, in)
# --8<-- [end:row_parallel_forward]


class VocabParallelEmbedding(nn.Module):
    """E[V, D] split by vocabulary rows: rank r holds ids [r·V/tp, (r+1)·V/tp) of the padded vocabulary.

    Forward: look up the ids this rank holds (zeros elsewhere), then `g`: all-reduce (or reduce-scatter
    along T with sequence parallelism). Backward: each rank's rows get the gradient of their own ids.

    Shapes: weight (V_pad/tp, D); idx (B, T) → (B, T, D), or (B, T/tp, D) with sequence parallelism.
    """

    def __init__(self, embedding: nn.Embedding, group: Group, *, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.num_embeddings = embedding.num_embeddings
        self.per_rank = math.ceil(self.num_embeddings / group.size)
        self.start = group.rank * self.per_rank
        padded = F.pad(embedding.weight.detach(), (0, 0, 0, self.per_rank * group.size - self.num_embeddings))
        self.weight = nn.Parameter(padded[self.start: self.start + self.per_rank].clone())

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        outside = (idx < self.start) | (idx >= self.start + self.per_rank)
        x = F.embedding((idx - self.start).masked_fill(outside, 0), self.weight)
        x = x.masked_fill(outside.unsqueeze(-1), 0.0)                       # (B, T, D) this rank's share
        return reduce_scatter_to_sp(x, self.group) if self.sequence_parallel else reduce_from_tp(x, self.group)

    def full(self, t: torch.Tensor) -> torch.Tensor:
        return _gather_shards(t, self.group).flatten(0, 1)[: self.num_embeddings]


# --8<-- [start:vocab_parallel_cross_entropy]
class _VocabParallelCrossEntropy(torch.autograd.Function):
    """loss_i = log Σ_v exp(z_iv − m_i) − (z_i,y_i − m_i), with the sum and the target logit assembled from
    vocab shards by two all-reduces of N numbers (and m_i, the max, by an all-gather of tp·N): the (N, V)
    logits are never gathered. Backward: softmax − one-hot, on the shard, without communication.
    """
    @staticmethod
    def forward(ctx, logits, targets, group, vocab_size):     # logits (N, V_pad/tp), targets (N,)
        n, width = logits.shape
        start = group.rank * width
        columns = torch.arange(start, start + width, device=logits.device)
        logits = logits.masked_fill(columns >= vocab_size, float("-inf"))   # padding never enters the softmax
        maxes = _all_gather(logits.max(-1).values, group, "vocab_ce")      # (tp, N)
        shifted = logits - maxes.max(0).values.unsqueeze(1)                 # (N, V_pad/tp)
        exp = shifted.exp()
        sum_exp = comm.all_reduce(exp.sum(-1), group, tag="vocab_ce")       # (N,)
        mine = (targets >= start) & (targets < start + width)
        local = (targets - start).masked_fill(~mine, 0)
        target_logit = shifted.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill(~mine, 0.0)
        target_logit = comm.all_reduce(target_logit, group, tag="vocab_ce")
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(1)), local, mine)
        return sum_exp.log() - target_logit                                 # (N,) per-token loss

    @staticmethod
    def backward(ctx, grad):                                                # grad: (N,)
        softmax, local, mine = ctx.saved_tensors
        g = softmax.clone()
        g[torch.arange(g.shape[0], device=g.device), local] -= mine.to(g.dtype)
        return g * grad.unsqueeze(1), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, group: Group,
                                 vocab_size: int) -> torch.Tensor:
    """Mean cross-entropy from vocab-sharded logits (B, T, V_pad/tp) and targets (B, T)."""
    if group.size == 1:
        return F.cross_entropy(logits[..., :vocab_size].reshape(-1, vocab_size), targets.reshape(-1))
    flat = logits.reshape(-1, logits.shape[-1])                             # (N, V_pad/tp)
    return _VocabParallelCrossEntropy.apply(flat, targets.reshape(-1), group, vocab_size).mean()
# --8<-- [end:vocab_parallel_cross_entropy]


class _StreamDropout(nn.Module):
    """Dropout drawing from a tp rank's stream: for activations split along T by sequence parallelism."""

    def __init__(self, dropout: nn.Dropout, rng: RNGStream):
        super().__init__()
        self.p, self.rng = dropout.p, rng

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and self.p > 0):
            return x
        with self.rng:
            return F.dropout(x, self.p, training=True)


class ParallelGPT(GPT):
    """`model.GPT` with every block, the embedding and the head split over ``group``; same parameter names.

    ``forward(idx, targets)`` returns (vocab-sharded logits (B, T, V_pad/tp), mean loss). Replicated
    parameters (LayerNorms, position embedding) see only T/tp of the sequence under sequence
    parallelism, so a gradient hook sums their gradients over tp (Megatron's sequence-parallel grads).
    """

    def __init__(self, model: GPT, group: Group, sequence_parallel: bool = False):
        nn.Module.__init__(self)
        check_divisible(model.config, group.size)
        self.config, self.group, self.sequence_parallel = model.config, group, sequence_parallel
        self.wte = VocabParallelEmbedding(model.wte, group, sequence_parallel=sequence_parallel)
        # Copies: the caller's model is left as it was (its modules are neither rewired nor shared).
        self.wpe, self.drop, self.ln_f = (copy.deepcopy(m) for m in (model.wpe, model.drop, model.ln_f))
        self.blocks = copy.deepcopy(model.blocks)          # their linears are replaced by tp shards below
        # Megatron's model-parallel seed: heads (and, under SP, sequence slices) differ across tp ranks,
        # so their dropout masks must too; replicated activations keep the default, shared stream.
        self.rng = RNGStream(torch.initial_seed() + 2718 + group.rank, model.wte.weight.device)
        hs, heads = model.config.head_size, (model.config.n_head, model.config.kv_heads, model.config.kv_heads)
        for block in self.blocks:
            qkv = ColumnParallelLinear(block.attn.qkv, group, sequence_parallel=sequence_parallel,
                                       partitions=tuple(h * hs for h in heads))           # [q; k; v] rows
            proj = RowParallelLinear(block.attn.proj, group, sequence_parallel=sequence_parallel)
            block.attn = ParallelSelfAttention(block.attn, qkv, proj, group.size, self.rng)
            if sequence_parallel:
                block.attn.resid_dropout = _StreamDropout(block.attn.resid_dropout, self.rng)
                block.mlp.dropout = _StreamDropout(block.mlp.dropout, self.rng)
            if not hasattr(block.mlp, "experts"):          # a mixture of experts stays whole (`minimega.parallel.moe.layer`)
                column = {n: ColumnParallelLinear(getattr(block.mlp, n), group, sequence_parallel=sequence_parallel)
                          for n in ("gate", "fc") if hasattr(block.mlp, n)}
                proj = RowParallelLinear(block.mlp.proj, group, sequence_parallel=sequence_parallel)
                if "gate" in column:                       # SwiGLU: gate and fc behind one `f`
                    block.mlp = ParallelSwiGLU(block.mlp, column["gate"], column["fc"], proj)
                else:
                    block.mlp.fc, block.mlp.proj = column["fc"], proj
        self.lm_head = ColumnParallelLinear(model.lm_head, group, sequence_parallel=sequence_parallel, pad=True)
        if sequence_parallel:
            self.drop = _StreamDropout(self.drop, self.rng)
            for p in self.replicated_parameters():
                p.register_hook(lambda g: comm.all_reduce(g.clone(), group, tag="sp_grad"))

    def sharded_modules(self) -> dict[str, nn.Module]:
        return {n: m for n, m in self.named_modules()
                if isinstance(m, (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding))}

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Parameters every tp rank holds whole (LayerNorms, wpe, row-parallel biases)."""
        sharded = {id(m.weight) for m in self.sharded_modules().values()}
        sharded |= {id(m.bias) for m in self.sharded_modules().values()
                    if isinstance(m, ColumnParallelLinear) and m.bias is not None}
        return [p for p in self.parameters() if id(p) not in sharded]

    def position_embedding(self, pos: torch.Tensor) -> torch.Tensor:
        """(T, D), or this rank's (T/tp, D) under sequence parallelism (its vocab-parallel embedding's rows)."""
        pos = self.wpe(pos)                                                 # (T, D)
        return _split(pos, 0, self.group) if self.sequence_parallel else pos

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(logits, targets, self.group, self.config.vocab_size)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """`model.GPT`'s keys and shapes, shards gathered over tp and the vocabulary unpadded (collective)."""
        out = {k: v.detach() for k, v in self.state_dict().items()}
        for name, module in self.sharded_modules().items():
            for pname, p in module.named_parameters(recurse=False):
                out[f"{name}.{pname}"] = module.full(p)
        return out


def apply_tensor_parallel(model: GPT, mesh, sequence_parallel: bool = False) -> GPT:
    """Split ``model`` over ``mesh.tp_group``; returns ``model`` itself when tp = 1."""
    group = mesh.tp_group
    if group.size == 1:
        if sequence_parallel:
            raise ValueError("sequence parallelism needs tp > 1")
        return model
    return ParallelGPT(model, group, sequence_parallel)


def sharded_params(module: nn.Module) -> dict[str, nn.Module]:
    """{parameter name: the TP layer it belongs to} for every tp-sharded parameter under ``module``.

    Works on anything holding TP layers: a `ParallelGPT`, or a pipeline chunk of one (whose names are the
    model's). Parameters not listed are replicated over tp (checkpoint boxes: `checkpoint.layout`).
    """
    out = {}
    for name, m in module.named_modules():
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)):
            out[f"{name}.weight"] = m
            if isinstance(m, ColumnParallelLinear) and m.bias is not None:
                out[f"{name}.bias"] = m
    return out


def full_like_param(model: nn.Module, name: str, t: torch.Tensor) -> torch.Tensor:
    """The full-shaped version of ``t``, a tensor shaped like parameter ``name``'s local shard (collective)."""
    module = sharded_params(model).get(name)
    if module is None:
        return t.detach()
    return module.full(t)
