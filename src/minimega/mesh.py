"""The device mesh: which ranks share a data-, context-, tensor- or pipeline-parallel group.

Ranks are laid out on a grid ``arange(world).view(pp, dp, cp, tp)`` with TP innermost, so the ranks of
one tensor-parallel group are neighbours (on a GPU node: the fastest links carry the most traffic,
Megatron-LM's placement), and the context-parallel ring next to them. A rank's coordinates are its
(pp_rank, dp_rank, tp_rank) on that grid, and ``cp_rank`` its place in the ring (cp = 1: the grid is
``view(pp, dp, tp)``).

    world 8, ParallelDims(dp=2, tp=2, pp=2):
        pp stage 0: [[0, 1],    dp row 0: tp group [0, 1]
                     [2, 3]]    dp row 1: tp group [2, 3]     dp groups [0, 2], [1, 3]
        pp stage 1: [[4, 5],
                     [6, 7]]                                  pp groups [0, 4], [1, 5], ...
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .comm import Group


# [Note: how the parallelisms compose]
# Each mesh dimension holds a different part of one global quantity.
#
# A rank holds a piece of the model along each axis of the mesh:
#
#     tp   sharded parameters: a disjoint slice each; replicated ones (LayerNorms, wpe, row-parallel biases)
#          whole on every tp rank
#     pp   disjoint chunks of blocks (the embedding on the first stage, the head on the last)
#     dp   DDP: a full replica each; ZeRO: a disjoint shard of every unit's flat buffer
#
# So a global quantity is assembled by summing over the axes that hold *different* elements and counting
# replicas once:
#
#     ‖∇‖² = Σ_ranks Σ_local params  w · ‖g‖²,  w = 1/tp for tp-replicated parameters, else 1,
#            summed over tp and pp always, and over dp only under ZeRO (DDP's dp replicas are equal);
#     full state dict: ZeRO gathers over dp, TP layers gather over tp (`full_like_param`), then the stages'
#            disjoint dicts are merged over pp.
#
# The norm and the clipping for every layout are `grad_sync.clip_grad_norm_`.
#
# This is the 3D layout BLOOM-176B trained with (arXiv:2211.05100): TP inside a node, PP across nodes,
# ZeRO-1 over data parallel. ZeRO-2 and ZeRO-3 compose with pp too: each chunk accumulates its full
# gradients over the micro-batches (``no_sync``) and reduce-scatters them once, after the last one, so
# gradient traffic is ZeRO-1's; ZeRO-3 still all-gathers each unit's weights in every micro-batch's forward
# and backward (2m gathers of the stage per step), which is why DeepSpeed's pipeline engine refuses it.


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of data, tensor, pipeline and context parallelism; their product is the world size."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    """Context parallelism: each sequence is split over a ring of cp ranks (`minimega.parallel.context`);
    the parameters are replicated over dp·cp and their gradients averaged over it."""
    ep: int = 1
    """Expert parallelism: carved out of dp (not a factor of the world): each group of ep consecutive dp
    ranks splits a mixture-of-experts layer's experts; see `minimega.parallel.moe.layer`."""

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "cp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ParallelDims: {name} must be a positive integer, got {value!r}")
        if self.dp % self.ep:
            raise ValueError(f"ParallelDims(dp={self.dp}, ep={self.ep}): ep is carved out of dp and must divide it "
                             f"(dp % ep = {self.dp % self.ep})")

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    def check(self, world_size: int) -> None:
        """Raise with the arithmetic shown when the layout does not fill the world exactly."""
        if self.world_size != world_size:
            if self.cp > 1:
                raise ValueError(f"ParallelDims(dp={self.dp}, cp={self.cp}, tp={self.tp}, pp={self.pp}): dp*cp*tp*pp = "
                                 f"{self.dp}*{self.cp}*{self.tp}*{self.pp} = {self.world_size} != world size {world_size}")
            raise ValueError(f"ParallelDims(dp={self.dp}, tp={self.tp}, pp={self.pp}): dp*tp*pp = "
                             f"{self.dp}*{self.tp}*{self.pp} = {self.world_size} != world size {world_size}")

    @classmethod
    def infer(cls, world_size: int, tp: int = 1, pp: int = 1, cp: int = 1) -> "ParallelDims":
        """dp is what remains of the world after tp, pp and cp."""
        if world_size % (tp * pp * cp):
            if cp > 1:
                raise ValueError(f"world size {world_size} is not divisible by tp*pp*cp = {tp}*{pp}*{cp} = {tp * pp * cp}")
            raise ValueError(f"world size {world_size} is not divisible by tp*pp = {tp}*{pp} = {tp * pp}")
        return cls(dp=world_size // (tp * pp * cp), tp=tp, pp=pp, cp=cp)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp_rank, dp_rank, tp_rank) of a global rank on the grid view(pp, dp, cp, tp) (`cp_coord`: its cp rank)."""
        return (rank // (self.dp * self.cp * self.tp), (rank // (self.cp * self.tp)) % self.dp, rank % self.tp)

    def cp_coord(self, rank: int) -> int:
        """The cp rank of a global rank: its place in its context-parallel ring."""
        return (rank // self.tp) % self.cp

    def rank_of(self, pp_rank: int, dp_rank: int, tp_rank: int, cp_rank: int = 0) -> int:
        return ((pp_rank * self.dp + dp_rank) * self.cp + cp_rank) * self.tp + tp_rank

    # --8<-- [start:replicas]
    def replicas(self, rank: int, *, tp_sharded: bool, expert: bool = False, dp_sharded: bool = False) -> tuple[int, int]:
        """The placement map: (index, count) of ``rank`` among the ranks holding the same elements of a parameter.

        Every parameter is in one pp stage. Over tp it is sliced (``tp_sharded``: each tp rank other elements) or
        whole on every tp rank. Over the data ranks it is whole on each dp × cp rank, or on each of an expert's
        edp × cp ranks (``expert``), or cut into disjoint shards (``dp_sharded``: ZeRO's flat shards). Checkpoints
        let replica ``index`` of ``count`` write its share; clipping counts each element once.
        """
        pp_rank, dp_rank, tp_rank = self.coords(rank)
        if dp_sharded:
            data = (0, 1)
        elif expert:                                      # the experts' replicas: one of each run of ep dp ranks
            data = (dp_rank // self.ep * self.cp + self.cp_coord(rank), self.dp // self.ep * self.cp)
        else:
            data = (dp_rank * self.cp + self.cp_coord(rank), self.dp * self.cp)
        tp = (0, 1) if tp_sharded else (tp_rank, self.tp)
        return tp[0] * data[1] + data[0], tp[1] * data[1]
    # --8<-- [end:replicas]

    def group_ranks(self, dim: str) -> list[list[int]]:
        """Every group along one mesh dimension ('dp', 'cp', 'tp' or 'pp'), as lists of global ranks.

        'dp_cp' joins dp and cp (the ranks holding the same parameters, dp-major: member dp_rank·cp + cp_rank):
        gradients are averaged, and ZeRO shards, over it. cp = 1: it is the dp group.

        'ep' cuts each dp group into runs of ep consecutive members; 'edp' (expert data parallel) joins the
        members with the same place in their run: dp group [0, 2, 4, 6], ep 2 -> ep [0, 2], [4, 6]; edp [0, 4], [2, 6].
        'edp_cp' joins edp and cp: every rank holding the same experts (cp ranks hold other tokens of the same
        sequences, and the same experts), dp-major like 'dp_cp'; the experts' gradients are summed over it.
        """
        if dim == "edp_cp":
            cp, ep = self.cp, self.ep
            return [[r for i, r in enumerate(row) if (i // cp) % ep == j]
                    for row in self.group_ranks("dp_cp") for j in range(ep)]
        if dim in ("ep", "edp"):
            rows, ep = self.group_ranks("dp"), self.ep
            if dim == "ep":
                return [r[i:i + ep] for r in rows for i in range(0, len(r), ep)]
            return [r[j::ep] for r in rows for j in range(ep)]
        grid = torch.arange(self.world_size).view(self.pp, self.dp, self.cp, self.tp)
        if dim == "dp_cp":
            return [row.tolist() for row in grid.movedim(3, 1).reshape(-1, self.dp * self.cp)]
        axis = {"pp": 0, "dp": 1, "cp": 2, "tp": 3}[dim]
        moved = grid.movedim(axis, -1).reshape(-1, grid.shape[axis])    # (groups, size of dim)
        return [row.tolist() for row in moved]


@dataclass(frozen=True)
class Mesh:
    """One rank's view of the mesh: its coordinates, its groups and its pipeline neighbours."""

    dims: ParallelDims
    rank: int
    backend: str
    device: torch.device
    world: Group
    dp_group: Group
    tp_group: Group
    pp_group: Group
    cp_group: Group | None = None
    """Context parallel: the ring this rank's sequence chunks are attended over; None: size one."""
    dp_cp_group: Group | None = None
    """dp × cp: the ranks holding the same parameters (gradient averaging, ZeRO shards); None: the dp group."""
    ep_group: Group | None = None
    """Expert parallel: this rank's run of ep dp ranks (see `ParallelDims.group_ranks`); None: size one."""
    edp_group: Group | None = None
    """Expert data parallel: the dp ranks holding the same experts; None: the dp group (ep = 1)."""
    edp_cp_group: Group | None = None
    """edp × cp: every rank holding the same experts (the experts' gradients sum over it); None: the edp group."""

    @property
    def world_size(self) -> int:
        return self.dims.world_size

    dp_size = property(lambda self: self.dims.dp)
    tp_size = property(lambda self: self.dims.tp)
    pp_size = property(lambda self: self.dims.pp)
    dp_rank = property(lambda self: self.dims.coords(self.rank)[1])
    tp_rank = property(lambda self: self.dims.coords(self.rank)[2])
    pp_rank = property(lambda self: self.dims.coords(self.rank)[0])
    cp_size = property(lambda self: self.dims.cp)
    cp_rank = property(lambda self: self.dims.cp_coord(self.rank))
    dp_cp_size = property(lambda self: self.dims.dp * self.dims.cp)
    dp_cp_rank = property(lambda self: self.dp_rank * self.dims.cp + self.cp_rank)

    def replicas(self, **kind) -> tuple[int, int]:
        """This rank's place among the holders of the same elements (`ParallelDims.replicas`)."""
        return self.dims.replicas(self.rank, **kind)

    @property
    def grad_group(self) -> Group:
        """The group gradients are averaged (and ZeRO shards) over: dp × cp, the dp group when cp = 1."""
        return self.dp_cp_group if self.dims.cp > 1 else self.dp_group

    @property
    def expert_group(self) -> Group:
        """The group the experts' gradients are summed (and their ZeRO-1 shards split) over: edp × cp."""
        return self.edp_cp_group if self.edp_cp_group is not None else self.edp_group

    ep_size = property(lambda self: self.dims.ep)
    ep_rank = property(lambda self: self.dp_rank % self.dims.ep)

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def pp_prev(self) -> int | None:
        """Global rank of the previous pipeline stage (None on the first stage)."""
        return None if self.is_first_stage else self.pp_group.ranks[self.pp_rank - 1]

    @property
    def pp_next(self) -> int | None:
        """Global rank of the next pipeline stage (None on the last stage)."""
        return None if self.is_last_stage else self.pp_group.ranks[self.pp_rank + 1]

    def __repr__(self) -> str:
        cp = f", cp={self.cp_rank}/{self.cp_size}" if self.cp_size > 1 else ""
        return (f"Mesh(rank={self.rank}, dp={self.dp_rank}/{self.dp_size}{cp}, tp={self.tp_rank}/{self.tp_size}, "
                f"pp={self.pp_rank}/{self.pp_size}, backend={self.backend})")


def init_mesh(dims: ParallelDims | None = None, device: torch.device | str | None = None) -> Mesh:
    """Build this rank's mesh; every rank must call it (group creation is collective).

    Without an initialised process group only ``ParallelDims()`` (one rank) is accepted: the single-process
    reference run uses the same code paths with groups of size one. ``device``: where the engine puts this
    rank's tensors; default the CPU, or the rank's GPU under nccl. ``"meta"`` builds and steps the engine
    with shapes and no storage (`minimega dry-run`, on a fake process group).
    """
    dims = dims or ParallelDims()
    if not dist.is_initialized():
        dims.check(1)
        device = torch.device(device or "cpu")
        solo = Group(None, [0], "world")
        return Mesh(dims, 0, "none", device, solo, Group(None, [0], "dp"), Group(None, [0], "tp"),
                    Group(None, [0], "pp"), Group(None, [0], "cp"), Group(None, [0], "dp_cp"),
                    Group(None, [0], "ep"), Group(None, [0], "edp"), Group(None, [0], "edp_cp"))
    world, rank = dist.get_world_size(), dist.get_rank()
    dims.check(world)
    backend = dist.get_backend()
    if device is not None:
        device = torch.device(device)
    elif backend == "nccl":             # LOCAL_RANK, not rank % GPUs: right on every node of a multi-node job
        from .run.launch import local_device_index
        device = torch.device("cuda", local_device_index(rank))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    groups = {}
    # --8<-- [start:tour_groups]
    for dim in ("dp", "tp", "pp") + (("cp", "dp_cp") if dims.cp > 1 else ()) + (("ep", "edp") if dims.ep > 1 else ()) \
            + (("edp_cp",) if dims.cp > 1 and dims.ep > 1 else ()):
        for ranks in dims.group_ranks(dim):
            # Every rank creates every group in the same order; size-one groups need no process group.
            pg = dist.new_group(ranks) if len(ranks) > 1 else None
            if rank in ranks:
                groups[dim] = Group(pg, ranks, dim)
    # --8<-- [end:tour_groups]
    world_group = Group(dist.group.WORLD if world > 1 else None, list(range(world)), "world")
    ep = groups.get("ep", Group(None, [rank], "ep"))
    edp = groups.get("edp", Group(groups["dp"].pg, groups["dp"].ranks, "edp"))
    cp = groups.get("cp", Group(None, [rank], "cp"))
    dp_cp = groups.get("dp_cp", Group(groups["dp"].pg, groups["dp"].ranks, "dp_cp"))
    edp_cp = groups.get("edp_cp", Group(dp_cp.pg, dp_cp.ranks, "edp_cp") if dims.ep == 1 else edp)   # ep 1: dp × cp
    return Mesh(dims, rank, backend, device, world_group, groups["dp"], groups["tp"], groups["pp"], cp, dp_cp, ep, edp,
                edp_cp)
