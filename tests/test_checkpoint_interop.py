"""Interop with torch.distributed.checkpoint: torch's own dcp.load reads an export (plain and FSDP2),
and a DCP directory saved from model.py under FSDP2 imports and loads onto any layout, bit for bit."""
import pickle

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

import minimega as mm
from minimega import checkpoint, data
from minimega.checkpoint import CheckpointError
from minimega.tools.cli import main as cli          # in this process: a fresh `python -m minimega` imports torch again
from parity import parity_config

MODEL = mm.GPTConfig.tiny(block_size=32)


def _save_zero3(config, directory):
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(MODEL), config, mesh)
    for batch in data.batches(mesh, 3, config.batch_size, 32, seed=config.seed):
        engine.train_step(batch)
    engine.save(directory)
    return engine.full_state_dict()


def _fsdp2_model():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(123)                                 # any init: dcp.load overwrites it
    model = mm.GPT(MODEL)
    device_mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=device_mesh)
    fully_shard(model, mesh=device_mesh)
    return model


def _fsdp2_loads(out):
    mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    model = _fsdp2_model()
    state = model.state_dict()                             # DTensors, each rank its Shard(0)
    dcp.load(state, checkpoint_id=out)
    return {k: v.full_tensor().clone() for k, v in state.items()}


def test_export_dcp_loads_in_torch_plain_and_fsdp2(tmp_path):
    saved = mm.launch(_save_zero3, 2, parity_config(zero_stage=3), str(tmp_path / "ck"), timeout=240)[0]
    out = tmp_path / "dcp"
    assert cli(["checkpoint", "export", str(tmp_path / "ck"), str(out), "--format", "dcp"]) == 0
    state = mm.GPT(MODEL).state_dict()                     # a plain model.py state dict, as a user has
    dcp.load(state, checkpoint_id=str(out), no_dist=True)
    assert state.keys() == saved.keys() and all(torch.equal(state[k], saved[k]) for k in saved)
    fsdp = mm.launch(_fsdp2_loads, 2, str(out), timeout=240)[0]
    assert all(torch.equal(fsdp[k], saved[k]) for k in saved)
    st = tmp_path / "model.safetensors"
    assert cli(["checkpoint", "export", str(tmp_path / "ck"), str(st), "--format", "safetensors"]) == 0
    weights = load_file(str(st))
    assert all(torch.equal(weights[k], saved[k]) for k in saved)


def _fsdp2_trains_and_saves(config, out):
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    model = _fsdp2_model()
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr)
    for x, y in data.batches(mesh, 2, config.batch_size, 32, seed=config.seed):
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
    dcp.save(model.state_dict(), checkpoint_id=out)
    return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}


def _load_minimega(config, directory):
    mesh = mm.init_mesh(mm.ParallelDims.infer(dist.get_world_size(), tp=config.tp))
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(MODEL), config, mesh)
    assert engine.load(directory) == 0
    return engine.full_state_dict()


def test_import_dcp_from_fsdp2_loads_onto_any_layout(tmp_path):
    fsdp = mm.launch(_fsdp2_trains_and_saves, 2, parity_config(), str(tmp_path / "dcp"), timeout=240)[0]
    assert cli(["checkpoint", "import", str(tmp_path / "dcp"), str(tmp_path / "ck"), "--model-config",
                '{"block_size": 32}']) == 0
    for world, layout in ((2, {"tp": 2}), (2, {"zero_stage": 3})):
        got = mm.launch(_load_minimega, world, parity_config(**layout), str(tmp_path / "ck"), timeout=240)[0]
        assert all(torch.equal(got[k], fsdp[k]) for k in fsdp), layout


class _Marker:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_import_refuses_a_crafted_metadata_pickle(tmp_path):
    src = tmp_path / "dcp"
    dcp.save(mm.GPT(MODEL).state_dict(), checkpoint_id=str(src), no_dist=True)
    (src / ".metadata").write_bytes(pickle.dumps(_Marker(str(tmp_path / "pwned"))))
    with pytest.raises(CheckpointError, match=r"\.metadata: refers to (io|builtins)\.open, which is not DCP metadata"):
        checkpoint.import_dcp(src, tmp_path / "ck", MODEL)
    assert not (tmp_path / "pwned").exists()


def test_import_refuses_storage_outside_the_directory(tmp_path):
    src = tmp_path / "dcp"
    dcp.save(mm.GPT(MODEL).state_dict(), checkpoint_id=str(src), no_dist=True)
    meta = checkpoint.interop.read_dcp_metadata(src)
    for info in meta.storage_data.values():
        info.relative_path = "../../etc/hostname"
    (src / ".metadata").write_bytes(pickle.dumps(meta))
    with pytest.raises(CheckpointError, match=r"'../../etc/hostname' is not a plain file name"):
        checkpoint.import_dcp(src, tmp_path / "ck", MODEL)
