"""Where this rank's training state sits in `model.py`'s layout-free tensors: boxes in global coordinates.

Every tensor of the checkpoint is a *global* tensor named ``"<kind>/<model.py key>"``: ``param/…`` for the
fp32 weight, ``exp_avg/…``, ``exp_avg_sq/…``, ``step/…`` (…) for each optimizer state. A rank holds pieces
of some of them. A piece is a *box* of the global tensor (``offsets``, ``lengths`` per dimension, as
torch DCP's chunks) together with a view of the rank's own memory holding exactly that box:

    ZeRO      a unit's shard is a range of its flat buffer; the range cuts each parameter's flattened
              (local) tensor into a partial row, whole rows and a partial row: up to 3 boxes per cut.
    TP        a local box maps to global boxes: column-parallel rows are offset by the rank (per stacked
              block for qkv, padding rows of the vocabulary dropped); row-parallel columns are offset;
              vocab-parallel rows are offset and clipped to the vocabulary.
    PP        a stage holds only its chunks' parameters.
    replicas  a tensor held whole by several ranks (DDP's dp group, a tp-replicated LayerNorm) is
              written by all of them, each a disjoint 1/n of its elements, so that no byte is written twice.

Saving writes these pieces as they are (views: nothing is gathered, nothing copied but the bytes
on their way to the file). Loading asks the same question for the *new* layout, without the replica
split (every replica needs the whole tensor), and reads exactly those boxes (`plan.py`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from ..parallel.tensor import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, sharded_params
from ..zero import state as zero_state
from ..zero.state import Entry


@dataclass(frozen=True)
class Box:
    """A hyper-rectangle of a global tensor: ``offsets`` and ``lengths`` per dimension (both () for a scalar)."""

    offsets: tuple[int, ...]
    lengths: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.lengths)

    def intersect(self, other: "Box") -> "Box | None":
        lo = tuple(max(a, b) for a, b in zip(self.offsets, other.offsets))
        hi = tuple(min(a + n, b + m) for a, n, b, m in zip(self.offsets, self.lengths, other.offsets, other.lengths))
        if any(h <= l for l, h in zip(lo, hi)):
            return None
        return Box(lo, tuple(h - l for l, h in zip(lo, hi)))

    def slices(self, within: "Box") -> tuple[slice, ...]:
        """This box as slices of a tensor that holds ``within`` (which must contain it)."""
        return tuple(slice(o - w, o - w + n) for o, n, w in zip(self.offsets, self.lengths, within.offsets))


@dataclass
class Piece:
    """A box of global tensor ``name`` and the rank's memory holding it (a view shaped ``box.lengths``)."""

    name: str
    box: Box
    data: torch.Tensor


# --8<-- [start:flat_range_boxes]
def flat_range_boxes(shape: tuple[int, ...], lo: int, hi: int) -> list[tuple[int, int, Box]]:
    """Cut the flat (row-major) range ``[lo, hi)`` of a tensor shaped ``shape`` into boxes.

    Returns ``(flat_lo, flat_hi, box)`` triples in order; each box is contiguous in memory, so a 1-D
    slice of a flat buffer reshapes into it without a copy. A range inside one row is one box; in
    general a partial leading row, a block of whole rows and a partial trailing row (recursively).
    """
    if not shape:
        return [(0, 1, Box((), ()))] if lo < hi else []
    inner = math.prod(shape[1:])
    out: list[tuple[int, int, Box]] = []

    def lift(sub, row):             # a box of row `row`'s sub-tensor, as a box of the whole tensor
        f0, f1, b = sub
        return (row * inner + f0, row * inner + f1, Box((row, *b.offsets), (1, *b.lengths)))

    first, last = lo // inner, (hi - 1) // inner
    if lo % inner and first == last:                       # inside one row
        return [lift(s, first) for s in flat_range_boxes(shape[1:], lo % inner, hi - first * inner)]
    if lo % inner:                                         # partial leading row
        out += [lift(s, first) for s in flat_range_boxes(shape[1:], lo % inner, inner)]
        first += 1
    full_end = hi // inner                                 # rows [first, full_end) are whole
    if full_end > first:
        out.append((first * inner, full_end * inner,
                    Box((first, *[0] * (len(shape) - 1)), (full_end - first, *shape[1:]))))
    if hi % inner and full_end >= first:                   # partial trailing row
        out += [lift(s, full_end) for s in flat_range_boxes(shape[1:], 0, hi - full_end * inner)]
    return out
# --8<-- [end:flat_range_boxes]


# --8<-- [start:tp_maps]
def _dim_maps(module, local_shape: tuple[int, ...]):
    """Per dimension, ``(lo, hi) -> [(local_lo, local_hi, global_lo)]``: where local indices live globally."""
    def same(lo, hi):
        return [(lo, hi, lo)]
    maps = [same] * len(local_shape)
    if module is None:
        return maps
    if getattr(module, "own_grad_sync", False):              # MoE experts: rows [offset, offset + E/ep) of E
        maps[0] = lambda lo, hi: [(lo, hi, lo + module.offset)]
        return maps
    rank = module.group.rank
    if isinstance(module, ColumnParallelLinear):           # rows; per stacked block ([q; k; v]); padded vocab
        tp = module.group.size
        spans, local, glob = [], 0, 0                      # (local start, global start, this rank's rows) per block
        for rows_j in module.blocks:
            spans.append((local, glob + rank * (rows_j // tp), rows_j // tp))
            local, glob = local + rows_j // tp, glob + rows_j

        def rows(lo, hi):
            out = []
            for start, g0, n in spans:
                a, b = max(lo, start), min(hi, start + n)
                g = g0 + (a - start)
                b = min(b, a + module.out_features - g)        # rows past out_features are padding
                if b > a:
                    out.append((a, b, g))
            return out
        maps[0] = rows
    elif isinstance(module, RowParallelLinear):             # columns of the weight (the bias is not sharded)
        cols = local_shape[1]
        maps[1] = lambda lo, hi: [(lo, hi, lo + rank * cols)]
    elif isinstance(module, VocabParallelEmbedding):        # rows of the padded vocabulary
        def vocab(lo, hi):
            hi = min(hi, module.num_embeddings - module.start)
            return [(lo, hi, module.start + lo)] if hi > lo else []
        maps[0] = vocab
    return maps
# --8<-- [end:tp_maps]


def global_pieces(name: str, module, data: torch.Tensor, local_shape: tuple[int, ...], lo: int, hi: int) -> list[Piece]:
    """The pieces of global tensor ``name`` held by ``data``: elements ``[lo, hi)`` of a local tensor.

    Args:
        module: the TP layer the parameter belongs to (None when it is not tp-sharded).
        data: a 1-D tensor of ``hi - lo`` elements (a view into the rank's memory).
        local_shape: the shape of the rank's local tensor (the TP slice) whose flat range ``data`` holds.
    """
    out = []
    maps = _dim_maps(module, local_shape)
    for f0, f1, box in flat_range_boxes(local_shape, lo, hi):
        block = data[f0 - lo:f1 - lo].view(box.lengths)
        per_dim = [m(o, o + n) for m, o, n in zip(maps, box.offsets, box.lengths)]
        for segs in itertools.product(*per_dim):
            local = tuple(slice(a - o, b - o) for (a, b, _), o in zip(segs, box.offsets))
            out.append(Piece(name, Box(tuple(g for _, _, g in segs), tuple(b - a for a, b, _ in segs)),
                             block[local]))
    return out


def split_range(lo: int, hi: int, index: int, count: int) -> tuple[int, int]:
    """Replica ``index`` of ``count``'s disjoint share of ``[lo, hi)`` (what it writes of a replicated tensor)."""
    n = hi - lo
    return lo + n * index // count, lo + n * (index + 1) // count


# ---- the engine's state as local tensors ------------------------------------------------------------

@dataclass
class Local(Entry):
    """One local tensor (or a flat range of one) of the engine and where it belongs: a ZeRO `Entry`
    (elements ``[lo, hi)`` of a local tensor shaped ``local_shape``, held in ``data``) plus ``module``, the TP
    layer of parameter ``key`` (or None), and ``replicas`` (index, count): how many ranks hold the same
    elements. A 0-d optimizer state (Adam's step) has ``local_shape == ()``.
    """

    module: object
    replicas: tuple[int, int]

    @property
    def name(self) -> str:
        return f"{self.kind}/{self.key}"


def engine_locals(engine) -> list[Local]:
    """Every local tensor this rank holds: fp32 weights and optimizer states, under any layout.

    ZeRO wrappers describe their own shards (`zero.state.local_entries`); otherwise each parameter is
    held whole (its TP slice), next to its torch optimizer state.
    """
    mesh, out = engine.mesh, []
    for part, wrapper in engine.holders():
        tp_of = sharded_params(part)
        tp_rep = mesh.replicas(tp_sharded=False, dp_sharded=True)    # a ZeRO shard of a parameter whole over tp
        experts = {}                                   # MoE: expert tensors, held by the edp replicas
        if engine.experts is not None:
            experts = {n: m for n, m in part.named_modules() if getattr(m, "own_grad_sync", False)}
            edp_rep = mesh.replicas(tp_sharded=False, expert=True)      # edp × cp, times tp (experts are whole)
            sharded = hasattr(engine.experts, "units")  # ZeRO-1 over edp: disjoint flat shards, replicas over tp
            for e in zero_state.local_entries(engine.experts) if sharded else ():
                out.append(Local(e.kind, e.key, e.data, e.local_shape, e.lo, e.hi,
                                 experts[e.key.rsplit(".", 1)[0]], tp_rep))
            for key, p in () if sharded else part.named_parameters():     # stage 0: the engine's optimizer
                module = experts.get(key.rsplit(".", 1)[0])
                if module is None:
                    continue
                for kind, t in [("param", p.detach())] + sorted(engine.optimizer.state.get(p, {}).items()):
                    shape = () if t.dim() == 0 else tuple(p.shape)
                    out.append(Local(kind, key, t.detach().reshape(-1) if shape else t.detach(), shape, 0,
                                     p.numel() if shape else 1, module, edp_rep))
        if wrapper is not None:
            for e in zero_state.local_entries(wrapper):
                module = tp_of.get(e.key)
                out.append(Local(e.kind, e.key, e.data, e.local_shape, e.lo, e.hi, module,
                                 mesh.replicas(tp_sharded=module is not None, dp_sharded=True)))
            continue
        for key, p in part.named_parameters():
            if key.rsplit(".", 1)[0] in experts:
                continue
            module = tp_of.get(key)
            rep = mesh.replicas(tp_sharded=module is not None)          # dp × cp replicas, times tp if whole
            opt = engine.optimizer.state.get(p, {})
            for kind, t in [("param", p.detach())] + sorted(opt.items()):
                if t.dim() == 0:
                    out.append(Local(kind, key, t.detach(), (), 0, 1, module, rep))
                else:
                    out.append(Local(kind, key, t.detach().reshape(-1), tuple(p.shape), 0, p.numel(), module, rep))
    return out


def pieces(locals_: list[Local], for_save: bool) -> list[Piece]:
    """The boxes of global tensors these local tensors hold (``for_save``: each replica only its share)."""
    out: list[Piece] = []
    scalars: list[Local] = []
    firsts: set[str] = set()                           # params whose global element 0 this rank writes
    for loc in locals_:
        if not loc.local_shape:
            scalars.append(loc)
            continue
        lo, hi = loc.lo, loc.hi
        if for_save:
            lo, hi = split_range(lo, hi, *loc.replicas)
        ps = global_pieces(loc.name, loc.module, loc.data[lo - loc.lo:hi - loc.lo], loc.local_shape, lo, hi)
        if any(not any(p.box.offsets) for p in ps):
            firsts.add(loc.key)
        out += ps
    for loc in scalars:                                 # 0-d states: written once, by the holder of element 0
        if not for_save or loc.key in firsts:
            out.append(Piece(loc.name, Box((), ()), loc.data.reshape(())))
    return out
