"""Jobs the labs run on several ranks through `minimega.run.launch`.

Why a module and not a notebook cell: `launch` sends the worker to each rank *by reference*, so every
rank imports this file and calls the function; a function defined in a cell lives in ``__main__``,
which the ranks cannot import.

Every worker is silent: ranks never print (output from several processes interleaves at random and
would make the notebooks non-deterministic). Each returns plain data the notebook plots.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

import minimega as mm
from minimega import comm, data


def train(model: str | mm.GPTConfig, config: mm.TrainConfig, steps: int = 3, seq_len: int = 32,
          with_grads: bool = False) -> dict:
    """Train the reference GPT for ``steps`` steps on this rank; return its `Engine.report()`.

    Args:
        model: a preset name ('tiny', 'small', 'gpt2') or a `GPTConfig`.
        config: the run; ``tp`` and ``pp`` set the mesh, dp is whatever remains of the world.
        steps: optimizer steps (memory is fully allocated after the first one).
        seq_len: tokens per sequence.
        with_grads: after the last step run one more forward and backward (no optimizer step), so the
            memory is measured while gradients are resident, as at the peak of a step; the optimizer
            step frees them (``zero_grad(set_to_none=True)``).

    Returns:
        ``Engine.report()`` plus ``"n_params"`` (the full model's parameter count, Ψ) and ``"model"``.
    """
    world = dist.get_world_size() if dist.is_initialized() else 1
    mesh = mm.init_mesh(mm.ParallelDims.infer(world, tp=config.tp, pp=config.pp))
    model_config = mm.GPTConfig.preset(model) if isinstance(model, str) else model
    torch.manual_seed(config.seed)
    full = mm.GPT(model_config)
    n_params = full.num_params()
    engine = mm.initialize(full, config, mesh)
    for batch in data.batches(mesh, steps, config.batch_size, seq_len, seed=config.seed,
                              vocab_size=model_config.vocab_size):
        engine.train_step(batch)
    if with_grads:
        x, y = next(data.batches(mesh, 1, config.batch_size, seq_len, start=steps, seed=config.seed,
                                 vocab_size=model_config.vocab_size))
        engine.wrapper(x, y)[1].backward()
    return {"n_params": n_params, "model": model_config, **engine.report()}


def saved_activations(model: str | mm.GPTConfig, mode: str, batch_size: int, seq_len: int) -> int:
    """Bytes autograd keeps for backward in one forward of the whole GPT with ``mode`` checkpointing.

    Measured on this process (no group needed): every tensor saved for backward, counted once per storage,
    parameters excluded (`minimega.train.activation_checkpoint.saved_activation_bytes`).
    """
    from minimega.train.activation_checkpoint import apply_activation_checkpointing, saved_activation_bytes

    model_config = mm.GPTConfig.preset(model) if isinstance(model, str) else model
    torch.manual_seed(0)
    gpt = apply_activation_checkpointing(mm.GPT(model_config), mode)
    x, y = data.global_batch(0, batch_size, seq_len, vocab_size=model_config.vocab_size)
    return saved_activation_bytes(gpt, x, y)


def unit_numels(model: str | mm.GPTConfig) -> list[int]:
    """Elements of each ZeRO unit (embeddings, each block, the head): the groups `zero/flat.py` pads one by one."""
    from minimega.zero import model_units

    model_config = mm.GPTConfig.preset(model) if isinstance(model, str) else model
    gpt = mm.GPT(model_config)                 # the labs' models are small: building one takes milliseconds
    return [sum(p.numel() for _, p in params) for _, params in model_units(gpt)]


def train_and_checkpoint(model: str | mm.GPTConfig, config: mm.TrainConfig, steps: int, seq_len: int = 32,
                         save_dir: str | None = None, save_at: int | None = None,
                         load_dir: str | None = None) -> dict:
    """Train up to step ``steps`` on this rank, optionally resuming from and saving a checkpoint.

    Args:
        save_dir, save_at: every rank calls ``engine.save(save_dir)`` once the engine reaches step ``save_at``.
        load_dir: resume from the latest checkpoint there (saved under any layout); training continues
            with the global batches of the steps that follow it.

    Returns:
        ``{"rank", "layout", "start": the step training (re)started from, "losses": one per step run}``.
    """
    world = dist.get_world_size() if dist.is_initialized() else 1
    mesh = mm.init_mesh(mm.ParallelDims.infer(world, tp=config.tp, pp=config.pp))
    model_config = mm.GPTConfig.preset(model) if isinstance(model, str) else model
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(model_config), config, mesh)
    start = engine.load(load_dir) if load_dir else 0
    for batch in data.batches(mesh, steps - start, config.batch_size, seq_len, start=start, seed=config.seed,
                              vocab_size=model_config.vocab_size):
        engine.train_step(batch)
        if save_dir and engine.step == save_at:
            engine.save(save_dir)
    return {"rank": mesh.rank, "layout": engine.layout(), "start": start, "losses": list(engine.losses)}


def train_fsdp2(model: str | mm.GPTConfig, config: mm.TrainConfig, steps: int = 3, seq_len: int = 32) -> dict:
    """The same run as `train` with torch's own FSDP2: ``fully_shard`` on each block, then on the whole model.

    Same seed, same global batches, same torch AdamW (built the engine's way); only the sharding is torch's.

    Returns:
        ``{"rank", "losses", "local": {name: (local shape, full shape, placement)}, "local_param_bytes"}``.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from minimega.train.engine import make_optimizer

    world = dist.get_world_size()
    mesh = mm.init_mesh(mm.ParallelDims(dp=world))
    model_config = mm.GPTConfig.preset(model) if isinstance(model, str) else model
    torch.manual_seed(config.seed)
    gpt = mm.GPT(model_config)
    device_mesh = init_device_mesh("cpu", (world,))
    for block in gpt.blocks:
        fully_shard(block, mesh=device_mesh)           # one parameter group (FSDP2: FSDPParamGroup) per block
    fully_shard(gpt, mesh=device_mesh)                 # the root: embeddings, final norm, head
    opt = make_optimizer(gpt.parameters(), config)
    losses = []
    for x, y in data.batches(mesh, steps, config.batch_size, seq_len, seed=config.seed,
                             vocab_size=model_config.vocab_size):
        _, loss = gpt(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(comm.all_reduce_mean(loss.detach().clone(), mesh.dp_group).item())
    local = {n: (tuple(p.to_local().shape), tuple(p.shape), str(p.placements[0])) for n, p in gpt.named_parameters()}
    return {"rank": mesh.rank, "losses": losses, "local": local,
            "local_param_bytes": sum(p.to_local().numel() * p.element_size() for p in gpt.parameters())}


def _timed_step(engine, batch, world: int) -> float:
    """Seconds of one `Engine.train_step`, every rank starting and ending together (the slowest rank's time)."""
    import time
    if world > 1:
        dist.barrier()
    t = time.perf_counter()
    engine.train_step(batch)
    if world > 1:
        dist.barrier()
    return time.perf_counter() - t


def timed_train(model: str, configs: list, steps: int = 4, seq_len: int = 32) -> list[float]:
    """For each `TrainConfig` in turn: median seconds of one `Engine.train_step` on this rank after one warm-up
    step (ranks in lockstep). One launch times several layouts of the same world size."""
    import statistics
    world = dist.get_world_size() if dist.is_initialized() else 1
    model_config = mm.GPTConfig.preset(model)
    out = []
    for config in configs:
        mesh = mm.init_mesh(mm.ParallelDims.infer(world, tp=config.tp, pp=config.pp))
        torch.manual_seed(config.seed)
        engine = mm.initialize(mm.GPT(model_config), config, mesh)
        times = []
        for batch in data.batches(mesh, steps + 1, config.batch_size, seq_len, seed=config.seed,
                                  vocab_size=model_config.vocab_size):
            times.append(_timed_step(engine, batch, world))
        out.append(statistics.median(times[1:]))
    return out


def offload_io(model: str | mm.GPTConfig, configs: list, steps: int = 6, seq_len: int = 32) -> list[dict]:
    """One engine per `TrainConfig`, stepped in turn on the same batches (ranks in lockstep): what each engine's
    optimizer store moved to and from disk at every step, and how long its steps took.

    Interleaving the engines step by step gives them the same machine: a shared CPU's load falls on both.

    Returns:
        One dict per config: ``"location"`` (where the optimizer states live: 'cpu', 'nvme', ...), ``"traffic"``
        (per step, the bytes the store read from and wrote to its files: `NVMeOffloadStore.traffic`; zeros for a
        store in memory), ``"seconds"`` (median `Engine.train_step` after the first step) and ``"losses"``.
    """
    import statistics
    world = dist.get_world_size() if dist.is_initialized() else 1
    model_config = mm.GPTConfig.preset(model) if isinstance(model, str) else model
    mesh = mm.init_mesh(mm.ParallelDims(dp=world))
    engines = []
    for config in configs:
        torch.manual_seed(config.seed)
        engines.append(mm.initialize(mm.GPT(model_config), config, mesh))
    stores = [e.zero_stages[0].store for e in engines]
    traffic, times = [[] for _ in engines], [[] for _ in engines]
    for batch in data.batches(mesh, steps, configs[0].batch_size, seq_len, seed=configs[0].seed,
                              vocab_size=model_config.vocab_size):
        for k, (engine, store) in enumerate(zip(engines, stores)):
            times[k].append(_timed_step(engine, batch, world))
            traffic[k].append(dict(getattr(store, "traffic", {"read": 0, "written": 0})))
    out = [{"location": store.location, "traffic": traffic[k], "seconds": statistics.median(times[k][1:]),
            "losses": list(engine.losses)} for k, (engine, store) in enumerate(zip(engines, stores))]
    for store in stores:
        if hasattr(store, "close"):
            store.close()                          # its files go now, not when the process ends
    return out


def train_moe(config: mm.TrainConfig, n_experts: int = 4, top_k: int = 2, capacity_factor: float = 1.25,
              steps: int = 3, seq_len: int = 32) -> dict:
    """Train the tiny mixture-of-experts GPT (`minimega.parallel.moe.layer`) with ``config.ep`` expert parallelism.

    Returns ``Engine.report()`` (its ``"moe"`` entry: this rank's tokens routed to and dropped by each
    expert, per layer) plus ``"model"``, ``"moe_config"`` and ``"n_params"``.
    """
    from minimega.parallel.moe import layer as moe
    world = dist.get_world_size() if dist.is_initialized() else 1
    mesh = mm.init_mesh(mm.ParallelDims(dp=world, ep=config.ep))
    model_config = mm.GPTConfig.tiny(block_size=seq_len)
    moe_config = moe.MoEConfig(n_experts=n_experts, top_k=top_k, capacity_factor=capacity_factor)
    torch.manual_seed(config.seed)
    full = moe.MoEGPT(model_config, moe_config)
    engine = mm.initialize(full, config, mesh)
    for batch in data.batches(mesh, steps, config.batch_size, seq_len, seed=config.seed):
        engine.train_step(batch)
    return {"n_params": full.num_params(), "model": model_config, "moe_config": moe_config, **engine.report()}


def train_cp(config: mm.TrainConfig, steps: int = 3, seq_len: int = 32) -> dict:
    """Train the tiny GPT with ``config.cp`` context parallelism (dp is what remains of the world).

    Returns ``Engine.report()`` plus ``"model"`` (the `GPTConfig`) and ``"dp"``.
    """
    world = dist.get_world_size() if dist.is_initialized() else 1
    mesh = mm.init_mesh(mm.ParallelDims(dp=world // config.cp, cp=config.cp))
    model_config = mm.GPTConfig.tiny(block_size=seq_len)
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(model_config), config, mesh)
    for batch in data.batches(mesh, steps, config.batch_size, seq_len, seed=config.seed):
        engine.train_step(batch)
    return {"model": model_config, "dp": mesh.dp_size, **engine.report()}


def cp_activation_bytes(seq_lens: list[int], rows: int = 4, attention: str = "ring") -> list[int]:
    """Bytes autograd saves on this rank for one forward of ``rows`` sequences, per sequence length, with the
    sequence split over every rank of the job (cp = world size; one rank: the whole sequence) and attention
    across ranks by ``attention`` (`TrainConfig.cp_attention`: 'ring' or 'ulysses')."""
    from minimega.parallel import context as context_parallel
    from minimega.train.activation_checkpoint import saved_activation_bytes
    world = dist.get_world_size() if dist.is_initialized() else 1
    mesh = mm.init_mesh(mm.ParallelDims(cp=world))
    config = mm.TrainConfig(batch_size=rows, cp=world, cp_attention=attention)   # one rank: 'ring' only (no cp)
    out = []
    for seq_len in seq_lens:
        model_config = mm.GPTConfig.tiny(block_size=seq_len)
        torch.manual_seed(0)
        engine = mm.initialize(mm.GPT(model_config), config, mesh)
        x, y = data.global_batch(0, rows, seq_len)
        if world > 1:
            x, y = (context_parallel.shard_sequence(t, mesh.cp_rank, world) for t in (x, y))
        out.append(saved_activation_bytes(engine.model, x, y))
    return out
