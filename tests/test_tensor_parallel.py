"""Tensor and sequence parallelism: regions, layers, vocab-parallel pieces, parity with `model.py`, communication."""
import functools
import json

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import minimega as mm
from minimega import comm, data
from minimega.parallel import tensor as tpm
from minimega.train.activation_checkpoint import saved_activation_bytes
from minimega.estimate import gpt_activation_bytes_per_layer
from minimega.tools.cli import main
from parity import max_rel_error, parity_config, reference_run

STEPS, SEQ = 4, 32    # the gradient itself: test_grad_parity.py; these steps check the optimizer path


def _per_rank(shape, tp, seed):
    """One tensor per tp rank, identical on every process: rank r uses entry r."""
    return torch.randn((tp, *shape), generator=torch.Generator().manual_seed(seed))


def _close(a, b, tol=1e-6):
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item() <= tol


# ------------------------------------------------------------------------------------------------
# Regions and layers, on every rank of a tp group.

def _regions_and_layers(mesh):
    tp, g, r = mesh.tp_size, mesh.tp_group, mesh.tp_rank
    B, T, D = 2, 4 * tp, 4 * tp
    ok = {}
    # Each region's forward and its backward on its own, with rank-dependent inputs and grads.
    xs, gs = _per_rank((B, T, D), tp, 1), _per_rank((B, T, D), tp, 2)
    cases = {   # name: (fn, input on rank r, grad on rank r, expected forward, expected input grad)
        "copy_to_tp": (tpm.copy_to_tp, xs[0], gs[r], xs[0], gs.sum(0)),
        "reduce_from_tp": (tpm.reduce_from_tp, xs[r], gs[0], xs.sum(0), gs[0]),
        "scatter_to_tp": (tpm.scatter_to_tp, xs[0], gs[r][..., :D // tp], xs[0].chunk(tp, -1)[r],
                          torch.cat([gs[i][..., :D // tp] for i in range(tp)], -1)),
        "gather_from_tp": (tpm.gather_from_tp, xs[r][..., :D // tp], gs[0],
                           torch.cat([xs[i][..., :D // tp] for i in range(tp)], -1), gs[0].chunk(tp, -1)[r]),
        "gather_from_sp": (tpm.gather_from_sp, xs[r][:, :T // tp], gs[r],
                           torch.cat([xs[i][:, :T // tp] for i in range(tp)], 1), gs.sum(0).chunk(tp, 1)[r]),
        "reduce_scatter_to_sp": (tpm.reduce_scatter_to_sp, xs[r], gs[r][:, :T // tp], xs.sum(0).chunk(tp, 1)[r],
                                 torch.cat([gs[i][:, :T // tp] for i in range(tp)], 1)),
    }
    for name, (fn, x, grad, want_y, want_dx) in cases.items():
        x = x.clone().requires_grad_()
        y = fn(x, g)
        y.backward(grad)
        ok[name] = _close(y, want_y) and _close(x.grad, want_dx)
    # Column / Row parallel linear against an nn.Linear whose weight is chunked across ranks.
    for bias in (False, True):
        for sp in (False, True):
            torch.manual_seed(3)
            lin1, lin2 = nn.Linear(D, 3 * D, bias=bias), nn.Linear(3 * D, D, bias=bias)
            x = torch.randn(B, T, D, requires_grad=True)
            y = lin2(F.gelu(lin1(x)))
            y.backward(gs[0][..., :D])
            col = tpm.ColumnParallelLinear(lin1, g, sequence_parallel=sp)
            row = tpm.RowParallelLinear(lin2, g, sequence_parallel=sp)
            xp = (x.detach().chunk(tp, 1)[r] if sp else x.detach()).clone().requires_grad_()
            h = col(xp)                                   # (B, T, 3D/tp)
            want_h = lin1(x).chunk(tp, -1)[r]
            yp = row(F.gelu(h))
            yp.backward(gs[0][..., :D].chunk(tp, 1)[r] if sp else gs[0][..., :D])
            want_dx = x.grad.chunk(tp, 1)[r] if sp else x.grad
            want_w1 = lin1.weight.grad.chunk(tp, 0)[r]
            checks = [_close(h, want_h), _close(yp, y.chunk(tp, 1)[r] if sp else y), _close(xp.grad, want_dx),
                      _close(col.weight.grad, want_w1), _close(row.weight.grad, lin2.weight.grad.chunk(tp, 1)[r]),
                      torch.equal(col.full(col.weight), lin1.weight.detach()),
                      torch.equal(row.full(row.weight), lin2.weight.detach())]
            if bias:
                want_b1 = lin1.bias.grad.chunk(tp, 0)[r]
                # Under SP the row bias sees T/tp of the rows: its grad is this rank's share of the sum.
                b2 = row.bias.grad.clone()
                if sp:
                    comm.all_reduce(b2, g)
                checks += [_close(col.bias.grad, want_b1), _close(b2, lin2.bias.grad)]
            ok[f"linear-bias{bias}-sp{sp}"] = all(checks)
            # qkv: three stacked row blocks [q; k; v], each split over tp, so a rank holds whole heads.
            qkv = tpm.ColumnParallelLinear(lin1, g, sequence_parallel=sp, partitions=3)
            want_qkv = torch.cat([c.chunk(tp, -1)[r] for c in lin1(x).chunk(3, -1)], -1)
            ok[f"qkv-bias{bias}-sp{sp}"] = (_close(qkv(xp), want_qkv)
                                           and torch.equal(qkv.full(qkv.weight), lin1.weight.detach()))
    # Vocab-parallel embedding and cross-entropy with a vocabulary tp does not divide.
    V = 251
    torch.manual_seed(4)
    emb, idx = nn.Embedding(V, D), torch.randint(0, V, (B, T))
    pemb = tpm.VocabParallelEmbedding(emb, g)
    out = pemb(idx)
    out.backward(gs[0])
    emb(idx).backward(gs[0])
    rows = pemb.per_rank
    want = F.pad(emb.weight.grad, (0, 0, 0, rows * tp - V))[r * rows:(r + 1) * rows]
    ok["vocab_embedding"] = (_close(out, emb(idx)) and _close(pemb.weight.grad, want)
                             and torch.equal(pemb.full(pemb.weight), emb.weight.detach()))
    logits = torch.randn(B, T, V, requires_grad=True)
    ref = F.cross_entropy(logits.reshape(-1, V), idx.reshape(-1))
    ref.backward()
    # Padded columns hold large garbage: a correct implementation never lets them into the softmax.
    padded = torch.cat([logits.detach(), torch.full((B, T, rows * tp - V), 30.0)], -1)
    shard = padded.chunk(tp, -1)[r].clone().requires_grad_()
    loss = tpm.vocab_parallel_cross_entropy(shard, idx, g, V)
    loss.backward()
    want_grad = F.pad(logits.grad, (0, rows * tp - V)).chunk(tp, -1)[r]
    ok["vocab_cross_entropy"] = _close(loss, ref) and _close(shard.grad, want_grad)
    return ok


# ------------------------------------------------------------------------------------------------
# Parity with the single-process model after STEPS AdamW steps; per-layer communication on the side.

def _block_comm(mesh, model_config, sp):
    """One TP block's collectives (forward, backward) and saved bytes for a (B, T, D) input."""
    torch.manual_seed(5)
    model = tpm.apply_tensor_parallel(mm.GPT(model_config), mesh, sp)
    B, D = 8, model_config.n_embd
    x = torch.randn(B, SEQ, D)
    x = (x.chunk(mesh.tp_size, 1)[mesh.tp_rank] if sp else x).clone().requires_grad_()
    saved = saved_activation_bytes(model.blocks[0], x)
    with comm.CommLog() as fwd:
        y = model.blocks[0](x)
    with comm.CommLog() as bwd:
        y.sum().backward()
    ops = lambda log: [(r.op, r.elements, r.sent_bytes) for r in log.records if r.tag == "tp"]
    return ops(fwd), ops(bwd), saved


def _train(model_config, config):
    mesh = mm.init_mesh(mm.ParallelDims.infer(dist.get_world_size(), tp=config.tp))
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(model_config), config, mesh)
    for batch in data.batches(mesh, STEPS, config.batch_size, SEQ, seed=config.seed,
                              vocab_size=model_config.vocab_size):
        engine.train_step(batch)
    layers = _regions_and_layers(mesh) if mesh.dp_size == 1 and not config.sequence_parallel else None
    return engine.full_state_dict(), engine.losses, _block_comm(mesh, model_config, config.sequence_parallel), layers


LAYOUTS = {   # id: (world size, TrainConfig overrides, vocabulary)
    "dp1-tp2-V251": (2, dict(tp=2), 251),
    "dp1-tp4-V255": (4, dict(tp=4), 255),
    "dp2-tp2-V251-clip": (4, dict(tp=2, gradient_clipping=0.05), 251),
    "dp1-tp2-sp-V251-ac-full": (2, dict(tp=2, sequence_parallel=True, activation_checkpointing="full"), 251),
}


@functools.cache
def _run(layout):
    """One launch per layout, shared by the tests below (launches are the expensive part)."""
    world, overrides, vocab = LAYOUTS[layout]
    model_config = mm.GPTConfig.tiny(block_size=SEQ, vocab_size=vocab)
    return model_config, parity_config(**overrides), mm.launch(_train, world, model_config,
                                                                parity_config(**overrides), timeout=300)


@pytest.mark.parametrize("layout", ["dp1-tp2-V251", "dp1-tp4-V255"])
def test_regions_and_layers_match_chunked_dense_layers(layout):
    for rank, (*_, ok) in enumerate(_run(layout)[2]):
        assert all(ok.values()), f"rank {rank}: {[k for k, v in ok.items() if not v]} differ"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_parity_with_single_process(layout):
    model_config, config, results = _run(layout)
    ref, ref_losses = reference_run(model_config, config, STEPS, seq_len=SEQ)
    for state, losses, *_ in results:
        err = max_rel_error(state, ref)
        print(f"{layout}: max_rel_error {err:.2e}")
        assert err <= 1e-5
        assert losses == pytest.approx(ref_losses, rel=1e-5)
    # Per layer and micro-batch: 8bsh(t-1)/t elements each rank sends (Narayanan et al. 2021 §3.2).

@pytest.mark.parametrize("layout", LAYOUTS)
def test_communication_and_saved_bytes_per_layer(layout):
    model_config, config, results = _run(layout)
    t, (b, s, h) = config.tp, (8, SEQ, model_config.n_embd)
    fwd, bwd, saved = results[0][2]
    assert sum(e[2] for e in fwd + bwd) == 8 * b * s * h * (t - 1) / t * 4
    if config.sequence_parallel:   # f, g → all-gather, reduce-scatter along T, each on the full (B, T, D)
        assert [e[:2] for e in fwd] == [("all_gather", b * s * h), ("reduce_scatter", b * s * h)] * 2
        assert [e[:2] for e in bwd] == [("all_gather", b * s * h), ("reduce_scatter", b * s * h)] * 2
    else:
        assert [e[:2] for e in fwd] == [e[:2] for e in bwd] == [("all_reduce", b * s * h)] * 2
    want = gpt_activation_bytes_per_layer(s, b, h, model_config.n_head, tp=t, sp=config.sequence_parallel,
                                          attention="flash")
    print(f"{layout}: per-layer sent {sum(e[2] for e in fwd + bwd):.0f} B; saved {saved} B vs formula {want:.0f} B")
    assert abs(saved - want) <= 0.05 * want, (saved, want)


# ------------------------------------------------------------------------------------------------
# Refusals and the command line.

def test_tp_must_divide_the_heads():
    # n_head divides n_embd, and the MLP width is a multiple of n_embd: the heads are the binding constraint.
    with pytest.raises(ValueError, match=r"tp=3 does not divide n_head=4 \(4 % 3 = 1\)"):
        tpm.check_divisible(mm.GPTConfig.tiny(), 3)
    tpm.check_divisible(mm.GPTConfig.tiny(), 4)


def test_cli_refuses_before_launch_and_trains_with_tp_sp_ac(capsys):
    assert main(["train", "--nproc", "4", "--tp", "4", "--preset", "small", "--steps", "1"]) == 2
    assert "tp=4 does not divide n_head=6" in capsys.readouterr().err
    assert main(["train", "--nproc", "2", "--tp", "2", "--sp", "--ac", "selective", "--steps", "8",
                 "--lr", "3e-3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["final_loss"] < out["first_loss"] - 0.3


def _dropout_streams(sp):
    """tp2, dropout 0.1: attention masks differ across tp ranks; checkpointing replays them exactly."""
    from minimega.train.activation_checkpoint import apply_activation_checkpointing
    mesh = mm.init_mesh(mm.ParallelDims(tp=2))
    cfg = mm.GPTConfig.tiny(block_size=32, dropout=0.1)
    x, y = data.global_batch(0, 4, 32, vocab_size=cfg.vocab_size)
    grads, cores = {}, []
    for mode in ("none", "full", "selective"):
        torch.manual_seed(3)
        model = tpm.apply_tensor_parallel(mm.GPT(cfg), mesh, sequence_parallel=sp)
        apply_activation_checkpointing(model, mode)
        torch.manual_seed(11)                                    # same default stream for every mode
        _, loss = model(x, y)
        loss.backward()
        grads[mode] = {n: p.grad.clone() for n, p in model.named_parameters()}
        grads[mode]["after"] = torch.rand(3)                     # the default stream moved on identically
    torch.manual_seed(3)
    attn = tpm.apply_tensor_parallel(mm.GPT(cfg), mesh).blocks[0].attn
    q = torch.ones(1, attn.n_head, 8, attn.head_size)
    cores = attn.core(q, q, q)                                   # identical inputs on both ranks
    return grads, cores


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2-sp"])
def test_dropout_streams_differ_across_tp_ranks_and_replay_under_checkpointing(sp):
    (g0, c0), (g1, c1) = mm.launch(_dropout_streams, 2, sp, timeout=240)
    for grads in (g0, g1):
        for mode in ("full", "selective"):
            assert max(((grads[mode][k] - grads["none"][k]).norm() / grads["none"][k].norm().clamp_min(1e-12)).item()
                       for k in grads["none"]) <= 1e-6, mode
    assert not torch.equal(c0, c1)          # Megatron's per-tp-rank seed: masks are not copies of each other


# ---- the caller's model is not touched ------------------------------------------------------------------

def _fingerprint(model) -> dict:
    """Everything `initialize` could change in a model: weights, dtypes, storages, hooks, modules, modes."""
    # A storage ZeRO-3 freed has 0 bytes: recorded as such, never read.
    return {"state": {k: v.detach().clone() if v.untyped_storage().nbytes() else None
                      for k, v in model.state_dict().items()},
            "params": [(n, p.dtype, p.device, p.data_ptr(), p.untyped_storage().nbytes(), p.requires_grad, p.grad is None,
                        len(p._post_accumulate_grad_hooks or {}), len(p._backward_hooks or {}))
                       for n, p in model.named_parameters()],
            "modules": [(n, type(m).__name__, m.training, "forward" in vars(m), id(m))
                        for n, m in model.named_modules()]}


def _differences(before: dict, after: dict) -> list[str]:
    out = [f"state[{k}]" for k, v in before["state"].items()
           if after["state"][k] is None or not torch.equal(v, after["state"][k])]
    out += [f"param {a[0]}" for a, b in zip(before["params"], after["params"]) if a != b]
    out += [f"module {a[0]!r}" for a, b in zip(before["modules"], after["modules"]) if a != b]
    return out + (["module list"] if len(before["modules"]) != len(after["modules"]) else [])


def _train_from_a_model_of_ours(configs):
    """Initialize from a model this rank keeps, train 2 steps, and say what changed in that model."""
    out = []
    for config in configs:
        mesh = mm.init_mesh(mm.ParallelDims.infer(dist.get_world_size(), tp=config.tp, pp=config.pp))
        torch.manual_seed(config.seed)
        model = mm.GPT(mm.GPTConfig.tiny(block_size=SEQ, dropout=0.1))
        before = _fingerprint(model)
        engine = mm.initialize(model, config, mesh)
        for batch in data.batches(mesh, 2, config.batch_size, SEQ, seed=config.seed):
            engine.train_step(batch)
        engine.wrapper.eval()
        out.append(_differences(before, _fingerprint(model)))
    return out


def test_initialize_leaves_the_callers_model_untouched():
    configs = [parity_config(tp=2, pp=2, zero_stage=1, precision="bf16", sequence_parallel=True, micro_batches=2,
                             activation_checkpointing="full"),
               parity_config(tp=2, zero_stage=3, activation_checkpointing="selective", gradient_clipping=0.5),
               parity_config(zero_stage=0, activation_checkpointing="full", gradient_clipping=0.5),
               parity_config(pp=2, zero_stage=2, micro_batches=2)]
    results = mm.launch(_train_from_a_model_of_ours, 4, configs, timeout=300)
    assert results == [[[]] * len(configs)] * 4
