"""`minimega record`: run small real jobs and keep what they measured as JSON traces for the course.

Each trace comes from 2 gloo ranks training the tiny GPT for a few steps through `minimega.run.launch`:

    ddp-overlap.json    DDP (dp = 2): when each gradient bucket's all-reduce was issued, against the
                        forward, backward and optimizer of every step on every rank, and its bytes
    memory.json         bytes each rank holds by category (parameters, gradients, optimizer states) under
                        DDP and under tensor parallelism, after a step and after a backward
    tp-comm.json        tensor parallelism (tp = 2, with and without sequence parallelism): bytes each rank
                        sends per step, by layer (embedding, block i, head, loss), direction and collective
    activations.json    bytes one block keeps for backward, measured with ``saved_tensors_hooks``, against
                        `estimate.gpt_activation_bytes_per_layer`, for no / selective / full recomputation
    zero-memory.json    bytes each rank holds by category at the optimizer step under DDP and ZeRO stages
                        1, 2, 3 (dp = 2, fp32 AdamW), with each unit's element count for the padding rule
    zero-prefetch.json  ZeRO-3 (dp = 2): per unit and step, when its all-gather was issued and waited on,
                        against the unit's forward span (the next unit's gather starts before it ends)
    pipeline.json       pp = 2, m = 4 under GPipe and 1F1B: each rank's forward, backward and p2p spans
                        per step, its slot grid, and its idle slots
    comm-wire.json      bytes each rank really sends (TCP payload, `measure.wire_bytes`) per all-reduce,
                        reduce-scatter and all-gather at 2 and 4 ranks and several sizes, against the
                        ring model (`estimate.ring_bytes`, the algorithmic bytes `CommLog` reports)

The site draws its recorded-run figures from these files (``recorded.py``): the build needs no process group.
Byte counts are exact and repeat run to run; times (ms from each step's forward) do not, but the schema does.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch

from .traces import DEFAULT_OUT, TRACES

SCHEMA = 1
WORLD = 2
WIRE_RANKS = (2, 4)
WIRE_NUMELS = tuple(2 ** k for k in (10, 12, 14, 16, 18, 20))     # fp32 elements: 4 KiB to 4 MiB
BATCH, SEED = 8, 1
ACT_BATCH, ACT_DROPOUT = 4, 0.1
PP_MICRO = 4


def _ms(t: float, t0: float) -> float:
    return round((t - t0) * 1e3, 3)


def _memory_pair(engine, mesh, seq: int, steps: int) -> dict:
    """report()["memory"] after the last step, and again after one more forward/backward (gradients held)."""
    from .. import data
    after_step = engine.report()["memory"]
    x, y = next(data.batches(mesh, 1, BATCH, seq, seed=SEED, start=steps))
    _, loss = engine.wrapper(x, y)
    loss.backward()
    after_backward = engine.report()["memory"]
    engine.optimizer.zero_grad(set_to_none=True)
    return {"rank": mesh.rank, "local_params": sum(p.numel() for p in engine.model.parameters()),
            "after_step": after_step, "after_backward": after_backward}


# ------------------------------------------------------------------------------------------------
# DDP: bucket all-reduces against the backward

def ddp_worker(steps: int, bucket_mb: float) -> dict:
    """One rank of a dp = 2 run; returns its timeline per step, its buckets and its memory."""
    from .. import data
    from ..config import GPTConfig, TrainConfig
    from ..train.engine import initialize
    from ..mesh import ParallelDims, init_mesh
    from ..model import GPT

    mesh = init_mesh(ParallelDims(dp=WORLD))
    model_config = GPTConfig.tiny()
    config = TrainConfig(batch_size=BATCH, seed=SEED, bucket_mb=bucket_mb)
    torch.manual_seed(config.seed)
    model = GPT(model_config)
    n_params = model.num_params()
    engine = initialize(model, config, mesh)
    seq = model_config.block_size
    for batch in data.batches(mesh, steps, BATCH, seq, seed=SEED):
        engine.train_step(batch)
    rep = engine.report()
    names = {id(p): n for n, p in engine.model.named_parameters()}
    buckets = [{"index": b.index, "numel": b.numel, "params": [names[id(p)] for p in b.params]}
               for b in engine.wrapper.buckets]
    events = sorted(rep["timeline"], key=lambda e: e["time"])
    comm = [e for e in rep["comm_events"] if e["op"] == "all_reduce" and e["tag"].startswith("bucket")]
    out_steps = []
    for k in range(steps):
        own = [e for e in events if e.get("step") == k]
        t0 = next(e["time"] for e in own if e["event"] == "forward_start")
        t1 = next(e["time"] for e in own if e["event"] == "optimizer_step_end")
        at = {e["event"]: e["time"] for e in own}
        inside = [e for e in events if "step" not in e and t0 <= e["time"] <= t1]
        issued = {e["bucket"]: e["time"] for e in inside if e["event"] == "all_reduce_issued"}
        synced = next(e["time"] for e in inside if e["event"] == "grads_synced")
        records = [c for c in comm if t0 <= c["start"] <= t1]
        out_steps.append({
            "step": k, "forward_start": 0.0, "backward_start": _ms(at["backward_start"], t0),
            "backward_end": _ms(at["backward_end"], t0), "grads_synced": _ms(synced, t0),
            "optimizer_step_end": _ms(t1, t0),
            "buckets": [{"index": i, "issued": _ms(issued[i], t0), "waited": _ms(c["end"], t0),
                         "elements": c["elements"], "bytes": c["bytes"], "sent_bytes": c["sent_bytes"]}
                        for c in records for i in [int(c["tag"].removeprefix("bucket"))]],
        })
    memory = _memory_pair(engine, mesh, seq, steps)
    return {"rank": mesh.rank, "n_params": n_params, "buckets": buckets, "steps": out_steps,
            "sent_bytes_per_step": rep["comm_per_step"], "memory": memory}


# ------------------------------------------------------------------------------------------------
# Tensor parallelism: communication per layer, and saved activations

def _region_marks(module) -> list[dict]:
    """Hooks that stamp when each block's forward and backward start and end (into the returned list)."""
    import time
    marks: list[dict] = []

    def mark(i, phase, edge):
        marks.append({"block": i, "phase": phase, "edge": edge, "time": time.perf_counter()})
    for i, block in enumerate(module.blocks):
        block.register_forward_pre_hook(lambda m, a, i=i: mark(i, "forward", "start"))
        block.register_forward_hook(lambda m, a, o, i=i: mark(i, "forward", "end"))
        block.register_full_backward_pre_hook(lambda m, g, i=i: mark(i, "backward", "start"))
        block.register_full_backward_hook(lambda m, gi, go, i=i: mark(i, "backward", "end"))
    return marks


def _windows(marks: list[dict]) -> list[tuple[int, str, float, float]]:
    """(block, phase, start, end) from the stamps, pairing each start with the next end of that block."""
    open_, out = {}, []
    for m in marks:
        key = (m["block"], m["phase"])
        if m["edge"] == "start":
            open_[key] = m["time"]
        else:
            out.append((*key, open_.pop(key), m["time"]))
    return out


def _attribute(events: list[dict], windows, timeline: list[dict]) -> list[dict]:
    """Each collective → (region, phase). Block windows by time; outside them, the embedding talks before
    block 0 in the forward and after it in the backward, the head in between; the loss by its tag."""
    steps = defaultdict(dict)
    for e in timeline:
        if "step" in e:
            steps[e["step"]][e["event"]] = e["time"]
    rows = []
    for ev in events:
        t = ev["start"]
        step = next(s for s, at in steps.items() if at["forward_start"] <= t <= at["optimizer_step_end"])
        phase = "forward" if t < steps[step]["backward_start"] else "backward"
        if ev["tag"] == "vocab_ce":
            region = "loss"
        elif ev["tag"] == "sp_grad":
            region = "replicated grads"
        else:
            inside = [w for w in windows if w[1] == phase and w[2] <= t <= w[3]]
            if inside:
                region = f"block {min(inside, key=lambda w: w[3] - w[2])[0]}"
            else:
                block0 = [w for w in windows if w[0] == 0 and w[1] == phase
                          and steps[step]["forward_start"] <= w[2] <= steps[step]["optimizer_step_end"]][0]
                before = t < block0[2]
                region = "embedding" if before == (phase == "forward") else "head"
        rows.append({"region": region, "phase": phase, "op": ev["op"], "elements": ev["elements"],
                     "sent_bytes": ev["sent_bytes"]})
    return rows


def _per_step(rows: list[dict], steps: int) -> list[dict]:
    table = defaultdict(lambda: {"calls": 0, "elements": 0, "sent_bytes": 0.0})
    for r in rows:
        t = table[(r["region"], r["phase"], r["op"])]
        t["calls"] += 1
        t["elements"] += r["elements"]
        t["sent_bytes"] += r["sent_bytes"]
    order = {"embedding": -1, "head": 1000, "loss": 1001, "replicated grads": 1002}

    def key(k):
        region = k[0]
        return (order.get(region, int(region.split()[-1]) if region.startswith("block") else 999), k[1] != "forward", k[2])
    return [{"region": k[0], "phase": k[1], "op": k[2], "calls": v["calls"] // steps,
             "elements": v["elements"] // steps, "sent_bytes": v["sent_bytes"] / steps}
            for k, v in sorted(table.items(), key=lambda kv: key(kv[0]))]


def _saved_bytes(mesh, tp: int, sp: bool, mode: str) -> int:
    """Bytes block 0 keeps for backward on a (ACT_BATCH, T, D) input (T/tp rows of it under sequence parallelism)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..train.activation_checkpoint import apply_activation_checkpointing, saved_activation_bytes
    from ..config import GPTConfig
    from ..model import GPT
    from ..parallel.tensor import apply_tensor_parallel

    cfg = GPTConfig.tiny(dropout=ACT_DROPOUT)
    torch.manual_seed(SEED)
    model = GPT(cfg)
    if tp > 1:
        model = apply_tensor_parallel(model, mesh, sp)
    apply_activation_checkpointing(model, mode)
    model.train()
    x = torch.randn(ACT_BATCH, cfg.block_size, cfg.n_embd)
    if sp:
        x = x.chunk(tp, 1)[mesh.tp_rank]
    x = x.contiguous().requires_grad_()
    with sdpa_kernel(SDPBackend.MATH):          # the unfused core: the s² terms selective recomputation drops
        return saved_activation_bytes(model.blocks[0], x)


def tp_worker(steps: int, sequence_parallel: bool, activations: bool) -> dict:
    """One rank of a tp = 2 run: its collectives by layer per step, its memory, and (optionally) saved bytes."""
    from .. import data
    from ..config import GPTConfig, TrainConfig
    from ..train.engine import initialize
    from ..mesh import ParallelDims, init_mesh
    from ..model import GPT

    mesh = init_mesh(ParallelDims(tp=WORLD))
    model_config = GPTConfig.tiny()
    config = TrainConfig(batch_size=BATCH, seed=SEED, tp=WORLD, sequence_parallel=sequence_parallel)
    torch.manual_seed(config.seed)
    engine = initialize(GPT(model_config), config, mesh)
    marks = _region_marks(engine.model)
    seq = model_config.block_size
    for batch in data.batches(mesh, steps, BATCH, seq, seed=SEED):
        engine.train_step(batch)
    rep = engine.report()
    rows = _attribute(rep["comm_events"], _windows(marks), rep["timeline"])
    out = {"rank": mesh.rank, "per_step": _per_step(rows, steps), "sent_bytes_per_step": rep["comm_per_step"]}
    out["memory"] = _memory_pair(engine, mesh, seq, steps)
    if activations:
        out["activations"] = [{"tp": t, "sp": sp, "mode": mode, "measured": _saved_bytes(mesh, t, sp, mode)}
                              for t, sp in ((1, False), (WORLD, False), (WORLD, True))
                              for mode in ("none", "selective", "full")]
    return out


# ------------------------------------------------------------------------------------------------
# ZeRO: memory by category per stage, and ZeRO-3's prefetch

def zero_worker(steps: int, stage: int) -> dict:
    """One rank of a dp = 2 run at ZeRO ``stage`` (0 = DDP): memory at the step, units, and (stage 3) prefetch."""
    from .. import data
    from ..config import GPTConfig, TrainConfig
    from ..train.engine import initialize
    from ..mesh import ParallelDims, init_mesh
    from ..model import GPT

    mesh = init_mesh(ParallelDims(dp=WORLD))
    model_config = GPTConfig.tiny()
    config = TrainConfig(batch_size=BATCH, seed=SEED, zero_stage=stage)
    torch.manual_seed(config.seed)
    engine = initialize(GPT(model_config), config, mesh)
    for batch in data.batches(mesh, steps, BATCH, model_config.block_size, seed=SEED):
        engine.train_step(batch)
    rep = engine.report()
    at_step = {k: v for k, v in rep["memory_at_step"].items() if isinstance(v, (int, float))}
    out = {"rank": mesh.rank, "stage": stage, "memory_at_step": at_step,
           "units": [{"name": u.name, "numel": u.numel, "padded": u.padded} for u in engine.wrapper.units]
           if stage else [{"name": "model", "numel": sum(p.numel() for p in engine.model.parameters()),
                           "padded": sum(p.numel() for p in engine.model.parameters())}]}
    if stage == 3:
        out["steps"] = _prefetch_steps(rep, steps)
    return out


def _prefetch_steps(rep: dict, steps: int) -> list[dict]:
    """Per step, per unit in forward order: all-gather issued / waited (ms) and the unit's forward span."""
    engine_events = [e for e in rep["timeline"] if "step" in e]
    stage_events = sorted((e for e in rep["timeline"] if "step" not in e), key=lambda e: e["time"])
    gathers = [c for c in rep["comm_events"] if c["op"] == "all_gather" and c["group"].startswith("dp")]
    out = []
    for k in range(steps):
        at = {e["event"]: e["time"] for e in engine_events if e["step"] == k}
        t0, t1 = at["forward_start"], at["backward_start"]
        fwd = [e for e in stage_events if t0 <= e["time"] <= t1]
        starts = {e["unit"]: e["time"] for e in fwd if e["event"] == "unit_forward_start"}
        ends = {e["unit"]: e["time"] for e in fwd if e["event"] == "unit_forward_end"}
        issued = {e["unit"]: (e["time"], e["prefetch"]) for e in fwd if e["event"] == "all_gather_issued"}
        waits = {c["tag"]: c for c in gathers if t0 <= c["start"] <= t1}
        units = []
        for name in starts:                                   # dict order: forward order
            row = {"unit": name, "forward_start": _ms(starts[name], t0), "forward_end": _ms(ends[name], t0)}
            if name in issued:
                c = waits[name]
                row.update(issued=_ms(issued[name][0], t0), waited=_ms(c["end"], t0), prefetch=issued[name][1],
                           elements=c["elements"], bytes=c["bytes"], sent_bytes=c["sent_bytes"])
            units.append(row)
        out.append({"step": k, "backward_start": _ms(t1, t0), "units": units})
    return out


# ------------------------------------------------------------------------------------------------
# Pipeline: GPipe against 1F1B

def pipeline_worker(steps: int, schedule: str) -> dict:
    """One rank of a pp = 2, m = PP_MICRO run: its spans per step, its row of the slot grid, its idle slots."""
    from .. import data
    from ..config import GPTConfig, TrainConfig
    from ..train.engine import initialize
    from ..mesh import ParallelDims, init_mesh
    from ..model import GPT

    mesh = init_mesh(ParallelDims(pp=WORLD))
    model_config = GPTConfig.tiny()
    config = TrainConfig(batch_size=BATCH, seed=SEED, pp=WORLD, micro_batches=PP_MICRO, schedule=schedule)
    torch.manual_seed(config.seed)
    engine = initialize(GPT(model_config), config, mesh)
    for batch in data.batches(mesh, steps, BATCH, model_config.block_size, seed=SEED):
        engine.train_step(batch)
    rep = engine.report()
    pipe = engine.pipeline
    out_steps = []
    for k in range(steps):
        ev = [e for e in pipe.events if e["step"] == k]
        whole = next(e for e in ev if e["kind"] == "step")
        t0 = whole["start"]
        spans = [{"kind": e["kind"], "tick": e["tick"], "start": _ms(e["start"], t0), "end": _ms(e["end"], t0),
                  **({"micro": e["micro"]} if "micro" in e else {})}
                 for e in sorted(ev, key=lambda e: e["start"]) if e["kind"] != "step"]
        out_steps.append({"step": k, "end": _ms(whole["end"], t0), "spans": spans})
    return {"rank": mesh.pp_rank, "schedule": schedule, "grid": [str(a) if a else None for a in pipe.plan.grid[mesh.pp_rank]],
            "bubble": {k: v for k, v in rep["pipeline"].items() if k != "wall_idle_of_total"},
            "steps": out_steps}


# ------------------------------------------------------------------------------------------------
# Assemble the traces

def _source(steps: int, **extra) -> dict:
    return {"command": "minimega record", "preset": "tiny", "world_size": WORLD, "backend": "gloo",
            "steps": steps, "batch_size": BATCH, "seed": SEED, **extra}


def record(out: str | Path = DEFAULT_OUT, steps: int = 3, bucket_mb: float = 0.0625,
           only: tuple[str, ...] = TRACES, timeout: float = 600) -> dict[str, Path]:
    """Run the jobs and write the traces named in ``only`` under ``out``; returns {name: path}."""
    from .. import analysis as est
    from ..config import GPTConfig
    from ..run.launch import launch

    unknown = sorted(set(only) - set(TRACES))
    if unknown:
        raise ValueError(f"unknown trace(s) {unknown}; choose from {list(TRACES)}")
    if steps < 1:
        raise ValueError(f"steps={steps}: record at least one step")
    cfg = GPTConfig.tiny()
    shape = {"b": BATCH, "s": cfg.block_size, "h": cfg.n_embd, "a": cfg.n_head, "layers": cfg.n_layer,
             "vocab": cfg.vocab_size}
    traces: dict[str, dict] = {}
    ddp = tp = tp_sp = None
    if {"ddp-overlap", "memory"} & set(only):
        ddp = launch(ddp_worker, WORLD, steps, bucket_mb, backend="gloo", timeout=timeout)
    if {"tp-comm", "memory", "activations"} & set(only):
        tp = launch(tp_worker, WORLD, steps, False, "activations" in only, backend="gloo", timeout=timeout)
    if "tp-comm" in only:
        tp_sp = launch(tp_worker, WORLD, steps, True, False, backend="gloo", timeout=timeout)
    if "ddp-overlap" in only:
        traces["ddp-overlap"] = {
            "schema": SCHEMA, "kind": "ddp-overlap", "source": _source(steps, bucket_mb=bucket_mb, dp=WORLD),
            "shape": shape, "n_params": ddp[0]["n_params"], "buckets": ddp[0]["buckets"],
            "ranks": [{"rank": r["rank"], "steps": r["steps"], "sent_bytes_per_step": r["sent_bytes_per_step"]}
                      for r in ddp]}
    if "memory" in only:
        traces["memory"] = {
            "schema": SCHEMA, "kind": "memory", "source": _source(steps, optimizer="adamw", precision="fp32"),
            "shape": shape, "n_params": ddp[0]["n_params"],
            "layouts": [{"layout": "dp2", "dp": WORLD, "tp": 1, "ranks": [r["memory"] for r in ddp]},
                        {"layout": "tp2", "dp": 1, "tp": WORLD, "ranks": [r["memory"] for r in tp]}]}
    if "tp-comm" in only:
        traces["tp-comm"] = {
            "schema": SCHEMA, "kind": "tp-comm", "source": _source(steps, tp=WORLD), "shape": shape,
            "layouts": [{"layout": name, "tp": WORLD, "sequence_parallel": sp,
                         "ranks": [{"rank": r["rank"], "per_step": r["per_step"],
                                    "sent_bytes_per_step": r["sent_bytes_per_step"]} for r in runs]}
                        for name, sp, runs in (("tp2", False, tp), ("tp2-sp", True, tp_sp))]}
    if "activations" in only:
        act_shape = {"b": ACT_BATCH, "s": cfg.block_size, "h": cfg.n_embd, "a": cfg.n_head,
                     "dropout": ACT_DROPOUT, "attention": "math", "act_bytes": 4}
        rows = []
        for r in tp:
            for row in r["activations"]:
                formula = est.gpt_activation_bytes_per_layer(
                    cfg.block_size, ACT_BATCH, cfg.n_embd, cfg.n_head, tp=row["tp"], sp=row["sp"],
                    recompute=row["mode"], act_bytes=4, dropout=True, attention="math")
                rows.append({"rank": r["rank"], **row, "formula": formula})
        traces["activations"] = {"schema": SCHEMA, "kind": "activations", "source": _source(0, tp=WORLD),
                                 "shape": act_shape, "rows": rows}
    zero_runs = {}
    if {"zero-memory", "zero-prefetch"} & set(only):
        stages = (0, 1, 2, 3) if "zero-memory" in only else (3,)
        zero_runs = {st: launch(zero_worker, WORLD, steps, st, backend="gloo", timeout=timeout) for st in stages}
    if "zero-memory" in only:
        traces["zero-memory"] = {
            "schema": SCHEMA, "kind": "zero-memory", "source": _source(steps, optimizer="adamw", precision="fp32",
                                                                       dp=WORLD),
            "shape": shape, "n_params": sum(u["numel"] for u in zero_runs[0][0]["units"]),
            "stages": [{"stage": st, "units": runs[0]["units"],
                        "ranks": [{"rank": r["rank"], "memory_at_step": r["memory_at_step"]} for r in runs]}
                       for st, runs in sorted(zero_runs.items())]}
    if "zero-prefetch" in only:
        traces["zero-prefetch"] = {
            "schema": SCHEMA, "kind": "zero-prefetch", "source": _source(steps, dp=WORLD, zero_stage=3, prefetch=True),
            "shape": shape, "units": zero_runs[3][0]["units"],
            "ranks": [{"rank": r["rank"], "steps": r["steps"]} for r in zero_runs[3]]}
    if "pipeline" in only:
        runs = {sch: launch(pipeline_worker, WORLD, steps, sch, backend="gloo", timeout=timeout)
                for sch in ("gpipe", "1f1b")}
        traces["pipeline"] = {
            "schema": SCHEMA, "kind": "pipeline", "source": _source(steps, pp=WORLD, micro_batches=PP_MICRO),
            "shape": shape, "p": WORLD, "m": PP_MICRO,
            "schedules": [{"schedule": sch, "ranks": rs} for sch, rs in runs.items()]}
    if "comm-wire" in only:
        from ..run.measure import wire_table
        rows = []
        for n in WIRE_RANKS:
            per_rank = launch(wire_table, n, list(WIRE_NUMELS), backend="gloo", timeout=timeout)
            for cells in zip(*per_rank):
                rows.append({k: cells[0][k] for k in ("op", "ranks", "bytes", "model", "logged")}
                            | {"measured": [c["measured"] for c in cells]})
        traces["comm-wire"] = {
            "schema": SCHEMA, "kind": "comm-wire",
            "source": {"command": "minimega record", "backend": "gloo", "transport": "tcp (loopback)",
                       "dtype": "float32", "counter": "TCP_INFO tcpi_bytes_sent per socket",
                       "torch": torch.__version__},
            "rows": rows}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, trace in traces.items():
        paths[name] = out / f"{name}.json"
        paths[name].write_text(json.dumps(trace, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return paths


def load(name: str, directory: str | Path | None = None) -> dict:
    """A recorded trace by name (``course/data`` of this checkout by default)."""
    if name not in TRACES:
        raise ValueError(f"unknown trace {name!r}; choose from {list(TRACES)}")
    directory = Path(directory) if directory else Path(__file__).resolve().parents[3] / DEFAULT_OUT
    path = directory / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: not recorded yet; run `minimega record --out {directory}`")
    trace = json.loads(path.read_text(encoding="utf-8"))
    if trace.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {trace.get('schema')} is not {SCHEMA}; re-run `minimega record`")
    return trace
