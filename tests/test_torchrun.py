"""minimega under torchrun: two agents on 127.0.0.1 stand in for two nodes (c10d rendezvous, loopback only).

Also the pure choices torchrun across nodes depends on: the device is ``LOCAL_RANK`` and ``backend="auto"``
compares the GPUs of *this* node with the ranks of this node (``LOCAL_WORLD_SIZE``).
"""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import minimega as mm
from minimega import data
from minimega.run.launch import local_device_index, resolve_backend

MODEL = mm.GPTConfig.tiny(block_size=32)
STEPS = 3


def _train(config):
    """Three ZeRO-1 steps of the tiny GPT, and where this rank found itself."""
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(MODEL), config, mesh)
    for batch in data.batches(mesh, STEPS, config.batch_size, 32, seed=config.seed):
        engine.train_step(batch)
    where = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")}
    return engine.full_state_dict(), engine.losses, where, mesh.backend


AGENT = """
import json, sys, torch.distributed as dist, minimega as mm
from parity import max_rel_error, parity_config, reference_run
from test_torchrun import MODEL, STEPS, _train
config = parity_config(zero_stage=1)
out = mm.launch(_train, 2, config, timeout=120)
if dist.get_rank() == 0:
    ref, ref_losses = reference_run(MODEL, config, STEPS, seq_len=32)
    print("RESULT " + json.dumps({"err": max([max_rel_error(o[0], ref) for o in out]), "losses": out[0][1],
                                  "ref_losses": ref_losses, "where": [o[2] for o in out],
                                  "backends": [o[3] for o in out]}), flush=True)
"""


# Sized for a loaded machine: at load 8-13 on two cores an agent took minutes to import torch and reach the store,
# and torchrun's defaults (a 60 s read timeout) ended the job with "The connection to the C10d store has failed".
# A missing agent still ends the job: the join timeout bounds the wait (test below, with a short one).
RDZV_CONF = "read_timeout=300,join_timeout=600"


def _agent(script, port: int, env: dict, conf: str = RDZV_CONF) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "minimega-test",
         "--rdzv-conf", conf, "--local-addr", "127.0.0.1", "--max-restarts", "0", str(script)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_agents_as_two_nodes_match_the_single_process_run(tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    tests = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, *sys.path]), "GLOO_SOCKET_IFNAME": "lo",
           "OMP_NUM_THREADS": "1"}
    port = _free_port()
    agents = [_agent(script, port, env) for _ in range(2)]
    try:
        outs = [a.communicate(timeout=600) for a in agents]
    finally:
        for a in agents:
            a.kill()
    assert all(a.returncode == 0 for a in agents), [o[1][-3000:] for o in outs]
    (line,) = [ln for o in outs for ln in o[0].splitlines() if ln.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    where = result["where"]
    assert [w["RANK"] for w in where] == ["0", "1"]                     # launch() returned rank order
    assert sorted(w["GROUP_RANK"] for w in where) == ["0", "1"]         # one rank on each "node"
    assert all(w["LOCAL_RANK"] == "0" and w["LOCAL_WORLD_SIZE"] == "1" and w["WORLD_SIZE"] == "2" for w in where)
    assert result["backends"] == [resolve_backend("auto", 2, 1)] * 2
    print(f"two agents: max rel error vs single process {result['err']:.2e}")
    assert result["err"] <= 1e-6, result
    assert max(abs(a - b) for a, b in zip(result["losses"], result["ref_losses"])) <= 1e-5


def test_auto_backend_counts_the_ranks_of_this_node_not_the_world():
    # 2 nodes x 4 GPUs, 4 ranks each: the global world (8) exceeds a node's GPUs, yet NCCL is right.
    assert resolve_backend("auto", 8, local_world_size=4, device_count=4) == "nccl"
    assert resolve_backend("auto", 8, local_world_size=8, device_count=4) == "gloo"
    assert resolve_backend("auto", 2, local_world_size=1, device_count=0) == "gloo"
    assert resolve_backend("nccl", 8, local_world_size=4, device_count=4) == "nccl"
    try:
        resolve_backend("nccl", 8, local_world_size=8, device_count=4)
    except ValueError as exc:
        assert "8 rank(s) on this machine but 4 CUDA device(s)" in str(exc)
    else:
        raise AssertionError("nccl with too few GPUs was accepted")


def test_the_device_is_the_local_rank():
    # Rank 5 of 2 nodes x 4 ranks is local rank 1: rank % device_count would say 1 here only by luck,
    # and 5 % 8 = 5 on a node with 8 GPUs and 4 ranks would pick a GPU another job owns.
    assert local_device_index(5, {"LOCAL_RANK": "1"}) == 1
    assert local_device_index(3, {}) == 3


def test_a_node_that_never_comes_ends_the_job_at_the_join_timeout(tmp_path):
    """One agent of two: the rendezvous gives up after its join timeout (10 s here) and the agent exits non-zero,
    naming the rendezvous; the long read timeout the agents get for a loaded machine does not make it wait longer."""
    script = tmp_path / "agent.py"
    script.write_text("print('never reached')\n")
    agent = _agent(script, _free_port(), {**os.environ, "GLOO_SOCKET_IFNAME": "lo"},
                   conf="read_timeout=300,join_timeout=10")
    try:
        out, err = agent.communicate(timeout=240)
    finally:
        agent.kill()
    assert agent.returncode != 0 and "never reached" not in out
    assert "RendezvousTimeoutError" in err or "timed out" in err.lower() or "timeout" in err.lower(), err[-2000:]

