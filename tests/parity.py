"""Shared oracles for parity tests: the single-process reference run and the error metric."""
from __future__ import annotations

import torch

import minimega as mm
from minimega import data
from minimega.train.engine import make_optimizer


def parity_config(**overrides) -> mm.TrainConfig:
    """The TrainConfig parity tests use (AdamW, global batch 8, seed 1).

    [Note: parity and Adam] Float32 gradients from different layouts differ by ~1e-7 relative (other
    summation orders). Adam's first step divides m by sqrt(v), i.e. it is sign(g) · lr: an element whose
    gradient happens to be ~1e-9 (a million times smaller than its neighbours) turns that rounding
    noise into a visible move. With seed 0 one such element exists in the tiny model (a 3e-9 gradient
    in blocks.3.mlp.proj.weight at step 1) and ends 3e-5 off after 10 steps under every layout, torch's
    own DDP included. The tests therefore use seed 1 and a per-tensor norm-relative error (see
    `max_rel_error`), measured at 2e-7 to 4e-7 for DDP at dp 2 and 4.

    No memory peaks (``memory_peak_steps=0``): sampling after every op made these short runs 2-3x slower, and
    parity reads none (that the sampling changes no number: test_engine_step.py).
    """
    return mm.TrainConfig(**{"batch_size": 8, "seed": 1, "memory_peak_steps": 0, **overrides})


def max_rel_error(got: dict, ref: dict) -> float:
    """max over tensors of ||got - ref|| / ||ref|| (Frobenius norms; keys and shapes must match)."""
    assert got.keys() == ref.keys(), f"key mismatch: {sorted(set(got) ^ set(ref))}"
    worst = 0.0
    for k in ref:
        a, b = got[k].float(), ref[k].float()
        assert a.shape == b.shape, f"{k}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        worst = max(worst, ((a - b).norm() / b.norm().clamp_min(1e-12)).item())
    return worst


def grad_tolerance(precision: str, addends: int) -> float:
    """The norm-relative gradient error two summation orders may show: γ = n·u for ``addends`` = n.

    Every layout computes the same per-token terms; what it changes is the order they are summed in (rows
    split over dp and micro-steps, a matmul's inner dimension split over tp, buckets added at the end).
    Recursive summation of n terms carries an error of at most (n-1)·u·Σ|x_i| (Higham, Accuracy and
    Stability of Numerical Algorithms, 2nd ed., §4.2), u the unit roundoff of the dtype the sum is kept in
    (half of torch's ``finfo.eps``); with n the tokens of the global batch that is n·u: 1.5e-5 for 256
    tokens in fp32 (gradients are summed in fp32 under every precision policy here).
    """
    dtype = {"fp32": torch.float32, "bf16": torch.float32,    # bf16 sums in fp32 (main_grad)
             "fp16": torch.float16}[precision]               # fp16 computes and sums in fp16
    return addends * torch.finfo(dtype).eps / 2


def assert_grads_match(name: str, got: list[dict], ref: list[dict], precision: str, addends: int, steps: int) -> None:
    """Each step's consolidated gradient within `grad_tolerance` of the single-process run's (the sharp check)."""
    tol = grad_tolerance(precision, addends)
    assert len(got) == steps
    for step, (ours, theirs) in enumerate(zip(got, ref)):
        err = max_rel_error(ours, theirs)
        assert err <= tol, f"{name}: step {step} gradient {err:.2e} off the single-process one (tolerance {tol:.1e})"

def assert_case_matches(name: str, per_rank: list[dict], ref_state: dict, ref_losses: list[float], what: str,
                        steps: int, rel: float = 1e-5) -> dict:
    """One case of a multi-rank launch: no rank failed, and rank 0's weights and every step's loss are within
    `rel` of the single-process run (`what` names it in the message). Returns rank 0's result."""
    for r in per_rank:
        assert "error" not in r, f"{name}: {r.get('error')}"
    got = per_rank[0]
    err = max_rel_error(got["state"], ref_state)
    assert err <= rel, f"{name}: weights {err:.2e} off the single-process {what} after {steps} steps"
    assert max(abs(a - b) / abs(b) for a, b in zip(got["losses"], ref_losses)) <= rel, name
    return got


def trained(model_config: mm.GPTConfig, config: mm.TrainConfig, dims: mm.ParallelDims, steps: int, seq_len: int,
            measure=None):
    """Rank function body: ``(engine, mesh, measured)``, ``config``'s engine on a mesh of ``dims`` around the seeded
    ``GPT(model_config)``, trained ``steps`` steps on the shared global batches; ``measure(engine, mesh)``, when
    given, runs before the first step and its answer is ``measured``."""
    mesh = mm.init_mesh(dims)
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(model_config), config, mesh)
    measured = measure(engine, mesh) if measure else None
    for batch in data.batches(mesh, steps, config.batch_size, seq_len, seed=config.seed):
        engine.train_step(batch)
    return engine, mesh, measured


def assert_layout_matches(name: str, per_rank: list[dict], model_config: mm.GPTConfig, config: mm.TrainConfig,
                          steps: int, seq_len: int, grad_steps: int) -> dict:
    """One layout of a launch against the single-process run: no rank failed, rank 0's gradients of the first
    ``grad_steps`` steps (``"grads"``), then its weights and every loss after ``steps`` steps. Returns rank 0's result."""
    ref_grads: list[dict] = []
    ref_state, ref_losses = reference_run(model_config, config, steps, seq_len=seq_len, grads=ref_grads)
    for r in per_rank:
        assert "error" not in r, f"{name}: {r.get('error')}"
    got = per_rank[0]
    assert_grads_match(name, got["grads"], ref_grads, config.precision, config.batch_size * seq_len, grad_steps)
    return assert_case_matches(name, per_rank, ref_state, ref_losses, "run", steps)     # the optimizer path


def reference_run(model_config: mm.GPTConfig, config: mm.TrainConfig, steps: int,
                  seq_len: int | None = None, norms: list | None = None,
                  grads: list | None = None, build=None) -> tuple[dict, list[float]]:
    """The single-process run every layout must reproduce: same seed, same global batches, torch's optimizer.

    ``config.precision="bf16"`` runs the bf16 policy on one process: the model (weights, activations,
    each micro-step's gradients) in bf16, the micro-steps' gradients summed in fp32 (Megatron's main_grad,
    as the engine does), fp32 master weights stepped by the optimizer and copied back into the model.

    Returns the final fp32 state dict (the masters under bf16) and the per-step losses; with clipping,
    appends each step's gradient norm (before clipping) to ``norms`` when given; ``grads``, when given, gets
    each step's gradients as the optimizer applies them (fp32, after clipping), by parameter name. ``build``:
    makes the model instead of ``GPT(model_config)`` (a `moe.MoEGPT`), called right after seeding.
    """
    if config.precision not in ("fp32", "bf16"):
        raise ValueError(f"reference_run: precision={config.precision!r} has no single-process reference here")
    torch.manual_seed(config.seed)
    model = build() if build is not None else mm.GPT(model_config)
    low = config.precision == "bf16"
    masters = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()] if low else None
    if low:
        model.to(torch.bfloat16)
    opt = make_optimizer(masters if low else model.parameters(), config)
    stepped = masters if low else list(model.parameters())
    seq = seq_len or config.seq_len or model_config.block_size
    ga = config.gradient_accumulation_steps
    losses = []
    for x, y in data.global_batches(steps, config.batch_size, seq, seed=config.seed,
                                    vocab_size=model_config.vocab_size):
        total = 0.0
        # Equal-sized micro-batches: the mean of their means is the full-batch mean, however rows are grouped.
        for xm, ym in zip(x.chunk(ga), y.chunk(ga)):
            _, loss = model(xm, ym)
            (loss / ga).backward()
            total += loss.item()
            if low:                                     # main_grad: each micro-step's bf16 gradient, summed in fp32
                for m, p in zip(masters, model.parameters()):
                    if p.grad is not None:
                        m.grad = p.grad.float() if m.grad is None else m.grad.add_(p.grad)
                        p.grad = None
        if config.gradient_clipping:
            norm = torch.nn.utils.clip_grad_norm_(stepped, config.gradient_clipping)
            if norms is not None:
                norms.append(float(norm))
        if grads is not None:
            grads.append({n: p.grad.detach().float().clone() for (n, _), p in zip(model.named_parameters(), stepped)})
        opt.step()
        opt.zero_grad(set_to_none=True)
        if low:
            model.zero_grad(set_to_none=True)
            with torch.no_grad():
                for m, p in zip(masters, model.parameters()):
                    p.copy_(m)
        losses.append(total / ga)
    if low:
        return {n: m.detach().clone() for (n, _), m in zip(model.named_parameters(), masters)}, losses
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def fp16_reference_run(model_config: mm.GPTConfig, config: mm.TrainConfig, steps: int,
                       seq_len: int | None = None, norms: list | None = None) -> tuple[dict, list[float]]:
    """`reference_run` for ``precision="fp16"`` with a fixed ``loss_scale`` S, on one process.

    The fp16 policy as DeepSpeed (and `minimega.train.precision`) define it: the model (weights, activations,
    gradients) in fp16; each micro-step's loss / accumulation taken to fp32 and multiplied by S before
    backward; the micro-steps' fp16 gradients summed in fp16 (autograd's own accumulation into ``.grad``);
    divided by S into fp32 master gradients; clipping and the optimizer on the fp32 masters, copied back
    into the model. It does not model a skipped step: a non-finite gradient raises (choose a smaller S).
    """
    if config.precision != "fp16" or not config.loss_scale:
        raise ValueError(f"fp16_reference_run: needs precision='fp16' and a fixed loss_scale > 0, got "
                         f"precision={config.precision!r}, loss_scale={config.loss_scale!r}")
    torch.manual_seed(config.seed)
    model = mm.GPT(model_config)
    masters = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
    model.half()
    opt = make_optimizer(masters, config)
    seq = seq_len or config.seq_len or model_config.block_size
    ga, scale = config.gradient_accumulation_steps, config.loss_scale
    losses = []
    for step, (x, y) in enumerate(data.global_batches(steps, config.batch_size, seq, seed=config.seed,
                                                      vocab_size=model_config.vocab_size)):
        total = 0.0
        for xm, ym in zip(x.chunk(ga), y.chunk(ga)):
            _, loss = model(xm, ym)
            ((loss / ga).float() * scale).backward()
            total += loss.item()
        for m, p in zip(masters, model.parameters()):
            m.grad = None if p.grad is None else p.grad.float() / scale
            if m.grad is not None and not torch.isfinite(m.grad).all():
                raise FloatingPointError(f"fp16_reference_run: gradient overflow at step {step} with "
                                         f"loss_scale={scale}; use a smaller loss_scale")
        if config.gradient_clipping:
            norm = torch.nn.utils.clip_grad_norm_(masters, config.gradient_clipping)
            if norms is not None:
                norms.append(float(norm))
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for m, p in zip(masters, model.parameters()):
                p.copy_(m)
        losses.append(total / ga)
    return {n: m.detach().clone() for (n, _), m in zip(model.named_parameters(), masters)}, losses
