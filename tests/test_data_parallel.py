"""DDP (zero_stage 0) equals the single-process model and torch's DistributedDataParallel."""
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import minimega as mm
from minimega import data
from minimega.train.engine import make_optimizer
from parity import max_rel_error, parity_config, reference_run

MODEL = mm.GPTConfig.tiny(block_size=32)
STEPS = 4      # the gradient itself: test_grad_parity.py; these steps check the optimizer path


def _ours(config):
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(MODEL), config, mesh)
    for batch in data.batches(mesh, STEPS, config.batch_size, 32, seed=config.seed):
        engine.train_step(batch)
    return engine.full_state_dict(), engine.losses, engine.comm_per_step, engine.report()["timeline"]


def _torch_ddp(config):
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    torch.manual_seed(config.seed)
    model = mm.GPT(MODEL)
    ddp = DistributedDataParallel(model)
    opt = make_optimizer(ddp.parameters(), config)
    for x, y in data.batches(mesh, STEPS, config.batch_size, 32, seed=config.seed):
        _, loss = ddp(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _both(config):
    return _ours(config), _torch_ddp(config)


@pytest.mark.parametrize("world", [2, 4], ids=["dp2", "dp4"])
def test_ddp_matches_single_process_and_torch_ddp(world):
    config = parity_config(bucket_mb=0.05)       # several buckets on the tiny model
    ref, ref_losses = reference_run(MODEL, config, STEPS, seq_len=32)
    results = mm.launch(_both, world, config, timeout=240)
    (ours, losses, comm_per_step, timeline), theirs = results[0]
    assert max_rel_error(ours, ref) <= 1e-5
    assert max_rel_error(ours, theirs) <= 1e-5
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    # Every rank ends with the same weights.
    for (other, *_), _ in results[1:]:
        assert max_rel_error(other, ours) == 0.0
    # Ring model: each step every rank sends 2(n-1)/n * 4 bytes * Psi, exactly.
    psi = mm.GPT(MODEL).num_params()
    assert comm_per_step == [2 * (world - 1) / world * 4 * psi] * STEPS
    # Overlap: the first bucket's all-reduce is issued before backward ends.
    issued = [e["time"] for e in timeline if e["event"] == "all_reduce_issued"]
    ends = [e["time"] for e in timeline if e["event"] == "backward_end"]
    assert len(issued) >= 3 * STEPS and min(issued) < min(ends)


def test_gradient_accumulation_and_clipping_match_single_process():
    config = parity_config(gradient_accumulation_steps=2, gradient_clipping=0.5)
    ref, ref_losses = reference_run(MODEL, config, STEPS, seq_len=32)
    (ours, losses, comm_per_step, _), _ = mm.launch(_both, 2, config, timeout=240)[0]
    assert max_rel_error(ours, ref) <= 1e-5
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    psi = mm.GPT(MODEL).num_params()
    assert comm_per_step == [4 * psi] * STEPS       # no_sync: one reduction per step, not per micro-batch
