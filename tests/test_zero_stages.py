"""ZeRO stages 1-3 equal single-process AdamW and torch FSDP2; their bytes and traffic equal the closed forms.

Closed forms (fp32 training, Ψ parameters, N = dp; per rank), with P = Σ_units ceil(n_u / N)·N, the
parameter count once every unit's flat buffer is padded to a multiple of N:

    bytes   params   grads    Adam m, v   master      (fp32: the parameters are their own master)
    stage0  4Ψ       4Ψ       8Ψ          0
    stage1  4P       4P       8P/N        0
    stage2  4P       4P/N     8P/N        0
    stage3  4P/N     4P/N     8P/N        0

    sent per step (ring model): stage 0 and stages 1-2: 2·(N-1)/N·4P; stage 3: 3·(N-1)/N·4P = 1.5× DDP.
"""
import pytest
import torch
import torch.distributed as dist

import minimega as mm
from minimega import data
from minimega.run import measure
from minimega.train.engine import make_optimizer
from parity import max_rel_error, parity_config, reference_run

MODEL = mm.GPTConfig.tiny(block_size=32)
# Odd sizes, so that units need padding at dp 2 and 4: embed = 251·6 + 32·6 = 1698 elements.
ODD = mm.GPTConfig(vocab_size=251, block_size=32, n_layer=2, n_head=2, n_embd=6)
STEPS = 4      # the gradient itself: test_grad_parity.py; these steps check the optimizer path


def unit_numels(model_config: mm.GPTConfig) -> list[int]:
    """Element counts of the units ZeRO flattens: embeddings, each block, the head (ln_f + lm_head)."""
    model = mm.GPT(model_config)
    block = sum(p.numel() for p in model.blocks[0].parameters())
    embed = model.wte.weight.numel() + model.wpe.weight.numel()
    head = model.ln_f.weight.numel() + model.lm_head.weight.numel()
    return [embed] + [block] * model_config.n_layer + [head]


def expected_bytes(model_config: mm.GPTConfig, dp: int, stage: int) -> dict:
    psi = sum(unit_numels(model_config))
    p = sum(-(-n // dp) * dp for n in unit_numels(model_config))
    params, grads, states = {0: (4 * psi, 4 * psi, 8 * psi), 1: (4 * p, 4 * p, 8 * p // dp),
                             2: (4 * p, 4 * p // dp, 8 * p // dp), 3: (4 * p // dp, 4 * p // dp, 8 * p // dp)}[stage]
    return {"params": params, "grads": grads, "optimizer_states": states}


def _train(model_config, config, steps=STEPS):
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(model_config), config, mesh)
    for batch in data.batches(mesh, steps, config.batch_size, 32, seed=config.seed,
                              vocab_size=model_config.vocab_size):
        engine.train_step(batch)
    report = engine.report()
    return {"state": engine.full_state_dict(), "losses": engine.losses, "norms": engine.grad_norms,
            "comm": report["comm_per_step"], "memory": report["memory_at_step"], "timeline": report["timeline"]}


def _fsdp2(config):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    torch.manual_seed(config.seed)
    model = mm.GPT(MODEL)
    device_mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=device_mesh)
    fully_shard(model, mesh=device_mesh)
    opt = make_optimizer(model.parameters(), config)
    for x, y in data.batches(mesh, STEPS, config.batch_size, 32, seed=config.seed):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}


def _stages_worker(config):
    runs = {stage: _train(MODEL, config.replace(zero_stage=stage)) for stage in (1, 2, 3)}
    memory = {stage: _train(ODD, config.replace(zero_stage=stage), steps=1)["memory"] for stage in (0, 1, 2, 3)}
    return runs, _fsdp2(config), memory


@pytest.mark.parametrize("world", [2, 4], ids=["dp2", "dp4"])
def test_stages_match_single_process_fsdp2_and_closed_forms(world):
    config = parity_config()
    ref, ref_losses = reference_run(MODEL, config, STEPS, seq_len=32)
    results = mm.launch(_stages_worker, world, config, timeout=300)
    runs, fsdp2, memory = results[0]
    psi = mm.GPT(MODEL).num_params()
    ring = (world - 1) / world
    for stage, run in runs.items():
        assert max_rel_error(run["state"], ref) <= 1e-5, f"stage {stage}"
        assert run["losses"] == pytest.approx(ref_losses, rel=1e-5)
        for other, _, _ in results[1:]:                 # every rank ends with the same consolidated weights
            assert max_rel_error(other[stage]["state"], run["state"]) == 0.0
        # The tiny model's units divide by 2 and 4: P = Ψ.
        hops = 3 if stage == 3 else 2
        assert run["comm"] == [hops * ring * 4 * psi] * STEPS, f"stage {stage}"
    assert runs[3]["comm"][0] == 1.5 * 2 * ring * 4 * psi          # 1.5× DDP's all-reduce
    assert max_rel_error(runs[3]["state"], fsdp2) <= 1e-5
    # Memory on the padded model, every rank: exactly the closed form.
    for rank_memory in [r[2] for r in results]:
        for stage, got in rank_memory.items():
            want = expected_bytes(ODD, world, stage)
            assert {k: got[k] for k in want} == want, f"stage {stage}"
            assert got.get("master", 0) == 0
    _check_overlap(runs[2]["timeline"], runs[3]["timeline"], MODEL.n_layer + 2)


def _check_overlap(timeline2, timeline3, units):
    # Stage 2: every unit's reduce-scatter is issued inside backward, the head's first, the embeddings' last.
    starts = [e["time"] for e in timeline2 if e["event"] == "backward_start"]
    ends = [e["time"] for e in timeline2 if e["event"] == "backward_end"]
    issued = [e for e in timeline2 if e["event"] == "reduce_scatter_issued"]
    for s, t in zip(starts, ends):
        inside = [e for e in issued if s < e["time"] < t]
        assert len(inside) == units
        assert inside[0]["unit"] == "head" and inside[-1]["unit"] == "embed"
    # Stage 3: unit k+1's all-gather is issued (as a prefetch) before unit k's forward has finished.
    events = sorted(timeline3, key=lambda e: e["time"])
    order = ["embed"] + [f"blocks.{i}" for i in range(units - 2)] + ["head"]
    first_step = events[:next(i for i, e in enumerate(events) if e["event"] == "backward_start")]
    for k in range(1, len(order)):
        gather = next(e for e in first_step if e["event"] == "all_gather_issued" and e["unit"] == order[k])
        done = next(e for e in first_step if e["event"] == "unit_forward_end" and e["unit"] == order[k - 1])
        assert gather["prefetch"] and gather["time"] < done["time"]
    backward_prefetches = [e for e in timeline3 if e["event"] == "all_gather_issued" and e["prefetch"]]
    assert len(backward_prefetches) == 2 * (units - 1) * STEPS          # forward and backward, every step


def _reference_with_norms(config):
    """Single process, as `reference_run`, also returning the pre-clipping global gradient norms."""
    torch.manual_seed(config.seed)
    model = mm.GPT(MODEL)
    opt = make_optimizer(model.parameters(), config)
    norms, ga = [], config.gradient_accumulation_steps
    for x, y in data.global_batches(STEPS, config.batch_size, 32, seed=config.seed):
        for xm, ym in zip(x.chunk(ga), y.chunk(ga)):
            (model(xm, ym)[1] / ga).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.gradient_clipping)))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return norms


def _variants_worker(config):
    return {(stage, offload): _train(MODEL, config.replace(zero_stage=stage, offload_optimizer=offload))
            for stage, offload in ((1, False), (2, True), (3, False))}


def test_accumulation_clipping_and_offload_match_single_process():
    config = parity_config(gradient_accumulation_steps=2, gradient_clipping=0.5)
    ref, ref_losses = reference_run(MODEL, config, STEPS, seq_len=32)
    ref_norms = _reference_with_norms(config)
    assert max(ref_norms) > 0.5                       # clipping really acts
    runs = mm.launch(_variants_worker, 2, config, timeout=300)[0]
    psi = mm.GPT(MODEL).num_params()
    for (stage, offload), run in runs.items():
        assert max_rel_error(run["state"], ref) <= 1e-5, (stage, offload)
        assert run["losses"] == pytest.approx(ref_losses, rel=1e-5)
        assert run["norms"] == pytest.approx(ref_norms, rel=1e-6), (stage, offload)
        if offload:   # master and moments in the separate store: 4P/N + 8P/N bytes
            assert run["memory"]["optimizer_location"] == "cpu"
            assert run["memory"]["master"] == 4 * psi // 2 and run["memory"]["optimizer_states"] == 8 * psi // 2
    # Stage 1 reduces once per step; stages 2 and 3 reduce every micro-step (their full gradients never persist).
    norm_bytes = 2 * 0.5 * 8                           # the float64 norm's all-reduce, 2(N-1)/N · 8 bytes
    assert runs[(1, False)]["comm"][0] == 2 * 0.5 * 4 * psi + norm_bytes
    assert runs[(2, True)]["comm"][0] == 3 * 0.5 * 4 * psi + norm_bytes
    assert runs[(3, False)]["comm"][0] == 6 * 0.5 * 4 * psi + norm_bytes


def _dp1_memory(_):
    return {stage: _train(ODD, parity_config(zero_stage=stage), steps=1)["memory"] for stage in (0, 1, 2, 3)}


def test_memory_closed_form_on_one_rank():
    memory = mm.launch(_dp1_memory, 1, None, timeout=120)[0]
    for stage, got in memory.items():
        want = expected_bytes(ODD, 1, stage)
        assert {k: got[k] for k in want} == want, f"stage {stage}"


def test_zero3_unit_states_at_rest_in_forward_and_after_backward():
    """Explicit per-unit state: SHARDED at rest, UNSHARDED while the unit computes, SHARDED again after its backward."""
    from minimega import comm, zero
    from minimega.zero.stage3 import UnitState
    group = comm.Group(None, [0], "dp")           # one rank: collectives return at once, no process group
    config = mm.TrainConfig(zero_stage=3, param_persistence_threshold=100)   # LayerNorm weights (64) stay whole
    torch.manual_seed(0)
    stage = zero.wrap(mm.GPT(MODEL), config, group, 0, lambda p: make_optimizer(p, config))
    persistent = {u.name for u in stage.units if u.name in stage.persistent}
    assert persistent and all(stage.state[n] is UnitState.UNSHARDED for n in persistent)
    assert all(s is UnitState.SHARDED for n, s in stage.state.items() if n not in persistent)
    seen = {}
    stage.module.blocks[1].register_forward_pre_hook(lambda m, a: seen.update(dict(stage.state)))
    x, y = data.global_batch(0, 2, 32)
    stage(x, y)[1].backward()
    stage.finish_grad_sync()
    # While blocks.1 computes: it is whole, blocks.2's gather is in flight (prefetch), the units before it are
    # resharded and the rest are at rest.
    sharded = {n: s for n, s in seen.items() if n not in persistent}
    assert sharded == {**{n: UnitState.SHARDED for n in sharded},
                       "blocks.1": UnitState.UNSHARDED, "blocks.2": UnitState.GATHERING}
    assert all(s is UnitState.SHARDED for n, s in stage.state.items() if n not in persistent)
    # dp = 1: nothing crosses ranks, so nothing is pooled: each shard is its whole unit, no gather or reduce buffers.
    assert stage.slots is None and stage.pool is None
    assert all(measure.same_storage(u.flat, s) for u, s in zip(stage.units, stage.shards))


class _Chain(torch.nn.Module):
    """A model of another shape than the GPT: parts named its own way, and a unit without parameters."""

    def __init__(self):
        super().__init__()
        self.inp, self.out = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def units(self):
        return [("inp", self.inp, [self.inp]), ("act", torch.tanh, []), ("out", self.out, [self.out])]

    def finish(self, x, y):
        return x, torch.nn.functional.mse_loss(x, y)

    def forward(self, x, y):
        for _, fn, _ in self.units():
            x = fn(x)
        return self.finish(x, y)


def test_zero3_runs_any_model_by_its_own_units():
    """ZeRO-3 names no model part: a model of another shape runs through it by its ``units()`` and ``finish()``,
    with the loss and gradients of the model's own forward; a parameter no unit lists is refused, not left untrained."""
    import copy
    from minimega import comm, zero
    group = comm.Group(None, [0], "dp")
    config = mm.TrainConfig(zero_stage=3, param_persistence_threshold=10)    # out.bias (4) stays whole
    torch.manual_seed(0)
    model = _Chain()
    reference = copy.deepcopy(model)
    stage = zero.wrap(model, config, group, 0, lambda p: make_optimizer(p, config))
    assert [u.name for u in stage.units] == ["inp", "out", "out.persistent"]
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    _, loss = stage(x, y)
    loss.backward()
    stage.finish_grad_sync()
    _, want = reference(x, y)
    want.backward()
    assert torch.equal(loss, want)
    grads = stage.full_grad_dict()
    assert all(torch.allclose(grads[n], p.grad, rtol=1e-6, atol=0) for n, p in reference.named_parameters())
    ran = [e["unit"] for e in stage.timeline if e["event"] == "unit_forward_start"]
    assert ran == ["inp", "act", "out"]

    class _Forgets(mm.GPT):
        def units(self):
            return super().units()[:-1]                       # no head: ln_f and lm_head would never be trained
    with pytest.raises(ValueError, match="lists no unit holding.*ln_f.weight"):
        zero.wrap(_Forgets(MODEL), config, group, 0, lambda p: make_optimizer(p, config))


def test_gather_slots_hold_neighbours_in_reused_buffers_and_refuse_a_third():
    """ZeRO-3's gathered units: unit j in buffer j mod 2, each buffer as large as its largest unit, the parameters
    views into it; a unit whose buffer a whole unit still holds is refused (it would overwrite that unit)."""
    from minimega.zero.flat import FlatUnit, GatherSlots
    sizes = [7, 3, 5, 4]                                     # padded at dp 2: 8, 4, 6, 4
    units = [FlatUnit(f"u{j}", [("w", torch.nn.Parameter(torch.ones(n)))], 2, 0, torch.float32)
             for j, n in enumerate(sizes)]
    slots = GatherSlots(units, 2)
    assert [b.numel() for b in slots.buffers] == [8, 4]     # max(8, 6), max(4, 4)
    for j, u in enumerate(units):
        assert measure.same_storage(u.params[0], slots.buffers[j % 2]) and u.flat.numel() == u.padded
    slots.take(units[0])
    slots.take(units[1])
    with pytest.raises(RuntimeError, match="'u2' needs buffer 0, which 'u0' still holds"):
        slots.take(units[2])
    slots.give_back(units[0])
    slots.take(units[2])
