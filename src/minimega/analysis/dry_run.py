"""The dry run: the real engine for one rank of a large layout, built and stepped without the GPUs.

One process stands in for global rank r of a dp × tp × pp job: a fake process group (torch's
``FakeProcessGroup``: every collective returns at once and moves nothing) gives it the world it expects,
and meta tensors (shapes and dtypes, no storage) give it a model of any size. Everything else is the
engine's own code, as in training: the tensor-parallel split and the vocabulary's padding, the pipeline's
stage assignment and its schedule, ZeRO's flat padded buffers and shards, the optimizer's states, activation
checkpointing, one `Engine.train_step`. What comes back is what the engine itself records for that rank:
its bytes by category (`Engine.report()["memory_peak"]`, the categories of `measure.CATEGORIES`) and the
collectives of the step with their sizes (`comm.CommLog`, ring-model bytes).

So a padding, divisibility or placement rule that only bites at dp 8 × tp 4 × pp 12 shows here, and its
numbers can be held against the estimators (`layout.py`): two independent accounts of the same rank.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..comm import CommLog
from ..config import GPTConfig, TrainConfig
from ..train.engine import initialize
from ..mesh import ParallelDims, init_mesh
from ..model import GPT

BACKEND = "minimega_dry_run"
_RECORDS = 2_000_000          # collectives one step may issue (BLOOM's pp rank 0: about 5,000)
# TrainConfig fields `layout` does not model, with the value it assumes (ZeRO-3's persistent units, offload)
_UNMODELLED = {"param_persistence_threshold": 0, "offload_optimizer": False, "virtual_stages": 1}


def _fake_backend() -> str:
    """Register torch's fake process group for CPU and meta tensors (torch's own "fake" backend leaves out
    meta, which its point-to-point path needs) under `BACKEND`, once."""
    if not hasattr(dist.Backend, BACKEND.upper()):
        from torch._C._distributed_c10d import FakeProcessGroup

        def create(common, options):
            return FakeProcessGroup._create_internal(common.group_rank, common.group_size, options)
        dist.Backend.register_backend(BACKEND, create, extended_api=True, devices=["cpu", "meta"])
    return BACKEND


def sample_ranks(dims: ParallelDims) -> list[int]:
    """A sample that covers every kind of rank: the first and last pipeline stage at the first tp and dp rank,
    and the last stage at the last tp and dp rank (the one holding the vocabulary's padded tail)."""
    last = dims.pp - 1
    ranks = [dims.rank_of(0, 0, 0), dims.rank_of(last, 0, 0), dims.rank_of(last, dims.dp - 1, dims.tp - 1)]
    return sorted(set(ranks))


def dry_run(model: GPTConfig, config: TrainConfig, dims: ParallelDims, rank: int = 0) -> dict:
    """Build the engine for global rank ``rank`` of ``dims`` on meta tensors, run one training step, report.

    Returns {'rank', 'coords' (pp, dp, tp), 'params' (elements this rank holds), 'memory_peak' (bytes by
    category), 'comm' ({group: {op: {calls, bytes, sent_bytes}}}, the step's collectives), 'seconds'}.
    """
    if dist.is_initialized():
        raise RuntimeError("dry_run: a process group is already initialised in this process; run the dry run "
                           "in a process of its own (it builds a fake world of its own)")
    if not 0 <= rank < dims.world_size:
        raise ValueError(f"dry_run: rank {rank} is outside the world of {dims.world_size} ranks")
    start = time.perf_counter()
    # --8<-- [start:dry_run]
    dist.init_process_group(_fake_backend(), store=dist.HashStore(), rank=rank, world_size=dims.world_size)
    try:
        mesh = init_mesh(dims, device="meta")
        with torch.device("meta"):
            reference = GPT(model)
        engine = initialize(reference, config, mesh)
        del reference
        seq = config.seq_len or model.block_size
        rows = torch.zeros((config.batch_size // dims.dp, seq), dtype=torch.long, device="meta")
        engine.comm_log = CommLog(window=_RECORDS)       # every record of the step kept, by group and op
        engine.train_step((rows, rows))
        # --8<-- [end:dry_run]
        report = engine.report()
        held = sum(p.numel() for part in engine.parts for p in part.parameters())
    finally:
        dist.destroy_process_group()
    if report["comm"]["calls"] > _RECORDS:
        raise RuntimeError(f"dry_run: the step issued {report['comm']['calls']} collectives, more than the "
                           f"{_RECORDS} kept")
    comm: dict = {}
    for record in engine.comm_log.records:
        row = comm.setdefault(record.group, {}).setdefault(record.op, {"calls": 0, "bytes": 0, "sent_bytes": 0.0})
        row["calls"] += 1
        row["bytes"] += record.bytes
        row["sent_bytes"] += record.sent_bytes
    return {"rank": rank, "coords": dims.coords(rank), "params": held,
            "memory_peak": {k: v for k, v in report["memory_peak"].items() if k != "at_peak_total"},
            "comm": comm, "sent_bytes": report["comm"]["sent_bytes"], "seconds": time.perf_counter() - start}


def check_rank(shape: dict, config: TrainConfig, dims: ParallelDims, rank: int = 0) -> dict:
    """`dry_run` of one rank next to `layout`'s account of it: {..., 'estimate': {'memory', 'comm'}, 'differs'}.

    ``differs`` lists every model-state category and every group whose bytes are not equal (empty: they agree).
    ZeRO 0-3 are modelled; settings `layout` does not model are refused by name before anything is built.
    """
    unmodelled = [f"{k}={getattr(config, k)!r}" for k, off in _UNMODELLED.items() if getattr(config, k) != off]
    if unmodelled:
        raise ValueError(f"check_rank: {', '.join(unmodelled)} is not in analysis.layout's model of a rank; "
                         f"compare with {', '.join(f'{k}={v!r}' for k, v in _UNMODELLED.items())}")
    got = dry_run(GPTConfig(**shape), config, dims, rank)
    estimate = rank_estimate(shape, config, dims, got["coords"][0])
    memory, comm = estimate["memory"], estimate["comm"]
    sent = {g: sum(row["sent_bytes"] for row in ops.values()) for g, ops in got["comm"].items()}
    differs = [k for k, v in memory.items() if got["memory_peak"][k] != v]
    differs += [f"comm:{g}" for g in sorted(set(comm) | set(sent))
                if abs(sent.get(g, 0.0) - comm.get(g, 0.0)) > 1e-9 * max(1.0, comm.get(g, 0.0))]   # float sums of (n-1)/n
    return {**got, "comm_sent": sent, "estimate": estimate, "differs": differs}


def rank_estimate(shape: dict, config: TrainConfig, dims: ParallelDims, pp_rank: int) -> dict:
    """`layout`'s account of a rank on pipeline stage ``pp_rank``: {'memory': model-state bytes by category,
    'comm': bytes sent per group}, from the layout's integers alone (what `check_rank` holds the dry run against)."""
    from . import layout
    units = layout.rank_units(shape, dims.tp, dims.pp, pp_rank, config.virtual_stages)
    steps = config.micro_batches if dims.pp > 1 else config.gradient_accumulation_steps
    seq = config.seq_len or shape["block_size"]
    message = config.batch_size // dims.dp // steps * seq * shape["n_embd"] * layout.ELEM_BYTES[config.precision]
    memory = layout.rank_memory(units, dims.dp, config.zero_stage, config.precision, tp=dims.tp, pp=dims.pp,
                                pp_rank=pp_rank, message_bytes=message, in_flight=config.reductions_in_flight,
                                overlap=config.overlap_comm, accumulation=config.gradient_accumulation_steps,
                                prefetch=config.prefetch, micro_batches=config.micro_batches)
    comm = layout.rank_comm(shape, units, dp=dims.dp, tp=dims.tp, pp=dims.pp, pp_rank=pp_rank,
                            zero_stage=config.zero_stage, precision=config.precision, batch_size=config.batch_size,
                            micro_batches=config.micro_batches, gradient_accumulation_steps=config.gradient_accumulation_steps,
                            recompute=config.activation_checkpointing)
    return {"memory": memory, "comm": comm}


def verify_pick(model: dict, pick: dict) -> dict:
    """Dry-run one `plan` pick (a row's ``config``) on one sampled rank: `check_rank` of the last sampled rank
    (last stage, last tp and dp rank: the padded vocabulary's tail), or {'skipped': why} for a pick the engine's
    dry run or `layout` cannot build as planned. ``model``: the planner's shape (layers, hidden, heads, vocab,
    seq_len, ...), run as minimega's GPT (`layout.gpt_shape`: learned positions, untied head, biases). A Llama-shaped
    pick (kv_heads, mlp='swiglu') is not run: the planner's model names no RoPE base nor its norms (use
    ``minimega dry-run --model llama3-405b`` for Llama 3's published layout)."""
    from .layout import gpt_shape
    unsupported = [f"{k}={model[k]!r}" for k, ok in (("kv_heads", model.get("heads")), ("mlp", "gelu"))
                   if model.get(k) not in (None, ok)]
    engine = {"cp": (1,), "experts": (0,), "schedule": ("1f1b", "gpipe"), "precision": ("bf16", "fp32")}
    unsupported += [f"{k}={pick[k]!r}" for k, ok in engine.items() if k in pick and pick[k] not in ok]
    if unsupported:
        return {"skipped": f"{', '.join(unsupported)} is not dry-run by plan --verify (GPT's blocks, cp 1, no experts, "
                           f"gpipe or 1f1b, bf16 or fp32)"}
    dp, tp, pp = pick["dp"], pick["tp"], pick["pp"]
    steps = pick["global_batch"] // (dp * pick["micro_batch"])
    split = dict(micro_batches=steps, schedule=pick["schedule"]) if pp > 1 else dict(gradient_accumulation_steps=steps)
    config = TrainConfig(tp=tp, pp=pp, zero_stage=pick["zero_stage"], precision=pick["precision"],
                         batch_size=pick["global_batch"], activation_checkpointing=pick["recompute"],
                         sequence_parallel=bool(pick.get("sp")), **split)
    dims = ParallelDims(dp=dp, tp=tp, pp=pp)
    got = check_rank(gpt_shape(model), config, dims, sample_ranks(dims)[-1])
    states = [k for k in got["estimate"]["memory"]]
    return {**got, "model_state_bytes": (sum(got["memory_peak"][k] for k in states),
                                         sum(got["estimate"]["memory"].values())),
            "comm_bytes": (sum(got["comm_sent"].values()), sum(got["estimate"]["comm"].values()))}
